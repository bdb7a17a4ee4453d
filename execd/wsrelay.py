"""Relaying one WebSocket to another until either side closes: execd's port proxy and the claims API's proxy to
execd both end in this (one copy of the pump, the cancellation and the quiet close)."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect


async def relay(ws: WebSocket, upstream: Any) -> None:
    """Pump frames both ways between an accepted Starlette WebSocket and a `websockets` client connection; when one
    side ends, stop the other and close both (a client that closed first is not an error)."""
    from websockets.exceptions import ConnectionClosed

    async def client_to_upstream() -> None:
        try:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                await upstream.send(msg["bytes"] if msg.get("bytes") is not None else msg.get("text") or "")
        except (WebSocketDisconnect, ConnectionClosed):
            return

    async def upstream_to_client() -> None:
        try:
            async for data in upstream:
                await (ws.send_bytes(data) if isinstance(data, bytes) else ws.send_text(data))
        except (WebSocketDisconnect, ConnectionClosed, RuntimeError):
            return

    tasks = [asyncio.ensure_future(client_to_upstream()), asyncio.ensure_future(upstream_to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await upstream.close()
        try:
            await ws.close()
        except (RuntimeError, WebSocketDisconnect):  # the client closed first
            pass
