"""unit: the claims API against its committed OpenAPI document (operator/claimsapi/openapi.json), property-based
(schemathesis, issue 15): the document is current, every operation answers valid and invalid input with no 5xx and
with responses that conform to the document, and every operation refuses a missing or a wrong token (401 in the
`{code, message}` shape). The real app runs over an in-memory backend that behaves like a mode's: claims are kept,
unknown names are 404, releasing twice is 404, pools, retained sandboxes and snapshots are listed."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from starlette.testclient import TestClient

from corral.api.wire import Batch, BatchRequest, BatchTaskResult, SandboxRef
from corral.operator.claimsapi import (
    Claim,
    ClaimRequest,
    Conflict,
    ExecdTarget,
    NotFound,
    PoolStatus,
    RetainedSandbox,
    Snapshot,
    SnapshotRequest,
    create_app,
)
from corral.operator.claimsapi.openapi import DOCUMENT

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DOC = json.loads(DOCUMENT.read_text())


class MemoryBackend:
    """A mode's behaviour without Docker or Kubernetes: enough for every documented answer to occur."""

    POOLS = {"python": "WarmPool", "shell": "Pool"}

    def __init__(self) -> None:
        self.claims: dict[str, Claim] = {}
        self.batches: dict[str, Batch] = {}
        self.seq = 0

    def _get(self, name: str) -> Claim:
        try:
            return self.claims[name]
        except KeyError:
            raise NotFound(f"claim {name} not found") from None

    async def create_claim(self, req: ClaimRequest) -> Claim:
        if req.pool not in self.POOLS:
            raise NotFound(f"pool {req.pool} not found")
        if req.name in self.claims:
            return self.claims[req.name]
        self.seq += 1
        name = req.name or f"claim-{self.seq}"
        now = datetime.now(UTC)
        claim = Claim(name=name, pool=req.pool, pool_kind=self.POOLS[req.pool], phase="Ready", launch_type="warm",
                      sandbox=SandboxRef(name=f"sbx-{self.seq}", endpoint=f"/v1/claims/{name}/execd"),
                      created=now, ready_at=now, shutdown_policy=req.shutdown_policy, snapshot=req.snapshot,
                      expires_at=now + timedelta(seconds=req.ttl_seconds) if req.ttl_seconds else None)
        self.claims[name] = claim
        return claim

    async def get_claim(self, name: str) -> Claim:
        return self._get(name)

    async def list_claims(self, pool: str | None = None) -> list[Claim]:
        return [c for c in self.claims.values() if pool is None or c.pool == pool]

    async def delete_claim(self, name: str) -> None:
        self._get(name)
        del self.claims[name]

    async def renew_claim(self, name: str, ttl_seconds: int) -> Claim:
        c = self._get(name).model_copy(update={"expires_at": datetime.now(UTC) + timedelta(seconds=ttl_seconds)})
        self.claims[name] = c
        return c

    async def pause_claim(self, name: str) -> Claim:
        c = self._get(name)
        if c.phase == "Paused":
            raise Conflict(f"claim {name} is already paused")
        self.claims[name] = c = c.model_copy(update={"phase": "Paused"})
        return c

    async def resume_claim(self, name: str) -> Claim:
        self.claims[name] = c = self._get(name).model_copy(update={"phase": "Ready"})
        return c

    async def snapshot_claim(self, name: str, req: SnapshotRequest) -> Snapshot:
        self._get(name)
        return Snapshot(claim=name, image=f"corral-snapshot/test:{req.tag or 'latest'}", id="sha256:0")

    async def execd_target(self, name: str) -> ExecdTarget:
        self._get(name)
        return ExecdTarget(url="http://127.0.0.1:9", token="unused")

    async def list_pools(self) -> list[PoolStatus]:
        return [PoolStatus(name=n, kind=k, template=n, desired=1, ready=1, idle=1, allocated=0)
                for n, k in self.POOLS.items()]

    async def list_retained(self) -> list[RetainedSandbox]:
        return [RetainedSandbox(name="kept-1", template="python", pool="python", claim="c1",
                                retained_at=datetime.now(UTC), state="running", ready=True)]

    async def delete_retained(self, name: str) -> None:
        if name != "kept-1":
            raise NotFound(f"no retained sandbox named {name}")

    async def list_snapshots(self) -> list[Snapshot]:
        return [Snapshot(claim="c1", image="corral-snapshot/test:c1-1", id="sha256:" + "0" * 64,
                         created=datetime.now(UTC), size=1 << 20)]

    async def delete_snapshot(self, ref: str) -> None:
        if ref != "corral-snapshot/test:c1-1":
            raise NotFound(f"no snapshot {ref}")

    # batches: every task of a batch has ended (index 1 failed) by the time it is created
    async def create_batch(self, req: BatchRequest) -> Batch:
        if req.pool not in self.POOLS:
            raise NotFound(f"pool {req.pool} not found")
        if req.name in self.batches:
            return self.batches[req.name]
        self.seq += 1
        name = req.name or f"batch-{self.seq}"
        results = [BatchTaskResult(index=i, sandbox=f"sbx-{self.seq}-{i}", launch_type="warm",
                                   phase="Failed" if i == 1 else "Succeeded", exit_code=3 if i == 1 else 0,
                                   reason="NonZeroExit" if i == 1 else "Completed", output=f"{i}\n")
                   for i in range(req.replicas)]
        failed = sum(not r.ok for r in results)
        batch = Batch(name=name, pool=req.pool, pool_kind=self.POOLS[req.pool],  # type: ignore[arg-type]
                      phase="Failed" if failed else "Succeeded", replicas=req.replicas, bound=req.replicas,
                      running=0, succeeded=req.replicas - failed, failed=failed, created=datetime.now(UTC),
                      shutdown_policy=req.shutdown_policy, results=results)
        self.batches[name] = batch
        return batch

    def _batch(self, name: str) -> Batch:
        try:
            return self.batches[name]
        except KeyError:
            raise NotFound(f"batch {name} not found") from None

    async def get_batch(self, name: str) -> Batch:
        return self._batch(name)

    async def list_batches(self, pool: str | None = None) -> list[Batch]:
        return [b for b in self.batches.values() if pool is None or b.pool == pool]

    async def delete_batch(self, name: str) -> None:
        self._batch(name)
        del self.batches[name]

    async def watch_batch(self, name: str):
        yield self._batch(name)


APP = create_app(MemoryBackend(), TOKEN)
schema = schemathesis.openapi.from_path(DOCUMENT)
schema.app = APP
# The token is sent by the test (and its absence tested below); unknown query parameters are ignored, as HTTP APIs do.
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                with_security_parameters=False, allow_extra_parameters=False)
# A body past the edge's 1 MiB cap is refused before it is validated (413 too_large): a rejection like a 400. A
# schema-violating request can be that large (e.g. one argv item more than maxItems, each as long as allowed).
_rejection = schema.config.checks.negative_data_rejection
_rejection.expected_statuses = [*_rejection.expected_statuses, "413"]
OPERATIONS = [(method.upper(), path) for path, item in DOC["paths"].items() for method in item
              if method in ("get", "put", "post", "delete", "patch")]


def test_openapi_document_is_current():
    """Fails when a route or model changes without `python -m corral.operator.claimsapi.openapi` being rerun."""
    proc = subprocess.run([sys.executable, "-m", "corral.operator.claimsapi.openapi", "--check"],
                          capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with TestClient(APP) as http:  # and it is what the app serves
        assert http.get("/openapi.json").json() == DOC


def test_the_document_declares_the_token_on_every_operation():
    assert DOC["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "The API token (CORRAL_API_TOKEN)."}
    assert DOC["security"] == [{"bearer": []}]
    assert len(OPERATIONS) >= 13


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_claims_api_conforms_to_its_document(case):
    """No 5xx, status codes, content types and bodies as documented, for valid and invalid input alike."""
    case.call_and_validate(headers=AUTH)


@pytest.mark.parametrize("method,path", OPERATIONS)
@pytest.mark.parametrize("auth", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                                  {"Authorization": f"Basic {TOKEN}"}, {"X-EXECD-ACCESS-TOKEN": TOKEN}])
def test_every_operation_refuses_a_missing_or_wrong_token(method: str, path: str, auth: dict[str, str]):
    url = path.replace("{name}", "c1").replace("{ref}", "corral-snapshot/test:c1-1")
    with TestClient(APP) as http:
        r = http.request(method, url, headers=auth, json={"pool": "python"} if method == "POST" else None)
    assert r.status_code == 401, (method, path, r.status_code, r.text)
    body: Any = r.json()
    assert set(body) == {"code", "message"} and body["code"] == "unauthorized" and body["message"]
