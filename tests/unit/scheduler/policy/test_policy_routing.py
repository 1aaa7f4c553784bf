"""route / route_any: least-loaded, caps, liveness, round-robin, fallback order."""

import pytest
from policy_builders import inst, make_layout

from scheduling.policy import RoundRobinCursor, RouteKind, UnknownBucket, route, route_any


def test_route_picks_least_loaded_instance_of_preferred_bucket() -> None:
    instances = [inst("s0", "short", 1), inst("s1", "short", 0), inst("m0", "medium", 0)]
    result = route("short", instances, make_layout())
    assert result is not None
    assert (result.instance_id, result.bucket, result.kind) == ("s1", "short", RouteKind.PREFERRED)


def test_route_skips_instance_at_cap() -> None:
    instances = [inst("s0", "short", 2), inst("s1", "short", 1)]
    result = route("short", instances, make_layout(cap=2))
    assert result is not None and result.instance_id == "s1"


def test_route_never_exceeds_cap_falls_back_to_other_bucket() -> None:
    instances = [inst("s0", "short", 2), inst("m0", "medium", 1)]
    result = route("short", instances, make_layout(cap=2))
    assert result is not None
    assert (result.instance_id, result.kind) == ("m0", RouteKind.FALLBACK)


def test_route_skips_dead_instances() -> None:
    instances = [inst("s0", "short", 0, is_live=False), inst("s1", "short", 1)]
    result = route("short", instances, make_layout())
    assert result is not None and result.instance_id == "s1"


def test_route_returns_none_when_all_full_or_dead() -> None:
    instances = [
        inst("s0", "short", 2),
        inst("m0", "medium", 0, is_live=False),
        inst("l0", "long", 2),
    ]
    assert route("short", instances, make_layout(cap=2)) is None


def test_route_without_fallback_returns_none_when_bucket_full() -> None:
    instances = [inst("s0", "short", 2), inst("m0", "medium", 0)]
    assert route("short", instances, make_layout(cap=2), enable_fallback=False) is None


def test_route_fallback_prefers_nearest_bucket() -> None:
    instances = [inst("m0", "medium", 1), inst("s0", "short", 0)]
    result = route("long", instances, make_layout())
    assert result is not None and result.bucket == "medium"


def test_round_robin_tie_break_rotates_over_tied_instances() -> None:
    instances = [inst("s2", "short"), inst("s0", "short"), inst("s1", "short")]
    cursor = RoundRobinCursor()
    picks = [route("short", instances, make_layout(), cursor=cursor).instance_id for _ in range(4)]  # type: ignore[union-attr]
    assert picks == ["s0", "s1", "s2", "s0"]


def test_round_robin_cursor_is_per_bucket() -> None:
    cursor = RoundRobinCursor()
    cursor.pick("short", ["a", "b"])
    assert cursor.pick("long", ["a", "b"]) == "a"
    assert cursor.to_dict() == {"short": "a", "long": "a"}


def test_route_unknown_bucket_raises() -> None:
    with pytest.raises(UnknownBucket):
        route("huge", [inst("s0", "short")], make_layout())


def test_route_skips_instances_of_buckets_not_in_layout() -> None:
    assert route("short", [inst("x0", "retired", 0)], make_layout()) is None


def test_route_any_ignores_bucket_and_picks_global_least_loaded() -> None:
    instances = [inst("s0", "short", 1), inst("l0", "long", 0)]
    result = route_any(instances, make_layout())
    assert result is not None and (result.instance_id, result.bucket) == ("l0", "long")


def test_route_any_respects_each_buckets_cap() -> None:
    assert route_any([inst("s0", "short", 2), inst("l0", "long", 2)], make_layout(cap=2)) is None
