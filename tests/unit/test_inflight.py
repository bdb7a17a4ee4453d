"""The operator's in-flight state (corral.operator.inflight): each type's lifecycle, entry by entry, and that every
entry goes when what it is about goes."""

from __future__ import annotations

import asyncio

import pytest

from corral.api import CorralValidationError
from corral.components import catalogue
from corral.operator.inflight import (
    ClaimBook,
    Expectations,
    NamespaceRepairs,
    PoolLocks,
    PoolPacing,
    SandboxStarts,
    TemplateSpecs,
    TokenBook,
)
from corral.operator.inflight.starts import POD_CREATE_GRACE


# ---- ClaimBook -------------------------------------------------------------------------------------------------------
def test_an_adoption_is_reserved_until_the_cache_shows_it_then_bound_until_the_claim_sees_its_sandbox():
    book = ClaimBook()
    book.reserve("ns", "wp-a", "c1")
    assert book.is_reserved("ns", "wp-a") and book.reserved_in("ns") == {"wp-a"} and book.reserved_in("other") == set()
    book.bind("ns", "c1", "wp-a")
    assert book.bound_to("ns", "c1") == "wp-a" and book.is_bound("ns", "c1")

    book.adoption_seen("ns", "wp-a")  # the sandbox's labelled watch event
    assert not book.is_reserved("ns", "wp-a")
    book.binding_seen("ns", "c1")  # the claim's pass finds the sandbox by label
    assert book.bound_to("ns", "c1") is None and len(book) == 0


def test_a_failed_adoption_patch_frees_the_sandbox_for_the_next_claim():
    book = ClaimBook()
    book.reserve("ns", "wp-a", "c1")
    book.unreserve("ns", "wp-a")
    assert book.reserved_in("ns") == set() and len(book) == 0


def test_a_written_phase_holds_the_claim_back_until_the_watch_shows_it_once():
    book = ClaimBook()
    assert not book.awaiting_echo("ns", "c1", "Pending")  # nothing written: act
    book.phase_written("ns", "c1", "Bound")
    assert book.awaiting_echo("ns", "c1", "Pending")  # the cache is behind our write
    assert book.awaiting_echo("ns", "c1", None)
    assert not book.awaiting_echo("ns", "c1", "Bound")  # it arrived: act, and forget the write
    assert len(book) == 0
    assert not book.awaiting_echo("ns", "c1", "Pending")  # a later change by someone else is acted on


def test_first_seen_is_kept_from_the_first_pending_pass_until_the_claim_is_decided():
    book = ClaimBook()
    assert book.first_seen("ns", "c1", 10.0) == 10.0
    assert book.first_seen("ns", "c1", 12.0) == 10.0  # latency counts from the first pass
    book.decided("ns", "c1")
    assert len(book) == 0


def test_a_deleted_claim_and_a_deleted_sandbox_leave_nothing_behind():
    book = ClaimBook()
    book.first_seen("ns", "c1", 1.0)
    book.bind("ns", "c1", "wp-a")
    book.phase_written("ns", "c1", "Failed")
    book.reserve("ns", "wp-a", "c1")  # its labelled event never came: the sandbox went first
    book.claim_gone("ns", "c1")
    assert len(book) == 1
    book.sandbox_gone("ns", "wp-a")
    assert len(book) == 0


def test_a_live_claims_spec_is_validated_once_per_generation_and_dropped_when_it_ends():
    book = ClaimBook()

    def claim(generation: int, pool: str = "wp") -> dict:
        return {"metadata": {"namespace": "ns", "name": "c1", "uid": "u1", "generation": generation},
                "spec": {"poolRef": {"name": pool}}}

    first = book.spec(claim(1))
    assert book.spec(claim(1)) is first and len(book) == 1  # not validated again
    assert book.spec(claim(2, "other")).pool_ref.name == "other"  # an edit is
    with pytest.raises(CorralValidationError):
        book.spec(claim(3, "Not A Name"))
    assert book.spec(claim(2, "other"), keep=False).pool_ref.name == "other"  # the claim ended: not kept
    assert len(book) == 0
    book.spec(claim(4))
    book.claim_gone("ns", "c1")
    assert len(book) == 0


# ---- PoolPacing ------------------------------------------------------------------------------------------------------
def _refill(pacing: PoolPacing, now: float, deficit: int = 10, ready_idle: int = 200, starting: int = 0,
            low_water: int = 30, pool: str = "wp") -> tuple[int, float | None]:
    return pacing.refill("WarmPool", "ns", pool, now, deficit=deficit, ready_idle=ready_idle, starting=starting,
                         low_water=low_water)


def test_refill_waits_for_the_quiet_moment_after_a_claim_stream():
    pacing = PoolPacing(claim_quiet=0.15, max_refill_defer=30)
    assert _refill(pacing, now=100.0) == (10, None)  # no claims: all of it, now
    pacing.claim_decided("WarmPool", "ns", "wp", now=100.0)
    assert _refill(pacing, now=100.05) == (0, pytest.approx(100.15))  # back when the stream pauses
    assert _refill(pacing, now=100.05, pool="other") == (10, None)
    assert _refill(pacing, now=100.15) == (10, None)  # quiet now
    assert _refill(pacing, now=100.16, deficit=0) == (0, None)  # nothing missing: nothing to wait for


def test_refill_does_not_wait_when_the_pool_runs_low():
    pacing = PoolPacing(claim_quiet=0.15, max_refill_defer=1.0)
    pacing.claim_decided("WarmPool", "ns", "wp", now=100.0)
    assert _refill(pacing, now=100.01, ready_idle=29) == (10, None)  # under the low-water mark: all of it
    assert _refill(pacing, now=100.02, ready_idle=31)[0] == 0  # above it, one claim in 2 s: it can wait


def test_a_stream_refills_early_enough_for_its_rate_and_the_measured_ready_lag():
    # 20 claims a second; new sandboxes are Ready 2 s after their create. 30 ready, low water 5: enough for a wait
    # of max_refill_defer (0.5 s) only if the ready ones outlast 2.5 s of claims (50) on top of the low water.
    pacing = PoolPacing(claim_quiet=0.15, max_refill_defer=0.5, rate_window=2.0)
    claims = [100.025 + i * 0.05 for i in range(1000)]

    def stream(until: float) -> None:  # the claims decided up to `until`
        while claims[0] <= until + 1e-9:
            pacing.claim_decided("WarmPool", "ns", "wp", now=claims.pop(0))

    stream(102.0)
    assert pacing.claim_rate("WarmPool", "ns", "wp", now=102.0) == pytest.approx(20.0)
    for name in ("a", "b"):
        pacing.refill_started("WarmPool", "ns", "wp", name, now=99.0)
    pacing.refills_seen("WarmPool", "ns", "wp", {"a": True, "b": False}, now=101.0)  # a: Ready after 2 s
    assert pacing.ready_lag("WarmPool", "ns", "wp") == pytest.approx(2.0)
    assert _refill(pacing, now=102.0, deficit=40, ready_idle=30, starting=10, low_water=5) == (40, None)
    # The same stream against a pool with 100 ready: it waits (not past max_refill_defer), then refills in chunks.
    deficit, wake = _refill(pacing, now=102.0, deficit=40, ready_idle=100, starting=0, low_water=5)
    assert deficit == 0 and wake == pytest.approx(101.975 + 0.15)  # the stream's end, if it ends
    stream(102.4)
    assert _refill(pacing, now=102.4, deficit=40, ready_idle=100, low_water=5)[0] == 0
    stream(102.5)
    chunk, wake = _refill(pacing, now=102.5, deficit=40, ready_idle=100, low_water=5)
    assert chunk == 20  # twice the claims of max_refill_defer at 20/s: keeps up, catches up, no storm
    assert wake == pytest.approx(102.475 + 0.15)  # the rest: at the next look
    stream(102.55)
    assert _refill(pacing, now=102.55, deficit=20, ready_idle=100, low_water=5) == (0, pytest.approx(102.525 + 0.15))


def test_a_burst_is_decided_before_the_refill_but_an_established_stream_refills_among_its_claims():
    pacing = PoolPacing(claim_quiet=0.15, rate_window=2.0)
    key = ("WarmPool", "ns", "wp")
    assert not pacing.waits_for_claims(*key, now=100.0, undecided=0, ready_idle=0)  # nothing to wait for
    assert pacing.waits_for_claims(*key, now=100.0, undecided=1, ready_idle=10)  # a claim out of the blue
    for i in range(60):  # a claim every 50 ms for 3 s
        pacing.claim_decided(*key, now=100.0 + i * 0.05)
        now = 100.0 + i * 0.05 + 0.01
        waits = pacing.waits_for_claims(*key, now=now, undecided=2, ready_idle=30)
        assert waits == (now - 100.0 < 2.0), now  # the first 2 s might be a burst; then it is a stream
    assert pacing.waits_for_claims(*key, now=102.96, undecided=31, ready_idle=30)  # more waiting than ready
    for i in range(60, 220):  # the stream goes on: no burst lasts 10 s; a pool run dry refills, claims waiting
        pacing.claim_decided(*key, now=100.0 + i * 0.05)
    assert not pacing.waits_for_claims(*key, now=110.96, undecided=200, ready_idle=0)
    assert pacing.waits_for_claims(*key, now=111.5, undecided=2, ready_idle=30)  # the stream paused: a new one


def test_the_ready_lag_follows_refills_until_ready_and_forgets_those_that_left():
    pacing = PoolPacing(ready_guess=1.0)
    key = ("WarmPool", "ns", "wp")
    assert pacing.ready_lag(*key) == 1.0  # nothing measured yet
    pacing.refill_started(*key, "a", now=10.0)
    pacing.refill_started(*key, "b", now=10.0)
    pacing.refill_started(*key, "c", now=10.0)
    assert pacing.following(*key)
    pacing.refills_seen(*key, {"a": False, "b": False}, now=11.0)  # c not in the cache yet: still followed
    assert len(pacing) == 1
    pacing.refills_seen(*key, {"a": True, "b": False, "c": False}, now=13.0)
    assert pacing.ready_lag(*key) == pytest.approx(3.0)
    pacing.refills_seen(*key, {"b": True}, now=16.0)  # c left the pool (deleted) before it was Ready
    assert pacing.ready_lag(*key) == pytest.approx(3.0 + 0.2 * (6.0 - 3.0))  # a moving average
    assert len(pacing) == 1 and not pacing.following(*key)  # only the lag is kept: no refill followed any more
    pacing.refill_started(*key, "d", now=20.0)
    pacing.refills_seen(*key, {"d": False}, now=20.0 + 121)  # never Ready: not followed for ever
    assert len(pacing) == 1


def test_routine_pool_status_writes_are_spaced_and_wait_for_a_claim_stream():
    pacing = PoolPacing(claim_quiet=0.15, status_interval=0.5)
    key = ("WarmPool", "ns", "wp")
    assert pacing.status_wait(*key, now=10.0) is None
    pacing.status_written(*key, now=10.0)
    assert pacing.status_wait(*key, now=10.2) == pytest.approx(10.5)
    assert pacing.status_wait(*key, now=10.5) is None
    pacing.claim_decided(*key, now=10.6)
    assert pacing.status_wait(*key, now=10.65) == pytest.approx(10.75)


def test_a_deleted_pool_takes_its_pacing_along():
    pacing = PoolPacing(claim_quiet=0.15, max_refill_defer=30)
    key = ("Pool", "ns", "p")
    pacing.claim_decided(*key, now=100.0)  # claim activity and claim times
    assert pacing.refill(*key, now=100.01, deficit=1, ready_idle=50, starting=0, low_water=1)[0] == 0  # deferred
    pacing.status_written(*key, now=100.0)
    pacing.refill_started(*key, "p-1", now=100.0)
    pacing.refill_started(*key, "p-2", now=100.0)
    pacing.refills_seen(*key, {"p-1": True, "p-2": False}, now=101.0)  # a ready lag, p-2 still followed
    pacing.claim_decided("WarmPool", "ns", "p", now=100.0)  # the same name, another kind: another pool
    assert len(pacing) == 10
    pacing.pool_gone(*key)
    assert len(pacing) == 3 and pacing.claims_streaming(*key, now=100.01) is None
    assert pacing.ready_lag(*key) == pacing.ready_guess and pacing.claim_rate(*key, now=100.01) == 0


# ---- SandboxStarts ---------------------------------------------------------------------------------------------------
def test_a_pod_create_is_trusted_for_its_grace_then_made_again():
    starts = SandboxStarts()
    key = ("ns", "sb")
    assert starts.pod_create_due(key, 0.0)
    assert starts.pod_created(key, 100.0) == 100.0 + POD_CREATE_GRACE + 1  # when to look again
    assert not starts.pod_create_due(key, 100.0 + POD_CREATE_GRACE)
    assert starts.pod_create_due(key, 100.0 + POD_CREATE_GRACE + 0.5)  # lost: make it again
    starts.pod_seen(key)
    assert len(starts) == 0


def test_an_intermediate_status_settles_from_the_first_time_it_was_held_back():
    starts = SandboxStarts(settle=0.3)
    key = ("ns", "sb")
    assert starts.settle_until(key, 10.0) == pytest.approx(10.3)
    assert starts.settle_until(key, 10.2) == pytest.approx(10.3)  # not pushed back by later passes
    assert starts.settle_until(key, 10.3) is None
    starts.settled(key)
    assert len(starts) == 0
    assert SandboxStarts(settle=0).settle_until(key, 10.0) is None  # settling off: write at once, keep nothing


def test_a_deleted_sandbox_leaves_no_start_state():
    starts = SandboxStarts(settle=0.3)
    starts.pod_created(("ns", "sb"), 1.0)
    starts.settle_until(("ns", "sb"), 1.0)
    starts.sandbox_gone(("ns", "sb"))
    assert len(starts) == 0


# ---- NamespaceRepairs ------------------------------------------------------------------------------------------------
def test_a_terminating_namespace_skips_what_was_made_before_and_is_forgotten_later():
    repairs = NamespaceRepairs(forget_after=600)
    repairs.mark_terminating("ns", 1000.0)
    repairs.mark_terminating("ns", 1050.0)  # the first refusal counts
    assert repairs.terminating_since("ns", 999.0) and repairs.terminating_since("ns", 1000.0)
    assert not repairs.terminating_since("ns", 1001.0)  # made after: a re-created namespace
    assert not repairs.terminating_since("other", 0.0)
    repairs.mark_terminating("other", 1601.0)  # any later mark forgets the old ones
    assert not repairs.is_terminating("ns") and repairs.is_terminating("other") and len(repairs) == 1


async def test_lost_pod_repairs_in_a_namespace_wait_for_the_first_then_go_together():
    repairs = NamespaceRepairs()
    first_in, release = asyncio.Event(), asyncio.Event()
    order: list[str] = []
    running = 0
    peak = 0

    async def repair(who: str, hold: asyncio.Event | None = None) -> None:
        nonlocal running, peak
        async with repairs.pod_repair("ns"):
            running += 1
            peak = max(peak, running)
            order.append(who)
            if hold is not None:
                first_in.set()
                await hold.wait()
            await asyncio.sleep(0.01)
            running -= 1

    probe = asyncio.create_task(repair("probe", release))
    await first_in.wait()
    others = [asyncio.create_task(repair(f"r{i}")) for i in range(5)]
    await asyncio.sleep(0.05)
    assert order == ["probe"]  # the rest wait for the repair in flight
    async with repairs.pod_repair("other-ns"):  # another namespace is not held up
        pass
    release.set()
    await asyncio.gather(probe, *others)
    assert sorted(order[1:]) == [f"r{i}" for i in range(5)] and peak == 5  # then they run together
    assert repairs.repairs_in_flight == 0


async def test_a_cancelled_waiter_does_not_cancel_the_repair_it_waits_for():
    repairs = NamespaceRepairs()
    entered, release = asyncio.Event(), asyncio.Event()

    async def probe() -> str:
        async with repairs.pod_repair("ns"):
            entered.set()
            await release.wait()
        return "done"

    async def waiter() -> None:
        async with repairs.pod_repair("ns"):
            pass

    p = asyncio.create_task(probe())
    await entered.wait()
    w1, w2 = asyncio.create_task(waiter()), asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    w1.cancel()
    release.set()
    assert await p == "done"
    await w2  # still released by the probe
    assert w1.cancelled() and repairs.repairs_in_flight == 0


# ---- TokenBook -------------------------------------------------------------------------------------------------------
def test_an_installed_claim_token_is_kept_until_taken_back_or_the_sandbox_goes():
    tokens = TokenBook()
    tokens.note_installed("ns", "sb", "pod-1", "claim-1")
    assert tokens.installed("ns", "sb") == ("pod-1", "claim-1")
    assert tokens.take("ns", "sb") == ("pod-1", "claim-1") and tokens.installed("ns", "sb") is None
    tokens.note_installed("ns", "sb", "pod-1", "claim-2")
    tokens.sandbox_gone("ns", "sb", last_in_namespace=False)
    assert len(tokens) == 0


def test_a_key_secret_is_made_once_per_namespace_until_the_namespace_goes_or_empties():
    tokens = TokenBook()
    assert tokens.key_secret_needed("ns")
    tokens.key_secret_made("ns")
    assert not tokens.key_secret_needed("ns") and tokens.has_key_secret("ns")
    tokens.sandbox_gone("ns", "sb", last_in_namespace=False)
    assert not tokens.key_secret_needed("ns")  # other sandboxes still there
    tokens.sandbox_gone("ns", "sb2", last_in_namespace=True)
    assert tokens.key_secret_needed("ns")  # the namespace may be deleted and come back
    tokens.key_secret_made("ns")
    tokens.namespace_gone("ns")
    assert tokens.key_secret_needed("ns") and len(tokens) == 0


# ---- TemplateSpecs ---------------------------------------------------------------------------------------------------
def _template(generation: int, spec: dict | None = None) -> dict:
    return {"metadata": {"namespace": "ns", "name": "t", "uid": "u1", "generation": generation},
            "spec": spec if spec is not None else catalogue.render("shell").to_k8s()}


def test_a_template_spec_is_validated_once_per_generation_and_forgotten_with_the_template():
    specs = TemplateSpecs()
    first, h1 = specs.spec(_template(1))
    again, h2 = specs.spec(_template(1))
    assert again is first and h1 == h2  # not validated again
    newer, _ = specs.spec(_template(2))
    assert newer is not first
    with pytest.raises(CorralValidationError):
        specs.spec(_template(3, {"podTemplate": "not a pod"}))
    assert specs.spec(_template(2))[0] is newer  # the invalid one was not kept in its place
    specs.template_gone("ns", "t")
    assert len(specs) == 0


# ---- PoolLocks -------------------------------------------------------------------------------------------------------
async def test_a_pool_lock_serialises_one_pool_and_is_gone_once_nobody_holds_or_waits_for_it():
    locks = PoolLocks()
    inside: list[str] = []
    peak = {"p": 0, "q": 0}

    async def work(pool: str) -> None:
        async with locks.hold("ns", pool):
            inside.append(pool)
            peak[pool] = max(peak[pool], inside.count(pool))
            await asyncio.sleep(0.01)
            inside.remove(pool)

    await asyncio.gather(*(work("p") for _ in range(4)), work("q"), work("q"))
    assert peak == {"p": 1, "q": 1}
    assert len(locks) == 0

    entered = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("ns", "p"):
            entered.set()
            await asyncio.sleep(0.02)

    h = asyncio.create_task(holder())
    await entered.wait()
    waiter = asyncio.create_task(work("p"))
    await asyncio.sleep(0)
    waiter.cancel()  # a waiter that gives up does not leave its entry behind
    await asyncio.gather(h, waiter, return_exceptions=True)
    assert len(locks) == 0


# ---- Expectations ----------------------------------------------------------------------------------------------------
def test_expected_creates_go_when_seen_expired_or_with_their_pool(monkeypatch: pytest.MonkeyPatch):
    import time

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    creates = Expectations(ttl=60)
    key = ("WarmPool", "ns", "wp")
    creates.expect(key, "wp-1")
    creates.expect(key, "wp-2")
    assert creates.outstanding(key, set()) == 2
    assert creates.outstanding(key, {"wp-1"}) == 1
    clock[0] += 61
    assert creates.outstanding(key, set()) == 0 and len(creates) == 0  # expired: its key goes too
    creates.expect(key, "wp-3")
    creates.forget(key)
    assert creates.outstanding(key, set()) == 0 and len(creates) == 0
