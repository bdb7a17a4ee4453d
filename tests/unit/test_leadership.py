"""kopf peering's rule, mirrored for what kopf does not pause (the claims API): which replica is active."""

from datetime import UTC, datetime, timedelta

from corral.operator.leadership import decide, pod_label_patch

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def peer(priority: int, seen_ago: float, lifetime: int = 10) -> dict:
    return {"priority": priority, "lifetime": lifetime, "lastseen": (NOW - timedelta(seconds=seen_ago)).isoformat()}


def test_alone_or_highest_is_active():
    assert decide({}, "me", 5, NOW) == (True, None)
    assert decide({"me": peer(5, 0)}, "me", 5, NOW) == (True, None)
    assert decide({"me": peer(5, 0), "low": peer(3, 1)}, "me", 5, NOW) == (True, None)


def test_a_live_higher_or_equal_peer_makes_a_standby_until_it_expires():
    active, wait = decide({"me": peer(5, 0), "high": peer(9, 4)}, "me", 5, NOW)
    assert not active and wait == 6.0  # lifetime 10 s, seen 4 s ago
    active, wait = decide({"twin": peer(5, 1)}, "me", 5, NOW)  # kopf pauses both when priorities are equal
    assert not active and wait == 9.0
    # two blockers: re-evaluate when the first expires
    assert decide({"a": peer(9, 8), "b": peer(7, 2)}, "me", 5, NOW) == (False, 2.0)


def test_dead_peers_do_not_count():
    assert decide({"high": peer(9, 10)}, "me", 5, NOW) == (True, None)  # exactly its lifetime ago: dead, as in kopf
    assert decide({"high": peer(9, 60, lifetime=60 * 2)}, "me", 5, NOW)[0] is False
    assert decide({"zulu": {"priority": 9, "lifetime": 10, "lastseen": "2026-11-29T11:59:55Z"}}, "me", 5, NOW) == (
        False, 5.0)


def test_pod_label_patch_sets_and_removes():
    assert pod_label_patch(True) == {"metadata": {"labels": {"corral.dev/claims-api": "active"}}}
    assert pod_label_patch(False) == {"metadata": {"labels": {"corral.dev/claims-api": None}}}
