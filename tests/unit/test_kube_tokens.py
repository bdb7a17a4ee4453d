"""Kubernetes execd tokens: what each derives from, and that the init container derives the same idle token."""

from __future__ import annotations

import pytest

from corral.execd import server
from corral.operator import tokens

SECRET = b"operator-secret"


def test_the_init_container_derives_the_idle_token_the_operator_derives(tmp_path, monkeypatch):
    """`execd install DEST TOKEN_FILE` in the init container: key from the mounted Secret, identity from the
    downward API; the file holds exactly the token the operator computes from its own secret."""
    manifest = tokens.key_secret_manifest(SECRET, "team-a")
    (tmp_path / "key").write_text(manifest["stringData"][tokens.KEY_SECRET_KEY] + "\n")
    for name, value in {"KEY_FILE": str(tmp_path / "key"), "POD_NAMESPACE": "team-a", "POD_NAME": "wp-x1",
                        "POD_UID": "pod-uid-1"}.items():
        monkeypatch.setenv(f"CORRAL_EXECD_{name}", value)
    monkeypatch.delenv("CORRAL_EXECD_TOKEN", raising=False)
    server.write_token(str(tmp_path / "token"))
    assert (tmp_path / "token").read_text() == tokens.idle_token(SECRET, "team-a", "wp-x1", "pod-uid-1")
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o400


def test_the_init_container_refuses_an_empty_key_or_a_missing_identity(tmp_path, monkeypatch):
    (tmp_path / "key").write_text("")
    monkeypatch.setenv("CORRAL_EXECD_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.delenv("CORRAL_EXECD_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        server.write_token(str(tmp_path / "token"))
    assert not (tmp_path / "token").exists()


def test_idle_tokens_change_with_the_pod_and_the_namespace():
    a = tokens.idle_token(SECRET, "ns", "sbx", "pod-1")
    assert a == tokens.idle_token(SECRET, "ns", "sbx", "pod-1")  # recomputed, never stored
    assert a != tokens.idle_token(SECRET, "ns", "sbx", "pod-2")  # a restarted or repaired pod: another one
    assert a != tokens.idle_token(SECRET, "ns2", "sbx", "pod-1")
    assert a != tokens.idle_token(b"other-secret", "ns", "sbx", "pod-1")


def test_claim_tokens_are_per_claim_and_per_sandbox_and_not_the_idle_token():
    first = tokens.claim_token(SECRET, "ns", "sbx", "sbx-uid", "claim-1")
    assert first == tokens.claim_token(SECRET, "ns", "sbx", "sbx-uid", "claim-1")
    assert first != tokens.claim_token(SECRET, "ns", "sbx", "sbx-uid", "claim-2")  # the next claim of the sandbox
    assert first != tokens.claim_token(SECRET, "ns", "sbx", "sbx-uid-2", "claim-1")  # a new sandbox of that name
    assert first not in {tokens.idle_token(SECRET, "ns", "sbx", u) for u in ("sbx-uid", "claim-1")}


def test_the_namespace_key_gives_no_claim_token_and_the_secret_name_shows_no_key():
    key = tokens.namespace_key(SECRET, "ns")
    assert key != tokens.namespace_key(SECRET, "ns2")
    # the claim token is keyed by the operator's secret itself: knowing a namespace key does not give it
    assert tokens.claim_token(key.encode(), "ns", "s", "u", "c") != tokens.claim_token(SECRET, "ns", "s", "u", "c")
    name = tokens.key_secret(SECRET, "ns")
    assert name.startswith(tokens.KEY_SECRET_PREFIX) and key[:12] not in name and len(name) <= 63
    assert tokens.key_secret(b"rotated", "ns") != name  # a new operator secret: a new Secret, never a stale one
    manifest = tokens.key_secret_manifest(SECRET, "ns")
    assert manifest["metadata"] == {**manifest["metadata"], "name": name, "namespace": "ns"}
    assert manifest["stringData"] == {"key": key}


def test_a_pod_from_before_per_claim_tokens_is_handed_over_from_its_old_token():
    """Pods made by an older operator hold HMAC(secret, ns/name/sandbox uid) (it was in their init container's env):
    the hand-over accepts it once, so such pods keep serving claims after an upgrade and the old token dies."""
    import asyncio

    import httpx

    from corral.operator.cache import Cache
    from corral.operator.context import Context, Settings
    from corral.operator.reconcile.handover import hand_over

    legacy = tokens.legacy_token(SECRET, "ns", "sbx", "sbx-uid")
    held = {"token": legacy}

    def execd(request: httpx.Request) -> httpx.Response:
        import json

        if request.headers["authorization"] != f"Bearer {held['token']}":
            return httpx.Response(401, json={"code": "unauthorized", "message": "no"})
        held["token"] = json.loads(request.content)["token"]
        return httpx.Response(200, json={"rotated": True})

    ctx = Context(settings=Settings(), kube=None, cache=Cache())  # type: ignore[arg-type]
    ctx.token_key = SECRET
    ctx._http = httpx.AsyncClient(transport=httpx.MockTransport(execd))
    loop = asyncio.new_event_loop()  # not asyncio.run: it unsets the current loop that later Pulumi-mocked tests use
    try:
        token = loop.run_until_complete(
            hand_over(ctx, "ns", "sbx", "sbx-uid", "pod-uid", "http://127.0.0.1:44772", "claim-uid"))
    finally:
        loop.close()
    assert token == held["token"] == tokens.claim_token(SECRET, "ns", "sbx", "sbx-uid", "claim-uid")
    assert ctx.tokens.installed("ns", "sbx") == ("pod-uid", "claim-uid")
