"""Honest bounds and metrics: the step-chain bound and steady-state throughput (issue 20 item 2)."""

from __future__ import annotations

import pytest

from sim import bounds, presets
from sim.run import run, steady_throughput
from sim.systems import system
from sim.trace import ToolCall, TraceTrajectory, Turn

CLUSTER = presets.cluster("a800x16")


# The chain on hand-computed numbers: longest 10 s per step, training 5 s per step.


@pytest.mark.parametrize(
    ("staleness", "expected_s"),
    [
        # Sync: each step waits for the previous training: 3 x (10 + 5).
        (0, 45.0),
        # Step 2 is released when training step 0 ends (15 s): 15 + 10 + 5.
        (1, 30.0),
        # Every step released at 0: the trainer is the chain: 10 + 3 x 5.
        (4, 25.0),
    ],
)
def test_step_chain_on_hand_computed_steps(staleness: int, expected_s: float) -> None:
    got = bounds.step_chain_bound_s([10.0, 10.0, 10.0], [5.0, 5.0, 5.0], staleness)
    assert got == pytest.approx(expected_s)


def test_step_chain_waits_for_the_slow_step_and_the_trainer() -> None:
    # Step 1 is long (50 s): step 2 (staleness 1) is released at 15 s, rolls out by 25 s,
    # but trains only after step 1's training ends at 55 s: 55 + 5.
    assert bounds.step_chain_bound_s([10.0, 50.0, 10.0], [5.0, 5.0, 5.0], 1) == pytest.approx(60.0)


def test_step_chain_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="staleness"):
        bounds.step_chain_bound_s([1.0], [1.0], -1)
    with pytest.raises(ValueError, match="one entry per step"):
        bounds.step_chain_bound_s([1.0, 2.0], [1.0], 0)


def _tool_bound_trace(steps: int, tool_s: float) -> list[TraceTrajectory]:
    """One tiny trajectory per step whose time is its tool latency."""
    tool = ToolCall("x", 10, "success", tool_s)
    return [
        TraceTrajectory(f"t{s}", "p", f"{s}:p", s, 10, (Turn(5, tool), Turn(5)))
        for s in range(steps)
    ]


def test_lower_bound_is_the_chain_when_tools_dominate() -> None:
    tr = _tool_bound_trace(3, 100.0)
    sync = bounds.lower_bound_s(CLUSTER, tr, staleness=0)
    loose = bounds.lower_bound_s(CLUSTER, tr, staleness=4)
    one = sync["critical_path_s"]
    assert 100.0 < one < 101.0
    # Sync: three whole steps in a row; the work bound is tiny.
    assert sync["step_chain_bound_s"] == pytest.approx(3 * one, rel=1e-3)
    assert sync["lower_bound_s"] == sync["step_chain_bound_s"] > sync["work_bound_s"]
    # Staleness 4: all three roll out at once; the chain is one trajectory plus training.
    assert one < loose["step_chain_bound_s"] < one + 1.0


def test_both_bounds_hold_on_a_simulated_run() -> None:
    tr = _tool_bound_trace(3, 100.0)
    res = run(CLUSTER, tr, system("sync-lb"))
    terms = res["bound_terms"]
    assert res["lower_bound_s"] == max(
        terms["work_bound_s"], terms["step_chain_bound_s"], terms["throughput_chain_bound_s"]
    )
    assert res["lower_bound_s"] <= res["makespan_s"]


# Steady-state throughput.


def _log(ends_s: list[float]) -> list[dict]:
    return [{"step": s, "start_s": e - 1.0, "train_s": 1.0} for s, e in enumerate(ends_s)]


def test_steady_throughput_excludes_fill_and_drain() -> None:
    tr = [
        TraceTrajectory(f"t{s}{i}", "p", "g", s, 1, (Turn(1),)) for s in range(6) for i in range(4)
    ]
    # Depth 2: steps 0-1 fill, 4-5 drain; steps 2-3 (8 trajectories) trained between
    # the end of step 1 (20 s) and the end of step 3 (60 s).
    ends = [10.0, 20.0, 40.0, 60.0, 61.0, 62.0]
    assert steady_throughput(_log(ends), tr, 2) == pytest.approx(8 / 40.0)
    # Depth 1: steps 1-4 between 10 s and 61 s.
    assert steady_throughput(_log(ends), tr, 1) == pytest.approx(16 / 51.0)


def test_steady_throughput_is_none_without_a_steady_step() -> None:
    tr = [TraceTrajectory(f"t{s}", "p", "g", s, 1, (Turn(1),)) for s in range(4)]
    assert steady_throughput(_log([1.0, 2.0, 3.0, 4.0]), tr, 2) is None


def _mixed_lengths_trace() -> list[TraceTrajectory]:
    """Prefill-heavy and decode-heavy trajectories of very different lengths."""
    long_prompt = [TraceTrajectory(f"p{i}", "p", f"0:p{i}", 0, 8000, (Turn(16),))
                   for i in range(4)]
    long_decode = [TraceTrajectory(f"d{i}", "p", f"0:d{i}", 0, 16, (Turn(4000),))
                   for i in range(4)]
    return long_prompt + long_decode


def test_the_work_bound_charges_no_more_than_any_batching_of_the_trace() -> None:
    """Training: the simulator charges a batch's attention on its mean length, so no
    partition of the trace into batches costs less than the whole trace as one batch
    (the work bound's term); each trajectory charged on its own length would cost more
    than some partitions do, and the bound would not be one."""
    tr = _mixed_lengths_trace()
    whole_s = bounds.train_work_gpu_s(CLUSTER, tr)
    for size in (1, 2, 4):
        batches = [tr[i:i + size] for i in range(0, len(tr), size)]
        charged_s = sum(bounds._batch_train_s(CLUSTER, b) * CLUSTER.num_gpus for b in batches)
        assert whole_s <= charged_s * (1 + 1e-12)
    # Mixed batches (a long and a short one together) are where per-trajectory
    # charging overshoots: the pairs below cost less than the sum of squares.
    pairs = [[tr[i], tr[i + 4]] for i in range(4)]
    paired_s = sum(bounds._batch_train_s(CLUSTER, b) * CLUSTER.num_gpus for b in pairs)
    assert whole_s <= paired_s


def test_the_work_bound_sums_memory_and_flops_per_set() -> None:
    """Generation: ``max(sum of memory time, sum of FLOP time)``, never the sum of
    each trajectory's larger term (prefill-heavy and decode-heavy work share steps)."""
    tr = _mixed_lengths_trace()
    costs = [bounds.rollout_cost_s(CLUSTER, t) for t in tr]
    per_set = max(sum(c[0] for c in costs), sum(c[1] for c in costs))
    per_trajectory = sum(max(c) for c in costs)
    assert per_set < per_trajectory  # the trace is built so the two differ
    got = bounds.lower_bound_s(CLUSTER, tr)["work_bound_s"]
    want = (per_set + bounds.train_work_gpu_s(CLUSTER, tr)) / CLUSTER.num_gpus
    assert got == pytest.approx(want, rel=1e-12)
