"""The operator's pure decisions."""

import pytest

from corral.operator.planning import Member, adoption_order, deletion_order, plan_pool, plan_warm_pool, slow_start


def m(name, ready=True, h="new", created=0.0, node="n1", claim=None, deleting=False):
    return Member(name=name, namespace="ns", ready=ready, blueprint_hash=h, created=created, node=node, claim=claim,
                  deleting=deleting)


@pytest.mark.parametrize("n,batches", [(0, []), (1, [1]), (3, [1, 2]), (10, [1, 2, 4, 3]),
                                       (100, [1, 2, 4, 8, 16, 32, 32, 5])])
def test_slow_start(n, batches):
    assert slow_start(n, cap=32) == batches
    assert sum(slow_start(n)) == n


def test_warm_pool_creates_the_shortfall_minus_what_is_in_flight():
    plan = plan_warm_pool(replicas=5, idle=[m("a"), m("b")], current_hash="new", strategy="OnReplenish",
                          expected_creates=1, now=100, readiness_grace=60)
    assert plan.create == 2 and plan.delete == []


def test_warm_pool_never_double_creates_when_everything_is_in_flight():
    plan = plan_warm_pool(replicas=5, idle=[], current_hash="new", strategy="OnReplenish",
                          expected_creates=5, now=0, readiness_grace=60)
    assert plan.create == 0 and plan.delete == []


def test_scale_down_deletes_not_ready_first_then_newest():
    idle = [m("old", created=1), m("new", created=3), m("unready", ready=False, created=2), m("mid", created=2)]
    plan = plan_warm_pool(replicas=2, idle=idle, current_hash="new", strategy="OnReplenish",
                          expected_creates=0, now=10, readiness_grace=60)
    assert [x.name for x in plan.delete] == ["unready", "new"]


def test_stuck_unready_past_grace_is_replaced():
    idle = [m("stuck", ready=False, created=0), m("ok")]
    plan = plan_warm_pool(replicas=2, idle=idle, current_hash="new", strategy="OnReplenish",
                          expected_creates=0, now=100, readiness_grace=60)
    assert [x.name for x in plan.delete] == ["stuck"] and plan.create == 1


def test_recreate_deletes_stale_on_replenish_keeps_them():
    idle = [m("s1", h="old"), m("s2", h="old"), m("f1")]
    recreate = plan_warm_pool(replicas=3, idle=idle, current_hash="new", strategy="Recreate",
                              expected_creates=0, now=0, readiness_grace=60)
    assert sorted(x.name for x in recreate.delete) == ["s1", "s2"] and recreate.create == 2
    replenish = plan_warm_pool(replicas=3, idle=idle, current_hash="new", strategy="OnReplenish",
                               expected_creates=0, now=0, readiness_grace=60)
    assert replenish.delete == [] and replenish.create == 0


def pool(**kw):
    args = dict(buffer_min=2, buffer_max=4, pool_min=0, pool_max=10, max_unavailable=2, idle=[], allocated=0,
                terminating=0, expected_creates=0, current_hash="new")
    args.update(kw)
    return plan_pool(**args)


def test_pool_fills_the_buffer_within_pool_max():
    assert pool().create == 2
    assert pool(allocated=9).create == 1  # poolMax caps it
    assert pool(allocated=10).create == 0
    assert pool(expected_creates=2).create == 0


def test_pool_respects_pool_min():
    assert pool(pool_min=6, buffer_min=0, buffer_max=10).create == 6


def test_pool_trims_the_buffer_bounded_by_max_unavailable_and_pool_min():
    idle = [m(f"i{i}", created=i) for i in range(7)]
    plan = pool(idle=idle)
    assert len(plan.delete) == 2  # 3 over bufferMax, but maxUnavailable=2
    assert [x.name for x in plan.delete] == ["i6", "i5"]  # newest first
    assert len(pool(idle=idle, terminating=1).delete) == 1  # in-flight deletes count against maxUnavailable
    assert len(pool(idle=idle, pool_min=6, max_unavailable=10).delete) == 1  # never below poolMin


def test_pool_replaces_idle_sandboxes_unready_past_the_grace_within_max_unavailable():
    """An idle Pool sandbox whose execd died (its readiness probe failed) is deleted once unready past the grace, and
    the buffer is refilled; at most maxUnavailable at once, counting deletes in flight."""
    dead = [Member(name=f"d{i}", namespace="ns", ready=False, blueprint_hash="new", created=0.0,
                   unready_since=50.0) for i in range(3)]
    ok = [m("ok1"), m("ok2")]
    assert pool(idle=[*dead, *ok], now=100.0, readiness_grace=60, buffer_max=5).delete == []  # 50 s: not yet
    plan = pool(idle=[*dead, *ok], now=120.0, readiness_grace=60, buffer_max=5)
    assert len(plan.delete) == 2 and {x.name for x in plan.delete} <= {"d0", "d1", "d2"}  # maxUnavailable=2
    assert plan.create == 0  # two ready idle are the buffer; the dead are replaced as they go
    plan = pool(idle=[*dead, m("ok1")], now=120.0, readiness_grace=60, max_unavailable=3)
    assert len(plan.delete) == 3 and plan.create == 1  # buffer of 2: one ready idle left
    assert pool(idle=[*dead, *ok], now=120.0, readiness_grace=60, terminating=2, buffer_max=5).delete == []
    assert pool(idle=[*dead, *ok], now=120.0, buffer_max=5).delete == []  # no grace given: never


def test_warm_pool_counts_unready_from_when_a_sandbox_turned_unready():
    """A sandbox made long ago that turned unready a moment ago (its execd died) is not stuck yet."""
    late = Member(name="late", namespace="ns", ready=False, blueprint_hash="new", created=0.0, unready_since=990.0)
    plan = plan_warm_pool(replicas=1, idle=[late], current_hash="new", strategy="OnReplenish",
                          expected_creates=0, now=1000, readiness_grace=60)
    assert plan.delete == []
    plan = plan_warm_pool(replicas=1, idle=[late], current_hash="new", strategy="OnReplenish",
                          expected_creates=0, now=1051, readiness_grace=60)
    assert [x.name for x in plan.delete] == ["late"] and plan.create == 1


def test_adoption_prefers_stale_then_spreads_over_nodes():
    cands = [m("a", node="n1", created=1), m("b", node="n1", created=2), m("c", node="n2", created=0),
             m("stale", h="old", node="n2", created=5), m("unready", ready=False), m("taken", claim="x")]
    order = [x.name for x in adoption_order(cands, "new", reserved={"b"})]
    assert order == ["stale", "c", "a"] or order == ["stale", "a", "c"]
    assert "unready" not in order and "taken" not in order and "b" not in order


def test_deletion_order_total():
    ms = [m("r-new", created=5), m("nr", ready=False), m("stale", h="old", created=9)]
    assert [x.name for x in deletion_order(ms, "new")] == ["nr", "stale", "r-new"]
