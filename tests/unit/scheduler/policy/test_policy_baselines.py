"""Baselines least_loaded, length_aware and toolcount."""

import pytest
from policy_builders import FAIL, OK, inst, make_layout, make_traj, one_per_bucket

from libra.types import TrajectoryId
from scheduling.policy import (
    Action,
    InMemoryPolicyStore,
    LeastLoadedPolicy,
    LengthAwareConfig,
    LengthAwarePolicy,
    Reason,
    ToolcountPolicy,
    UnknownTrajectory,
)

T1 = TrajectoryId("t1")


def make_least_loaded(cap: int = 100) -> LeastLoadedPolicy:
    return LeastLoadedPolicy(make_layout(cap), InMemoryPolicyStore(copy_values=True))


def make_length_aware(**config: object) -> LengthAwarePolicy:
    return LengthAwarePolicy(
        make_layout(100), InMemoryPolicyStore(copy_values=True), LengthAwareConfig(**config)
    )  # type: ignore[arg-type]


def test_least_loaded_ignores_length() -> None:
    placement = make_least_loaded().begin(
        make_traj(input_tokens=50_000), one_per_bucket(short=0, medium=1, long=1)
    )
    assert (placement.instance_id, placement.reason) == ("s0", Reason.LEAST_LOADED)


def test_least_loaded_round_robins_ties_across_buckets() -> None:
    policy = make_least_loaded()
    picks = [policy.begin(make_traj(f"t{i}"), one_per_bucket()).instance_id for i in range(4)]
    assert picks == ["l0", "m0", "s0", "l0"]


def test_least_loaded_never_moves() -> None:
    policy = make_least_loaded()
    policy.begin(make_traj(), one_per_bucket())
    decision = policy.on_tool_return(T1, FAIL, 30_000, one_per_bucket())
    assert (decision.action, decision.reason, decision.load_deltas) == (
        Action.STAY,
        Reason.STAY,
        (),
    )


def test_least_loaded_respects_cap() -> None:
    placement = make_least_loaded(cap=1).begin(
        make_traj(), one_per_bucket(short=1, medium=1, long=1)
    )
    assert placement.reason == Reason.NO_CAPACITY


def test_length_aware_places_by_input_length() -> None:
    policy = make_length_aware()
    buckets = [
        policy.begin(make_traj(f"t{n}", input_tokens=n), one_per_bucket()).bucket
        for n in (500, 3_000, 9_000)
    ]
    assert buckets == ["short", "medium", "long"]


def test_length_aware_reroutes_by_accumulated_context() -> None:
    policy = make_length_aware()
    policy.begin(make_traj(input_tokens=500), one_per_bucket())
    assert policy.on_tool_return(T1, OK, 300, one_per_bucket()).reason == Reason.ALREADY_IN_TARGET
    decision = policy.on_tool_return(T1, OK, 2_000, one_per_bucket())
    assert (decision.action, decision.reason, decision.to_bucket) == (
        Action.MOVE,
        Reason.CONTEXT_LENGTH,
        "medium",
    )


def test_length_aware_without_reroute_stays() -> None:
    policy = make_length_aware(reroute_on_tool_return=False)
    policy.begin(make_traj(input_tokens=500), one_per_bucket())
    assert policy.on_tool_return(T1, OK, 9_000, one_per_bucket()).action == Action.STAY


def test_length_aware_custom_thresholds() -> None:
    policy = make_length_aware(thresholds_tokens=(10, 20, 30))
    assert policy.begin(make_traj(input_tokens=15), one_per_bucket()).bucket == "medium"


def test_length_aware_thresholds_out_of_order_raise() -> None:
    with pytest.raises(ValueError, match="thresholds_tokens.*strictly increasing"):
        LengthAwareConfig(thresholds_tokens=(10, 10, 30))


def test_length_aware_thresholds_wrong_count_raise() -> None:
    with pytest.raises(ValueError, match="3 entries"):
        make_length_aware(thresholds_tokens=(10, 20))


def test_length_aware_falls_back_when_bucket_dead() -> None:
    policy = make_length_aware()
    instances = [inst("s0", "short"), inst("m0", "medium"), inst("l0", "long", is_live=False)]
    placement = policy.begin(make_traj(input_tokens=9_000), instances)
    assert (placement.bucket, placement.target_bucket) == ("medium", "long")


def test_toolcount_priority_counts_completed_tool_calls() -> None:
    policy = ToolcountPolicy(make_layout(100), InMemoryPolicyStore(copy_values=True))
    policy.begin(make_traj(), one_per_bucket())
    assert policy.priority(T1) == 0
    policy.on_tool_return(T1, OK, 10, one_per_bucket())
    policy.on_tool_return(T1, FAIL, 20, one_per_bucket())
    assert policy.priority(T1) == 2


def test_toolcount_priority_of_unknown_trajectory_is_zero() -> None:
    policy = ToolcountPolicy(make_layout(100), InMemoryPolicyStore())
    assert policy.priority(TrajectoryId("never")) == 0


def test_toolcount_places_least_loaded_and_never_moves() -> None:
    policy = ToolcountPolicy(make_layout(100), InMemoryPolicyStore())
    assert policy.begin(make_traj(), one_per_bucket(short=2, medium=0, long=1)).instance_id == "m0"
    assert policy.on_tool_return(T1, FAIL, 50_000, one_per_bucket()).action == Action.STAY


def test_baseline_tool_return_for_unknown_trajectory_raises() -> None:
    with pytest.raises(UnknownTrajectory):
        make_length_aware().on_tool_return(T1, OK, 1, one_per_bucket())
