"""The per-bucket load index (scheduling/policy/load_index.py): routing by lookup must
choose exactly what routing by scan chooses (ties, load changes, full and dead
instances, instances gone from a new snapshot), for every routing function."""

from __future__ import annotations

import copy
import random

from libra import types as t
from scheduling.policy.layout import BucketLayout
from scheduling.policy.load_index import LoadIndex
from scheduling.policy.routing import (
    RoundRobinCursor,
    route,
    route_any,
    route_by_load,
    route_with_queue_length,
)
from scheduling.policy.thresholds import idle_while_queued, live_gpu_shares

LAYOUT = BucketLayout([
    t.Bucket("short", 1_000, max_trajectories_per_instance=3, tp_degree=1),
    t.Bucket("mid", 4_000, max_trajectories_per_instance=4, tp_degree=2),
    t.Bucket("long", 16_000, max_trajectories_per_instance=5, tp_degree=4)])


def load(name: str, bucket: str, active: int, live: bool = True) -> t.InstanceLoad:
    return t.InstanceLoad(t.InstanceId(name), bucket, active, is_live=live)


def test_ties_rotate_by_id_as_the_scan_does() -> None:
    loads = [load(f"r-{i}", "short", 0) for i in (3, 1, 2)]
    index, cursor = LoadIndex(LAYOUT, copy.deepcopy(loads)), RoundRobinCursor()
    chosen = [route("short", index, LAYOUT, cursor=cursor).instance_id for _ in range(4)]
    assert chosen == ["r-1", "r-2", "r-3", "r-1"]  # nothing placed: all stay tied
    scan_cursor = RoundRobinCursor()
    assert chosen == [route("short", loads, LAYOUT, cursor=scan_cursor).instance_id
                      for _ in range(4)]


def test_a_load_change_moves_the_instance_and_a_full_one_is_not_chosen() -> None:
    index = LoadIndex(LAYOUT, [load("a", "short", 0), load("b", "short", 1)])
    assert index.least_load("short") == 0 and list(index.ids_at("short", 0)) == ["a"]
    assert index.add_load("a", 2)  # a: 2, b: 1
    assert route("short", index, LAYOUT, enable_fallback=False).instance_id == "b"
    index.add_load("b", 2)  # b: 3 = the cap: not eligible
    assert list(index.ids_at("short", 3)) == [] and index.least_load("short") == 2
    index.add_load("a", 1)  # both full
    assert index.least_load("short") is None
    assert route("short", index, LAYOUT, enable_fallback=False) is None
    index.add_load("b", -1)  # a slot given back: b is eligible again
    assert route("short", index, LAYOUT, enable_fallback=False).instance_id == "b"
    assert index.get("b").active_trajectories == 2  # the shared entry changed in place


def test_the_least_group_emptying_finds_the_next_least_whatever_the_gap() -> None:
    index = LoadIndex(LAYOUT, [load("a", "long", -2), load("b", "long", 3)])
    assert index.least_load("long") == -2  # a reservation that went below zero
    index.add_load("a", 4)  # -2 -> 2: the group below is gone, the next is not load + 1
    assert index.least_load("long") == 2
    index.add_load("a", 1)
    assert index.least_load("long") == 3 and list(index.ids_at("long", 3)) == ["a", "b"]


def test_dead_gone_and_unknown_instances_are_never_chosen() -> None:
    loads = [load("dead", "short", 0, live=False), load("odd", "other-bucket", 0),
             load("live", "short", 2)]
    index = LoadIndex(LAYOUT, loads)
    assert route_any(index, LAYOUT).instance_id == "live"
    assert live_gpu_shares(LAYOUT, index) == {"short": 1}
    # A new snapshot without "live" (its lease expired): a new index, nothing of it left.
    index = LoadIndex(LAYOUT, loads[:2])
    assert route_any(index, LAYOUT) is None and index.get("live") is None
    assert index.add_load("live", 1) is False  # a change for an instance it lacks
    assert list(index) == loads[:2] and len(index) == 2 and index[1] is loads[1]
    assert index.ids == {"dead", "odd"}


def test_idle_instances_are_the_live_ones_holding_nothing_whatever_their_bucket() -> None:
    index = LoadIndex(LAYOUT, [load("b", "short", 0), load("a", "other-bucket", 0),
                               load("c", "long", 1), load("d", "mid", 0, live=False)])
    assert idle_while_queued(index, 5) == ("a", "b") and idle_while_queued(index, 0) == ()
    index.add_load("b", 1)
    index.add_load("a", 2)  # unroutable, yet its load is followed
    index.add_load("c", -1)
    assert idle_while_queued(index, 5) == ("c",)


def test_an_index_built_for_other_caps_is_scanned() -> None:
    other = BucketLayout([t.Bucket("short", 1_000, max_trajectories_per_instance=1)])
    index = LoadIndex(other, [load("a", "short", 1), load("b", "short", 2)])
    # Under LAYOUT's cap of 3 both have room; the index (cap 1) would say none has.
    assert route("short", index, LAYOUT, enable_fallback=False).instance_id == "a"


def _route_all(instances, cursors: dict[str, RoundRobinCursor], rng: random.Random):
    bucket = rng.choice(["short", "mid", "long"])
    queue_length = rng.randint(0, 4)
    return (route(bucket, instances, LAYOUT, cursor=cursors["route"]),
            route(bucket, instances, LAYOUT, cursor=cursors["route"], enable_fallback=False),
            route_any(instances, LAYOUT, cursor=cursors["any"]),
            route_with_queue_length(bucket, instances, LAYOUT, queue_length,
                                    cursor=cursors["queue"]),
            route_by_load(instances, LAYOUT, cursor=cursors["load"]))


def test_routing_by_index_equals_routing_by_scan_through_load_changes() -> None:
    rng = random.Random(23)
    for trial in range(150):
        loads = [load(f"r-{i:02d}", rng.choice(["short", "mid", "long", "gone"]),
                      rng.randint(0, 5), live=rng.random() > 0.15)
                 for i in rng.sample(range(40), rng.randint(0, 25))]
        scanned, index = loads, LoadIndex(LAYOUT, copy.deepcopy(loads))
        by_id = {inst.instance_id: inst for inst in scanned}
        scan_cursors = {k: RoundRobinCursor() for k in ("route", "any", "queue", "load")}
        index_cursors = {k: RoundRobinCursor() for k in ("route", "any", "queue", "load")}
        for step in range(40):
            seed = rng.random()
            expected = _route_all(scanned, scan_cursors, random.Random(seed))
            assert _route_all(index, index_cursors, random.Random(seed)) == expected, (
                trial, step)
            assert live_gpu_shares(LAYOUT, index) == live_gpu_shares(LAYOUT, scanned)
            assert idle_while_queued(index, 1) == idle_while_queued(scanned, 1)
            # Place on what route_by_load chose, or give a slot back somewhere.
            placed = expected[-1]
            if placed is not None and rng.random() < 0.7:
                target, delta = placed.instance_id, 1
            elif scanned:
                target, delta = rng.choice(scanned).instance_id, rng.choice([-1, 1])
            else:
                continue
            by_id[target].active_trajectories += delta
            assert index.add_load(target, delta)
