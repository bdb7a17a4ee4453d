"""What the client returns. The claims API's types are the wire models the server uses too (corral.api.wire), read
leniently (a newer server may add fields); execd's answers are parsed into small models of their own."""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from corral.api import wire

ClaimRequest = wire.ClaimRequest


class Claim(wire.Claim):
    model_config = ConfigDict(extra="ignore")


class PoolStatus(wire.PoolStatus):
    model_config = ConfigDict(extra="ignore")


class Snapshot(wire.Snapshot):
    model_config = ConfigDict(extra="ignore")


class RetainedSandbox(wire.RetainedSandbox):
    model_config = ConfigDict(extra="ignore")


BatchRequest = wire.BatchRequest
BatchTaskRequest = wire.BatchTaskRequest


class BatchTaskResult(wire.BatchTaskResult):
    model_config = ConfigDict(extra="ignore")


class Batch(wire.Batch):
    model_config = ConfigDict(extra="ignore")
    results: list[BatchTaskResult] = []  # type: ignore[assignment]  # the lenient results, read as such


class BatchEvent(wire.BatchEvent):
    model_config = ConfigDict(extra="ignore")
    task: BatchTaskResult | None = None


class _Execd(BaseModel):
    model_config = ConfigDict(extra="ignore")


def decode(data: str, encoding: str) -> bytes:
    return base64.b64decode(data) if encoding == "base64" else data.encode()


class CommandResult(_Execd):
    """A finished command. `stdout`/`stderr` are text (undecodable bytes replaced); `stdout_bytes`/`stderr_bytes`
    are exact."""

    id: str
    exit_code: int
    signal: str | None = None
    timed_out: bool = False
    interrupted: bool = False
    duration_ms: float = 0.0
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    truncated: bool = False

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> CommandResult:
        return cls(**{k: v for k, v in d.items() if k not in ("stdout", "stderr")},
                   stdout_bytes=decode(d["stdout"], d.get("stdout_encoding", "utf-8")),
                   stderr_bytes=decode(d["stderr"], d.get("stderr_encoding", "utf-8")))

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode(errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class CommandStatus(_Execd):
    id: str
    pid: int
    mode: str
    running: bool
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool = False
    interrupted: bool = False
    started_at: float
    finished_at: float | None = None
    duration_ms: float = 0.0


class Output(_Execd):
    """One chunk of a command's output (stream or background logs)."""

    seq: int
    stream: Literal["stdout", "stderr"]
    data: bytes

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Output:
        return cls(seq=d["seq"], stream=d["stream"], data=decode(d["data"], d.get("encoding", "utf-8")))

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")


class Exit(_Execd):
    """The last event of a streamed command."""

    exit_code: int
    signal: str | None = None
    timed_out: bool = False
    interrupted: bool = False
    duration_ms: float = 0.0


class Logs(_Execd):
    id: str
    running: bool
    chunks: list[Output]
    next_cursor: int
    dropped: int = 0

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Logs:
        return cls(**{**d, "chunks": [Output.from_wire(c) for c in d["chunks"]]})


class FileInfo(_Execd):
    path: str
    name: str
    type: str          # file | directory | symlink | other
    size: int
    mode: str
    mtime: float
    uid: int
    gid: int
    target: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.type == "directory"


class SearchResult(_Execd):
    matches: list[FileInfo]
    truncated: bool


class Listing(_Execd):
    path: str
    entries: list[FileInfo]
    next_cursor: str | None = None


class PtyStatus(_Execd):
    id: str
    pid: int
    running: bool
    exit_code: int | None = None
    signal: str | None = None
    cols: int
    rows: int
    output_offset: int = 0
    attached: bool = False
    started_at: float = 0.0
