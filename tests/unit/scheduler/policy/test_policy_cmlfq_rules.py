"""Libra's C-MLFQ rules (issue 20 item 5): reachable buckets, entry, disagreement,
queue length, minimum visits, and the idle-while-queued check."""

import math

import pytest
from policy_builders import (
    FAIL,
    OK,
    inst,
    make_cmlfq,
    make_layout,
    make_traj,
    one_per_bucket,
    teach,
)

from libra.types import TrajectoryId
from scheduling.policy import Action, CmlfqConfig, Reason, RouteKind
from scheduling.policy.layout import bucket_index_for_length
from scheduling.policy.routing import route_by_load, route_with_queue_length
from scheduling.policy.thresholds import (
    idle_while_queued,
    live_gpu_shares,
    live_thresholds,
)

T1 = TrajectoryId("t1")
STATIC = {"live_thresholds": False}  # keep the layout's 1,000 / 5,000 numbers in a test


# Thresholds from the live layout.


def test_live_buckets_weigh_by_gpus_and_dead_buckets_drop_out() -> None:
    layout = make_layout()  # short TP1, medium TP2, long TP4
    loads = [inst("s0", "short"), inst("s1", "short"), inst("m0", "medium"), inst("l0", "long")]
    assert live_gpu_shares(layout, loads) == {"short": 2, "medium": 2, "long": 4}
    loads[-1] = inst("l0", "long", is_live=False)
    assert live_gpu_shares(layout, loads) == {"short": 2, "medium": 2}


def test_without_evidence_the_layout_max_tokens_apply_and_the_longest_is_unbounded() -> None:
    layout = make_layout()
    names, bounds = live_thresholds(layout, {"short": 1, "medium": 2, "long": 4}, [5.0], 10)
    assert names == ("short", "medium", "long") and bounds == (1_000.0, 5_000.0, math.inf)
    # A dead long bucket: medium is now the longest live bucket, unbounded above.
    names, bounds = live_thresholds(layout, {"short": 1, "medium": 2}, [], 10)
    assert names == ("short", "medium") and bounds == (1_000.0, math.inf)


def test_evidence_splits_tokens_by_gpu_share_hand_computed() -> None:
    # 10 x 100 + 3 x 1,000 = 4,000 tokens; shares 1:1:2 -> cumulative 25% and 50%:
    # the ten 100s hold exactly 1,000 tokens (25%); with one 1,000 they hold 2,000 (50%).
    lengths = [100.0] * 10 + [1_000.0] * 3
    _, bounds = live_thresholds(make_layout(), {"short": 1, "medium": 1, "long": 2}, lengths, 5)
    assert bounds == (100.0, 1_000.0, math.inf)


def test_every_live_bucket_is_reachable_even_above_the_workload() -> None:
    # The sim's case: a TP8 bucket whose layout range starts above every length.
    from libra.types import Bucket
    from scheduling.policy import BucketLayout

    layout = BucketLayout(
        [
            Bucket(f"tp{tp}", m, tp, 256, 32 * tp)
            for tp, m in ((1, 4_000), (2, 12_000), (4, 30_000), (8, 40_960))
        ]
    )
    lengths = [float(x) for x in range(500, 30_001, 500)]
    _, bounds = live_thresholds(layout, {"tp1": 4, "tp2": 4, "tp4": 4, "tp8": 8}, lengths, 10)
    hit = {bucket_index_for_length(bounds, x) for x in lengths}
    assert hit == {0, 1, 2, 3}
    assert bounds[-2] < 30_000 and bounds[-1] == math.inf


def test_equal_lengths_still_give_strictly_increasing_thresholds() -> None:
    _, bounds = live_thresholds(make_layout(), {"short": 1, "medium": 1, "long": 1}, [7.0] * 20, 5)
    assert bounds[0] < bounds[1] < bounds[2]


def test_policy_maps_a_length_beyond_every_threshold_to_the_longest_bucket() -> None:
    policy, _ = make_cmlfq(libra_rules=True, min_node_visits=1, **STATIC)
    teach(policy, "p1", FAIL, 1_000_000, times=1)
    node = policy.evidence("p1", [FAIL.key])
    assert node is not None and policy.bucket_for_node(node) == "long"


# Entry.


def test_entry_without_evidence_goes_by_load_per_device() -> None:
    policy, _ = make_cmlfq(libra_rules=True)
    # Per device: short 1/1, medium 1/2, long 3/4 -> medium.
    placement = policy.begin(make_traj(), one_per_bucket(short=1, medium=1, long=3))
    assert (placement.bucket, placement.reason) == ("medium", Reason.LEAST_LOADED)


def test_entry_on_an_idle_cluster_fills_the_shortest_bucket_first() -> None:
    policy, _ = make_cmlfq(libra_rules=True)
    assert policy.begin(make_traj(), one_per_bucket()).bucket == "short"


def test_entry_with_evidence_follows_the_prediction() -> None:
    policy, _ = make_cmlfq(libra_rules=True, **STATIC)
    teach(policy, "p1", FAIL, 15_000, times=10)  # the p1 root: total 15,010 -> long
    placement = policy.begin(make_traj("t1", "p1"), one_per_bucket())
    assert (placement.bucket, placement.reason) == ("long", Reason.PREDICTED)


def test_entry_past_the_queue_length_goes_by_load() -> None:
    policy, _ = make_cmlfq(libra_rules=True, **STATIC)
    teach(policy, "p1", FAIL, 15_000, times=10)
    placement = policy.begin(make_traj("t1", "p1"), one_per_bucket(short=1, medium=0, long=3))
    assert (placement.bucket, placement.reason, placement.route_kind) == (
        "medium",
        Reason.LEAST_LOADED,
        RouteKind.FALLBACK,
    )
    # The reference's switch-off: queue length 0 keeps only the hard cap.
    policy0, _ = make_cmlfq(libra_rules=True, max_queue_length=0, **STATIC)
    teach(policy0, "p1", FAIL, 15_000, times=10)
    assert policy0.begin(make_traj("t1", "p1"), one_per_bucket(long=3)).bucket == "long"


def test_queue_length_and_by_load_routing() -> None:
    layout = make_layout(cap=100)
    loads = [inst("l0", "long", 3), inst("l1", "long", 2)]
    assert route_with_queue_length("long", loads, layout, 3).instance_id == "l1"
    assert route_with_queue_length("long", [inst("l0", "long", 3)], layout, 3) is None
    assert route_with_queue_length("long", [inst("l0", "long", 3)], layout, 0) is not None
    assert route_by_load([inst("s0", "short", 1, is_live=False)], layout) is None


# Minimum visits.


def test_a_node_below_the_minimum_visits_is_no_evidence() -> None:
    policy, _ = make_cmlfq(libra_rules=True, **STATIC)
    teach(policy, "p1", FAIL, 15_000, times=9)
    assert policy.begin(make_traj("t1", "p1"), one_per_bucket()).reason == Reason.LEAST_LOADED
    assert policy.on_tool_return(T1, FAIL, 50, one_per_bucket()).reason == Reason.UNSEEN
    teach(policy, "p1", FAIL, 15_000, times=1)
    assert policy.on_tool_return(T1, FAIL, 60, one_per_bucket()).to_bucket == "long"


def test_the_deeper_node_with_enough_visits_wins_prompt_first_on_a_tie() -> None:
    policy, _ = make_cmlfq(libra_rules=True, **STATIC)
    teach(policy, "other", FAIL, 15_000, times=10)  # global FAIL node: 10 visits
    teach(policy, "p1", OK, 100, times=10)  # p1 has a root (10 visits) but no FAIL child
    node = policy.evidence("p1", [FAIL.key])
    assert node is not None and node.depth == 1 and node.mean_tokens == 15_000
    node = policy.evidence("p1", [OK.key])  # both roots have the OK node: p1's (the same here)
    assert node is not None and node.mean_tokens == 100


# Mean / P90 disagreement.


def _disagreeing(policy) -> None:
    teach(policy, "p1", FAIL, 1_500, times=8)  # mean 3,200 -> medium
    teach(policy, "p1", FAIL, 10_000, times=2)  # P90 10,000 -> long


def test_disagreement_moves_a_trajectory_below_the_span_to_its_near_end() -> None:
    policy, _ = make_cmlfq(libra_rules=True, max_queue_length=0, **STATIC)
    _disagreeing(policy)
    assert policy.begin(make_traj("t1", "p1"), [inst("s0", "short")]).bucket == "short"
    decision = policy.on_tool_return(T1, FAIL, 50, one_per_bucket(short=1))
    assert (decision.action, decision.reason, decision.to_bucket) == (
        Action.MOVE,
        Reason.DISAGREE_CLAMP,
        "medium",
    )


def test_disagreement_keeps_a_trajectory_inside_the_span() -> None:
    policy, _ = make_cmlfq(libra_rules=True, **STATIC)
    _disagreeing(policy)
    policy.begin(make_traj("t1", "p1"), [inst("l0", "long")])
    decision = policy.on_tool_return(T1, FAIL, 50, one_per_bucket(long=1))
    assert (decision.action, decision.reason) == (Action.STAY, Reason.DISAGREE)


def test_disagreement_moves_a_trajectory_above_the_span_down_to_its_near_end() -> None:
    policy, _ = make_cmlfq(libra_rules=True, **STATIC)
    teach(policy, "p1", OK, 100, times=8)  # mean 680 -> short
    teach(policy, "p1", OK, 3_000, times=2)  # P90 3,000 -> medium
    policy.begin(make_traj("t1", "p1"), [inst("l0", "long")])
    decision = policy.on_tool_return(T1, OK, 50, one_per_bucket(long=1))
    assert (decision.action, decision.reason, decision.to_bucket) == (
        Action.MOVE,
        Reason.DISAGREE_CLAMP,
        "medium",
    )


def test_with_one_live_bucket_every_span_is_that_bucket() -> None:
    policy, _ = make_cmlfq(libra_rules=True)  # live thresholds
    _disagreeing(policy)
    node = policy.evidence("p1", [FAIL.key])
    assert node is not None and policy.bucket_span(node) == ("medium", "medium")
    policy.begin(make_traj("t1", "p1"), [inst("l0", "long")])  # only the long bucket lives
    assert policy.bucket_span(node) == ("long", "long")
    decision = policy.on_tool_return(T1, FAIL, 50, [inst("l0", "long")])
    assert (decision.action, decision.reason) == (Action.STAY, Reason.ALREADY_IN_TARGET)


def test_reference_disagreement_rule_stays() -> None:
    policy, _ = make_cmlfq(libra_rules=True, disagree_rule="stay", **STATIC)
    _disagreeing(policy)
    policy.begin(make_traj("t1", "p1"), [inst("s0", "short")])
    decision = policy.on_tool_return(T1, FAIL, 50, one_per_bucket(short=1))
    assert (decision.action, decision.reason) == (Action.STAY, Reason.DISAGREE)


@pytest.mark.parametrize(
    ("knob", "value"), [("entry", "longest"), ("disagree_rule", "p90"), ("max_queue_length", -1)]
)
def test_unknown_rules_are_rejected_naming_the_knob(knob: str, value: object) -> None:
    with pytest.raises(ValueError, match=knob):
        CmlfqConfig(**{knob: value})


# The idle-while-queued check.


def test_idle_instance_is_flagged_only_while_work_waits() -> None:
    loads = [inst("s0", "short", 0), inst("m0", "medium", 2), inst("l0", "long", 0, is_live=False)]
    assert idle_while_queued(loads, 3) == ("s0",)
    assert idle_while_queued(loads, 0) == ()
