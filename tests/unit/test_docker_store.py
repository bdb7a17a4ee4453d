"""The Docker runtime's pure parts: the SQLite store (adoption is one transaction: no double claim under threads,
poolMax counted inside it, idempotent retries, releases never leave an adoptable sandbox; a batch's binding, ends and
removal likewise) and the pools-file model."""

from __future__ import annotations

import threading

import pytest
from pydantic import ValidationError

from corral.components import catalogue
from corral.operator.docker import desired as df
from corral.operator.docker.desired import DesiredState, cpus, docker_template, memory_bytes
from corral.operator.docker.store import BatchRow, ClaimRow, SandboxRow, Store, now
from corral.operator.planning import adoption_order


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "corral.db")
    yield s
    s.close()


def ready(store: Store, n: int, pool: str = "p") -> None:
    for i in range(n):
        store.add_sandbox(SandboxRow(name=f"{pool}-{i}", template="t", state="ready", created=now() + i, pool=pool,
                                     pool_kind="WarmPool", hash="h"))


def order(members):
    return adoption_order(members, "h", set())


def cold_row(i=[0]):  # noqa: B006 - a counter
    i[0] += 1
    return SandboxRow(name=f"cold-{i[0]}", template="t", state="creating", created=now(), pool="p",
                      pool_kind="WarmPool", hash="h")


def test_wal_mode(store):
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_concurrent_adoption_never_doubles(store):
    ready(store, 5)
    results, barrier = [], threading.Barrier(32)

    def go(i: int) -> None:
        barrier.wait()
        results.append(store.adopt(ClaimRow(name=f"c{i}", pool="p", pool_kind="WarmPool", phase="Pending",
                                            created=now()), order, cold_row))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    kinds = sorted(c.launch_type for c, _, _ in results)
    assert kinds.count("warm") == 5 and kinds.count("cold") == 27
    sandboxes = [s.name for _, s, _ in results]
    assert len(set(sandboxes)) == 32
    rows = store.sandboxes(pool="p")
    assert len(rows) == 32 and all(r.claim for r in rows)


def test_retry_returns_the_existing_claim(store):
    ready(store, 2)
    c1, s1, new1 = store.adopt(ClaimRow(name="a", pool="p", pool_kind="WarmPool", phase="Pending", created=now()),
                               order, cold_row)
    c2, s2, new2 = store.adopt(ClaimRow(name="a", pool="p", pool_kind="WarmPool", phase="Pending", created=now()),
                               order, cold_row)
    assert new1 and not new2 and s1.name == s2.name and c2.launch_type == "warm"
    assert len([r for r in store.sandboxes(pool="p") if r.claim]) == 1


def test_pool_max_is_counted_inside_the_transaction(store):
    ready(store, 1)
    got = [store.adopt(ClaimRow(name=f"c{i}", pool="p", pool_kind="Pool", phase="Pending", created=now()), order,
                       cold_row, 3)[1] for i in range(5)]
    assert [s is not None for s in got] == [True, True, True, False, False]


def test_release_never_leaves_an_adoptable_sandbox(store):
    ready(store, 1)
    store.adopt(ClaimRow(name="a", pool="p", pool_kind="WarmPool", phase="Ready", created=now()), order, None)
    assert store.end_claim("a", expired=True, message="ttl") == "p-0"
    (row,) = store.sandboxes(pool="p")
    assert row.state == "releasing" and row.claim is None
    assert store.claim("a").phase == "Expired"
    c, s, _ = store.adopt(ClaimRow(name="b", pool="p", pool_kind="WarmPool", phase="Pending", created=now()),
                          order, None)
    assert s is None  # the releasing sandbox is not a candidate


def test_finish_cold(store):
    c, s, _ = store.adopt(ClaimRow(name="a", pool="p", pool_kind="WarmPool", phase="Pending", created=now()),
                          order, cold_row)
    assert s.state == "creating" and c.launch_type == "cold"
    assert store.finish_cold("a", s.name, now())
    assert store.claim("a").phase == "Ready" and store.sandbox(s.name).state == "ready"
    c, s2, _ = store.adopt(ClaimRow(name="b", pool="p", pool_kind="WarmPool", phase="Pending", created=now()),
                           order, cold_row)
    store.end_claim("b", expired=False)
    assert store.claim("b") is None and store.sandbox(s2.name).state == "creating"
    assert not store.finish_cold("b", s2.name, now())
    assert store.sandbox(s2.name).state == "releasing"


def test_retiring_an_idle_sandbox_takes_it_out_of_adoption(store):
    """An idle sandbox the engine found without execd leaves the pool in one write: no later claim adopts it, and a
    sandbox a claim took first is not retired (its claim's check decides)."""
    ready(store, 2)
    assert store.retire_idle("p-0") and store.sandbox("p-0").state == "deleting"
    claim, sandbox, _ = store.adopt(ClaimRow(name="c", pool="p", pool_kind="WarmPool", phase="Pending", created=now()),
                                    order, None)
    assert sandbox is not None and sandbox.name == "p-1"
    assert not store.retire_idle("p-1") and store.sandbox("p-1").state == "ready"  # claimed
    assert not store.retire_idle("p-0") and not store.retire_idle("nope")
    _, none, _ = store.adopt(ClaimRow(name="d", pool="p", pool_kind="WarmPool", phase="Pending", created=now()),
                             order, None)
    assert none is None


def batch(name: str = "b", replicas: int = 4, **kw) -> BatchRow:
    return BatchRow(name=name, uid="u", pool="p", pool_kind="WarmPool", replicas=replicas, task="{}", created=now(),
                    **kw)


def test_a_batch_binds_warm_first_then_cold_within_the_limit_in_one_transaction(store):
    ready(store, 2)
    b, new = store.add_batch(batch(replicas=5))
    assert new and store.add_batch(batch(replicas=9)) == (b, False)  # a retry: the batch that exists
    bound = store.bind_batch(b, [0, 1, 2, 3, 4], order, cold_row, cold_limit=4)
    assert [(i, r.launch_type) for i, r in bound] == [(0, "warm"), (1, "warm"), (2, "cold"), (3, "cold")]
    assert {r.claim for _, r in bound} == {"b_0", "b_1", "b_2", "b_3"}  # the core's claim labels
    tasks = store.tasks("b")
    assert [t.phase for t in tasks] == ["Bound"] * 4 + ["Pending"]
    assert store.batch("b").started_at is not None
    # a claim finds nothing to adopt (every sandbox is taken), and binding again binds only what is Pending
    claim, sbx, _ = store.adopt(ClaimRow(name="c", pool="p", pool_kind="WarmPool", phase="Pending", created=now()),
                                order, None)
    assert sbx is None
    assert store.bind_batch(b, [0, 1, 2, 3, 4], order, cold_row, cold_limit=4) == []


def test_a_task_ends_once_and_releases_its_sandbox_in_the_same_transaction(store):
    ready(store, 2)
    b, _ = store.add_batch(batch(replicas=2))
    store.bind_batch(b, [0, 1], order, cold_row)
    end = dict(phase="Succeeded", reason="Completed", message="ok", exit_code=0, output="out\n",
               output_truncated=False)
    assert store.end_task("b", 0, **end, release=True) == (True, "p-0")
    assert store.end_task("b", 0, **end, release=True) == (False, None)  # once
    assert store.sandbox("p-0").state == "releasing" and store.sandbox("p-0").claim is None
    assert store.end_task("b", 1, **{**end, "phase": "Failed"}, release=False) == (True, None)  # Retain
    assert store.sandbox("p-1").claim == "b_1"
    t = store.task("b", 0)
    assert (t.phase, t.output, t.sandbox) == ("Succeeded", "out\n", "p-0")  # the sandbox stays in the result
    assert store.finish_batch("b", "Failed", now()) and not store.finish_batch("b", "Failed", now())
    assert store.remove_batch("b") == [("p-1", 1, True)]
    assert store.batch("b") is None and store.tasks("b") == [] and store.sandbox("p-1").state == "releasing"


def test_a_cold_start_ends_ready_only_if_its_index_still_waits(store):
    b, _ = store.add_batch(batch(replicas=2))
    (i0, r0), (i1, r1) = store.bind_batch(b, [0, 1], order, cold_row)
    assert store.finish_batch_cold("b", 0, r0.name) and store.sandbox(r0.name).state == "ready"
    store.unbind_task("b", 1, r1.name)  # the operator stopped while it started: Pending again
    assert store.task("b", 1).phase == "Pending" and store.task("b", 1).sandbox is None
    assert not store.finish_batch_cold("b", 1, r1.name) and store.sandbox(r1.name).state == "releasing"
    assert store.remove_batch("b") == [(r0.name, 0, False)]  # its task had not ended: the caller deletes it


def test_docker_template_from_the_catalogue():
    t = docker_template("python", catalogue.render("python", {"memory": "1Gi"}).to_k8s(), network="n")
    assert t.image == "corral/python:bookworm" and t.command == ["sleep", "infinity"]
    assert t.memory_bytes == 2**30 and t.nano_cpus == 10**9 and t.cpu_shares == 256
    assert t.user == "1000:1000" and t.env == {"PYTHONUNBUFFERED": "1"} and t.env_policy == "Allowed"
    assert t.labels["corral.dev/catalogue"] == "python"
    assert t.blueprint_hash() != docker_template("python", catalogue.render("python").to_k8s(),
                                                 network="n").blueprint_hash()
    assert memory_bytes("512Mi") == 512 * 2**20 and memory_bytes("1G") == 10**9 and cpus("250m") == 0.25


def test_desired_state_checks_references():
    t = docker_template("shell", catalogue.render("shell").to_k8s(), network="n")
    with pytest.raises(ValidationError, match="unknown template"):
        DesiredState(stack="s", templates=[t], warm_pools=[df.warm_pool(name="a", template="nope", replicas=1)])
    with pytest.raises(ValidationError, match="used twice"):
        DesiredState(stack="s", templates=[t], warm_pools=[df.warm_pool(name="a", template="shell", replicas=1)],
                     pools=[df.pool(name="a", template="shell")])
    with pytest.raises(ValidationError, match="bufferMin"):
        df.pool(name="a", template="shell", buffer_min=3, buffer_max=1)
    d = DesiredState(stack="s", templates=[t], warm_pools=[df.warm_pool(name="a", template="shell", replicas=1)])
    assert DesiredState.model_validate_json(d.dump()) == d
