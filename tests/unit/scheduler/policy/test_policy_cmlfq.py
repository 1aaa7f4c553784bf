"""C-MLFQ: entry level, the mean/P90 rule, moves both ways, fallback, learning, rebuild."""

import pytest
from policy_builders import (
    FAIL,
    OK,
    inst,
    make_cmlfq,
    make_layout,
    make_traj,
    one_per_bucket,
    run_trajectory,
    teach,
)

from libra.types import TrajectoryId
from scheduling.policy import (
    Action,
    CmlfqConfig,
    CmlfqPolicy,
    DuplicateTrajectory,
    InMemoryPolicyStore,
    Reason,
    RouteKind,
    UnknownTrajectory,
)

T1 = TrajectoryId("t1")


def begin_t1(policy: CmlfqPolicy, prompt_id: str = "p1", instances: list | None = None) -> None:
    assert policy.begin(make_traj("t1", prompt_id), instances or one_per_bucket()).is_placed


def test_new_trajectory_enters_shortest_bucket_even_with_long_input() -> None:
    policy, _ = make_cmlfq()
    placement = policy.begin(make_traj(input_tokens=50_000), one_per_bucket())
    assert (placement.bucket, placement.instance_id, placement.reason) == (
        "short",
        "s0",
        Reason.SHORTEST_BUCKET,
    )
    assert placement.load_deltas == (("s0", 1),)


def test_begin_with_no_capacity_is_unplaced_and_keeps_no_state() -> None:
    policy, store = make_cmlfq(layout=make_layout(cap=1))
    placement = policy.begin(make_traj(), one_per_bucket(short=1, medium=1, long=1))
    assert (placement.is_placed, placement.reason, placement.load_deltas) == (
        False,
        Reason.NO_CAPACITY,
        (),
    )
    assert store.num_trajectories == 0


def test_begin_twice_raises_duplicate() -> None:
    policy, _ = make_cmlfq()
    begin_t1(policy)
    with pytest.raises(DuplicateTrajectory):
        begin_t1(policy)


def test_empty_tree_stays_unseen() -> None:
    policy, _ = make_cmlfq()
    begin_t1(policy)
    decision = policy.on_tool_return(T1, FAIL, 50, one_per_bucket())
    assert (decision.action, decision.reason) == (Action.STAY, Reason.UNSEEN)


def test_agreeing_long_evidence_moves_down_with_load_deltas() -> None:
    policy, _ = make_cmlfq()
    teach(policy, "p1", FAIL, 15_000)
    begin_t1(policy)
    decision = policy.on_tool_return(T1, FAIL, 50, one_per_bucket())
    assert (decision.action, decision.reason, decision.to_bucket) == (
        Action.MOVE,
        Reason.MOVE,
        "long",
    )
    assert decision.load_deltas == (("s0", -1), ("l0", 1))


def test_unseen_prompt_uses_global_root_evidence() -> None:
    policy, _ = make_cmlfq()
    teach(policy, "other-prompt", FAIL, 15_000)
    begin_t1(policy, prompt_id="brand-new")
    assert policy.on_tool_return(T1, FAIL, 50, one_per_bucket()).to_bucket == "long"


def test_prompt_own_root_wins_over_global_root() -> None:
    policy, _ = make_cmlfq()
    teach(policy, "other-prompt", FAIL, 15_000, times=5)
    teach(policy, "p1", FAIL, 200)
    begin_t1(policy, prompt_id="p1")
    assert policy.on_tool_return(T1, FAIL, 50, one_per_bucket()).reason == Reason.ALREADY_IN_TARGET


def test_mean_p90_disagreement_stays() -> None:
    policy, _ = make_cmlfq()
    teach(policy, "p1", FAIL, 1_500, times=8)  # mean 3,200 -> medium
    teach(policy, "p1", FAIL, 10_000, times=2)  # P90 10,000 -> long
    begin_t1(policy)
    decision = policy.on_tool_return(T1, FAIL, 50, one_per_bucket())
    assert (decision.action, decision.reason, decision.target_bucket) == (
        Action.STAY,
        Reason.DISAGREE,
        None,
    )


def test_up_move_after_down_move() -> None:
    policy, _ = make_cmlfq()
    for i in range(3):  # after FAIL then OK, little is left
        run_trajectory(policy, f"u{i}", "p1", [(FAIL, 10), (OK, 20)], 120)
    teach(policy, "p1", FAIL, 15_000, times=20)  # while after FAIL alone, a lot is left
    begin_t1(policy)
    assert policy.on_tool_return(T1, FAIL, 10, one_per_bucket()).to_bucket == "long"
    decision = policy.on_tool_return(T1, OK, 20, one_per_bucket(long=1))
    assert (decision.action, decision.from_bucket, decision.to_bucket) == (
        Action.MOVE,
        "long",
        "short",
    )


def test_already_in_target_stays() -> None:
    policy, _ = make_cmlfq()
    teach(policy, "p1", OK, 100)
    begin_t1(policy)
    decision = policy.on_tool_return(T1, OK, 50, one_per_bucket())
    assert (decision.action, decision.reason, decision.target_bucket) == (
        Action.STAY,
        Reason.ALREADY_IN_TARGET,
        "short",
    )


def test_move_to_bucket_without_live_instance_falls_back_to_nearest() -> None:
    policy, _ = make_cmlfq()
    teach(policy, "p1", FAIL, 15_000)
    instances = [inst("s0", "short"), inst("m0", "medium"), inst("l0", "long", is_live=False)]
    begin_t1(policy, instances=instances)
    decision = policy.on_tool_return(T1, FAIL, 50, instances)
    assert (decision.action, decision.reason, decision.to_bucket, decision.target_bucket) == (
        Action.MOVE,
        Reason.NO_INSTANCE_FALLBACK,
        "medium",
        "long",
    )


def test_fallback_landing_in_current_bucket_stays_put() -> None:
    policy, _ = make_cmlfq()
    teach(policy, "p1", FAIL, 15_000)
    instances = [inst("s0", "short"), inst("s1", "short")]
    begin_t1(policy, instances=instances)
    decision = policy.on_tool_return(T1, FAIL, 50, instances)
    assert (decision.action, decision.reason, decision.to_instance_id) == (
        Action.STAY,
        Reason.NO_INSTANCE_FALLBACK,
        "s0",
    )


def test_no_capacity_anywhere_keeps_trajectory_pinned() -> None:
    policy, store = make_cmlfq(layout=make_layout(cap=1))
    teach(policy, "p1", FAIL, 15_000)
    begin_t1(policy)
    decision = policy.on_tool_return(T1, FAIL, 50, one_per_bucket(short=1, medium=1, long=1))
    assert (decision.action, decision.reason, decision.to_instance_id) == (
        Action.STAY,
        Reason.NO_CAPACITY,
        "s0",
    )
    assert store.get_trajectory("t1") is not None


def test_move_respects_target_cap() -> None:
    policy, _ = make_cmlfq(layout=make_layout(cap=1))
    teach(policy, "p1", FAIL, 15_000)
    instances = [inst("s0", "short"), inst("l0", "long", 1), inst("l1", "long", 0)]
    begin_t1(policy, instances=instances)
    assert policy.on_tool_return(T1, FAIL, 50, instances).to_instance_id == "l1"


def test_stay_does_not_read_loads() -> None:
    policy, _ = make_cmlfq()
    begin_t1(policy)

    def loads_must_not_be_read() -> list:
        raise AssertionError("a stay must not read loads")

    assert policy.on_tool_return(T1, FAIL, 50, loads_must_not_be_read).reason == Reason.UNSEEN


def test_finish_inserts_realised_remaining_lengths() -> None:
    policy, _ = make_cmlfq()
    begin_t1(policy)
    policy.on_tool_return(T1, FAIL, 100, one_per_bucket())
    policy.on_tool_return(T1, OK, 400, one_per_bucket())
    release = policy.finish(T1, 1_000)
    assert release.load_deltas == (("s0", -1),)
    assert policy.tree.lookup("p1", [FAIL.key]).mean_tokens == 900  # type: ignore[union-attr]
    assert policy.tree.lookup("p1", [FAIL.key, OK.key]).mean_tokens == 600  # type: ignore[union-attr]


def test_rebuild_forgets_stale_evidence() -> None:
    policy, _ = make_cmlfq(recent_window_trajectories=3, rebuild_interval_steps=2)
    teach(policy, "p1", FAIL, 15_000, times=3)
    teach(policy, "p1", FAIL, 100, times=3)
    policy.on_step_end(1)  # not a rebuild step: old evidence still averaged in
    assert policy.tree.lookup("p1", [FAIL.key]).visit_count == 6  # type: ignore[union-attr]
    policy.on_step_end(2)
    node = policy.tree.lookup("p1", [FAIL.key])
    assert node is not None and (node.visit_count, node.mean_tokens) == (3, 100)


def test_restore_from_step_end_snapshot_round_trips() -> None:
    policy, store = make_cmlfq()
    teach(policy, "p1", FAIL, 15_000)
    policy.on_step_end(1)
    restored = CmlfqPolicy(make_layout(cap=100), store, CmlfqConfig())
    assert restored.restore() == "snapshot"
    assert restored.tree.to_dict() == policy.tree.to_dict()


def test_restore_without_snapshot_rebuilds_from_ring() -> None:
    policy, store = make_cmlfq()
    teach(policy, "p1", FAIL, 15_000)
    restored = CmlfqPolicy(make_layout(cap=100), store, CmlfqConfig())
    assert restored.restore() == "ring"
    assert restored.tree.lookup("p1", [FAIL.key]).visit_count == 3  # type: ignore[union-attr]


def test_persist_interval_saves_snapshot_on_finish() -> None:
    policy, store = make_cmlfq(tree_persist_interval_finishes=1)
    teach(policy, "p1", FAIL, 100, times=1)
    snapshot = store.load_tree()
    assert snapshot is not None and snapshot.pop("learn_seq") == 1
    assert snapshot == policy.tree.to_dict()


def test_restore_replays_ring_entries_learned_after_the_snapshot() -> None:
    policy, store = make_cmlfq()
    teach(policy, "p1", FAIL, 15_000)
    policy.on_step_end(1)
    teach(policy, "p2", FAIL, 100, times=2)  # after the snapshot: only in the ring
    restored = CmlfqPolicy(make_layout(cap=100), store, CmlfqConfig())
    assert restored.restore() == "snapshot"
    assert restored.tree.to_dict() == policy.tree.to_dict()


def test_tool_return_for_unknown_trajectory_raises() -> None:
    policy, _ = make_cmlfq()
    with pytest.raises(UnknownTrajectory, match="t-missing"):
        policy.on_tool_return(TrajectoryId("t-missing"), FAIL, 1, one_per_bucket())


def test_finish_twice_raises_unknown_trajectory() -> None:
    policy, _ = make_cmlfq()
    begin_t1(policy)
    policy.finish(T1, 10)
    with pytest.raises(KeyError):
        policy.finish(T1, 10)


def test_abort_releases_without_learning() -> None:
    policy, _ = make_cmlfq()
    begin_t1(policy)
    policy.on_tool_return(T1, FAIL, 10, one_per_bucket())
    assert policy.abort(T1).load_deltas == (("s0", -1),)
    assert policy.tree.stats().num_insertions == 0


def test_thresholds_out_of_order_raise() -> None:
    with pytest.raises(ValueError, match="bucket_thresholds_tokens"):
        CmlfqConfig(bucket_thresholds_tokens=(5_000, 1_000, 20_000))


def test_thresholds_with_wrong_count_raise() -> None:
    with pytest.raises(ValueError, match="3 entries"):
        CmlfqPolicy(
            make_layout(), InMemoryPolicyStore(), CmlfqConfig(bucket_thresholds_tokens=(1, 2))
        )


def test_custom_thresholds_change_mapping() -> None:
    policy, _ = make_cmlfq(bucket_thresholds_tokens=(100, 200, 300))
    teach(policy, "p1", FAIL, 250)
    begin_t1(policy)
    assert policy.on_tool_return(T1, FAIL, 50, one_per_bucket()).to_bucket == "long"


def test_stats_count_moves_and_tree_size() -> None:
    policy, _ = make_cmlfq()
    teach(policy, "p1", FAIL, 15_000)
    stats = policy.stats()
    assert stats["tree_insertions"] == 3 and stats["placements_preferred"] == 3
    assert stats["finished"] == 3 and stats["decision_unseen"] == 1


def test_placement_on_fallback_reports_route_kind() -> None:
    policy, _ = make_cmlfq()
    placement = policy.begin(make_traj(), [inst("m0", "medium")])
    assert (placement.bucket, placement.route_kind, placement.target_bucket) == (
        "medium",
        RouteKind.FALLBACK,
        "short",
    )
