"""la_mlfq: input-length rule, scouts, history table, demotion."""

from policy_builders import FAIL, make_layout, make_traj, one_per_bucket

from libra.clock import FakeClock
from libra.types import TrajectoryId
from scheduling.policy import (
    Action,
    InMemoryPolicyStore,
    LaMlfqConfig,
    LaMlfqPolicy,
    Reason,
)


def make_la_mlfq(clock: FakeClock | None = None, **config: object) -> LaMlfqPolicy:
    return LaMlfqPolicy(
        make_layout(100),
        InMemoryPolicyStore(copy_values=True),
        LaMlfqConfig(**config),
        clock or FakeClock(),  # type: ignore[arg-type]
    )


def test_ungrouped_routes_by_input_length_short_or_longest() -> None:
    policy = make_la_mlfq()
    short = policy.begin(make_traj("a", input_tokens=900), one_per_bucket())
    long = policy.begin(make_traj("b", input_tokens=3_000), one_per_bucket())
    assert (short.bucket, long.bucket, long.reason) == ("short", "long", Reason.INPUT_LENGTH)


def test_first_group_sample_is_scout_in_short_bucket() -> None:
    placement = make_la_mlfq().begin(
        make_traj("a", group_id="g", input_tokens=9_000), one_per_bucket()
    )
    assert (placement.bucket, placement.reason) == ("short", Reason.SCOUT)


def test_sibling_waits_while_scout_runs() -> None:
    policy = make_la_mlfq()
    policy.begin(make_traj("a", group_id="g"), one_per_bucket())
    placement = policy.begin(make_traj("b", group_id="g"), one_per_bucket())
    assert (placement.is_placed, placement.reason) == (False, Reason.WAIT_FOR_SCOUT)


def test_sibling_follows_scout_final_bucket() -> None:
    policy = make_la_mlfq()
    policy.begin(make_traj("a", prompt_id="p", group_id="g"), one_per_bucket())
    policy.finish(TrajectoryId("a"), 12_000)
    # A different prompt id keeps the history table out of the way.
    placement = policy.begin(make_traj("b", prompt_id="p2", group_id="g"), one_per_bucket())
    assert (placement.bucket, placement.reason) == ("long", Reason.FOLLOW_SCOUT)


def test_sibling_after_scout_timeout_uses_input_length() -> None:
    clock = FakeClock()
    policy = make_la_mlfq(clock, scout_timeout_s=30.0)
    policy.begin(make_traj("a", group_id="g"), one_per_bucket())
    clock.advance(31.0)
    placement = policy.begin(make_traj("b", group_id="g", input_tokens=3_000), one_per_bucket())
    assert (placement.bucket, placement.reason) == ("long", Reason.INPUT_LENGTH)


def test_aborted_scout_lets_next_sibling_scout() -> None:
    policy = make_la_mlfq()
    policy.begin(make_traj("a", group_id="g"), one_per_bucket())
    policy.abort(TrajectoryId("a"))
    assert policy.begin(make_traj("b", group_id="g"), one_per_bucket()).reason == Reason.SCOUT


def test_history_table_routes_prompt_to_last_final_bucket() -> None:
    policy = make_la_mlfq()
    policy.begin(make_traj("a", prompt_id="p", input_tokens=10), one_per_bucket())
    policy.finish(TrajectoryId("a"), 3_000)
    placement = policy.begin(make_traj("b", prompt_id="p", input_tokens=10), one_per_bucket())
    assert (placement.bucket, placement.reason) == ("medium", Reason.HISTORY)


def test_history_expires_after_ttl_steps() -> None:
    policy = make_la_mlfq(history_ttl_steps=2)
    policy.begin(make_traj("a", prompt_id="p", input_tokens=10), one_per_bucket())
    policy.finish(TrajectoryId("a"), 3_000)
    policy.on_step_end(3)
    placement = policy.begin(make_traj("b", prompt_id="p", input_tokens=10), one_per_bucket())
    assert (placement.bucket, placement.reason) == ("short", Reason.INPUT_LENGTH)


def test_demotion_off_by_default() -> None:
    policy = make_la_mlfq()
    policy.begin(make_traj("a"), one_per_bucket())
    assert (
        policy.on_tool_return(TrajectoryId("a"), FAIL, 5_000, one_per_bucket()).action
        == Action.STAY
    )


def test_demotion_moves_to_longest_once_generated_exceeds_bucket() -> None:
    policy = make_la_mlfq(enable_demotion=True)
    policy.begin(make_traj("a", group_id="g"), one_per_bucket())
    decision = policy.on_tool_return(TrajectoryId("a"), FAIL, 1_500, one_per_bucket())
    assert (decision.action, decision.reason, decision.to_bucket) == (
        Action.MOVE,
        Reason.DEMOTION,
        "long",
    )
    assert (
        policy.begin(make_traj("b", group_id="g"), one_per_bucket()).reason == Reason.FOLLOW_SCOUT
    )
