"""execd tokens on Kubernetes: derived from the operator's secret, never stored, and bound to what they serve.

- idle (bootstrap): `bootstrap_token(namespace_key(ns), ns, pod, pod uid)`. The pod's init container derives the same
  from the namespace key, which reaches it through a Secret (`key_secret`) mounted into it alone; the pod spec holds
  no token. A new pod (Restart recycling, a repair) starts with a new one.
- claimed: `claim_token(ns, sandbox, sandbox uid, claim uid)`, put into execd (PUT /v1/token) when the claim binds and
  taken back (rotated to the idle token) when it is released, so a former claim's token fails on a recycled or
  retained sandbox and a new claim of the same sandbox gets another. The claim's uid is in the sandbox's annotations
  (written by the adoption patch or the cold create, no extra API write), so a restarted operator recomputes it.
The namespace key is an HMAC of the operator's secret, so the operator never reads the Secret back: it only creates
it (the Secret's name carries a fingerprint, so a new operator secret means a new Secret, never a stale one).
"""

from __future__ import annotations

import hashlib
import hmac

from corral.execd.server import bootstrap_token

KEY_SECRET_PREFIX = "corral-execd-key-"
KEY_SECRET_KEY = "key"


def _mac(secret: bytes, what: str) -> str:
    return hmac.new(secret, what.encode(), hashlib.sha256).hexdigest()


def namespace_key(secret: bytes, namespace: str) -> str:
    """The key a namespace's init containers derive idle tokens from; it gives no claim's token."""
    return _mac(secret, f"corral/namespace-key/{namespace}")


def key_secret(secret: bytes, namespace: str) -> str:
    """Name of the namespace's key Secret: a fingerprint of the operator's secret (nothing of the key itself)."""
    return KEY_SECRET_PREFIX + _mac(secret, f"corral/key-secret-name/{namespace}")[:12]


def key_secret_manifest(secret: bytes, namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": key_secret(secret, namespace), "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "corral-operator",
                                    "app.kubernetes.io/component": "execd-key"}},
            "stringData": {KEY_SECRET_KEY: namespace_key(secret, namespace)}}


def idle_token(secret: bytes, namespace: str, pod: str, pod_uid: str) -> str:
    """The token execd of pod `pod` (uid `pod_uid`) holds while its sandbox is not claimed."""
    return bootstrap_token(namespace_key(secret, namespace), namespace, pod, pod_uid)


def legacy_token(secret: bytes, namespace: str, sandbox: str, sandbox_uid: str) -> str:
    """The per-sandbox token of pods made by operators before these (it sat in the init container's env): accepted
    once, to hand such a pod's execd a claim's token or the idle one, after which it is dead."""
    return _mac(secret, f"{namespace}/{sandbox}/{sandbox_uid}")


def claim_token(secret: bytes, namespace: str, sandbox: str, sandbox_uid: str, claim_uid: str) -> str:
    """The token of one claim on one sandbox (the same across the sandbox's pod repairs while the claim lasts)."""
    return _mac(secret, f"corral/claim/{namespace}/{sandbox}/{sandbox_uid}/{claim_uid}")
