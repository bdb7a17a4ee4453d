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
