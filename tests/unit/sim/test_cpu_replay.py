"""The CPU engine cost fit and the replay of a recorded CPU stack (no services)."""

from __future__ import annotations

import pytest

from libra.types import Bucket
from libra_cli.sim_validation import compare, reload_schedule
from sim.cpu_engine import CpuEngineCosts, fit, fit_report
from sim.cpu_replay import CpuReplay, CpuStack, RecordedTrajectory
from sim.loop_costs import LoopCosts, loop_costs, op_latencies
from sim.trace import ToolCall, TraceTrajectory, Turn

COSTS = CpuEngineCosts(1e-3, 2e-6, 5e-4, 3e-5, 1e-7)


def _call(b: int, length: int, n: int, wall_s: float) -> dict:
    return {"batch": b, "prompt_len": length, "decode_steps": n - 1, "wall_s": wall_s}


def test_fit_recovers_the_coefficients_of_noise_free_engine_calls() -> None:
    calls = [_call(b, length, n, COSTS.call_s([length] * b, [n]))
             for b in (1, 2, 4, 8) for length in (8, 48, 112) for n in (1, 12, 24)]
    got = fit(calls)
    for name in ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_row_s"):
        assert getattr(got, name) == pytest.approx(getattr(COSTS, name), rel=1e-6)


def test_fit_is_non_negative_and_keeps_the_total_time_of_noisy_calls() -> None:
    calls = [_call(8, 9, 5, 0.011), _call(8, 9, 5, 0.089), _call(2, 7, 3, 0.055),
             _call(1, 27, 4, 0.006), _call(6, 22, 7, 0.012)]
    got = fit(calls)
    assert min(got.to_dict().values()) >= 0.0
    report = fit_report(got, calls)
    assert report["fitted_total_s"] == pytest.approx(report["measured_total_s"], rel=1e-6)


def test_call_time_grows_with_batch_context_and_tokens() -> None:
    base = COSTS.call_s([10], [5])
    assert COSTS.call_s([10, 10], [5, 5]) > base
    assert COSTS.call_s([50], [5]) > base
    assert COSTS.call_s([10], [9]) > base
    # The batch decodes until its longest turn ends.
    assert COSTS.call_s([10, 10], [1, 9]) == COSTS.call_s([10, 10], [9, 9])


def _stack(**kw: float) -> CpuStack:
    return CpuStack(
        instances=(("r0", "short"),), buckets=(Bucket("short", 96, 1, 8, 16),),
        policy="least_loaded", max_batch_size=8, max_trajectories=16, costs={"r0": COSTS},
        pass_overhead_s=kw.get("pass_s", 0.001),
        first_load_s={"r0": kw.get("load_s", 0.0)}, reload_s=0.0,
        gil_wait_s=kw.get("gil_s", 0.0), loop=kw.get("loop", {}),
    )


def _traj(i: int, outputs: list[int], tool_s: float = 0.0, at: float = 0.0,
          score_s: float = 0.0) -> RecordedTrajectory:
    turns = tuple(
        Turn(n, ToolCall("calculator", 4, "success", tool_s) if k < len(outputs) - 1 else None)
        for k, n in enumerate(outputs)
    )
    rec = TraceTrajectory(f"t{i}", f"p{i}", f"g{i}", 0, 7, turns)
    return RecordedTrajectory(rec, at, -1.0, score_s)


def test_single_turn_finish_is_first_contact_call_and_scoring() -> None:
    # The measured first contact runs from the instance's first admission.
    got = CpuReplay(_stack(load_s=0.03), [_traj(0, [3], score_s=0.004)]).run()
    assert got == [pytest.approx(0.03 + COSTS.call_s([7], [3]) + 0.004)]


def test_rpc_answer_during_an_engine_call_waits_one_gil_switch_interval() -> None:
    # t1's scoring answers while t0's second turn is in its engine call.
    first = 0.001 + COSTS.call_s([7, 7], [3, 3])
    second = COSTS.call_s([7 + 3 + 4], [5])
    trajs = [_traj(0, [3, 5], tool_s=0.0), _traj(1, [3], score_s=0.002)]
    got = CpuReplay(_stack(gil_s=0.005), trajs).run()
    assert second > 0.003  # the call (from first + 0.001) still runs when it answers
    assert got[1] == pytest.approx(first + 0.002 + 0.005)
    without = CpuReplay(_stack(), trajs).run()
    assert without[1] == pytest.approx(first + 0.002)


def test_tool_turn_adds_tool_latency_and_a_second_call() -> None:
    # The scheduler report of the tool return is off the critical path.
    got = CpuReplay(_stack(), [_traj(0, [3, 5], tool_s=0.1)]).run()
    first = 0.001 + COSTS.call_s([7], [3])
    second = 0.001 + COSTS.call_s([7 + 3 + 4], [5])
    assert got == [pytest.approx(first + 0.1 + second)]


LOOP = LoopCosts(pass_overhead_s=0.002, resume_s=0.003, after_s=0.004, task_start_s=0.005)


def test_measured_loop_costs_delay_each_rows_task_in_batch_order() -> None:
    got = CpuReplay(_stack(loop={"r0": LOOP}, gil_s=0.005),
                    [_traj(0, [3], score_s=0.001), _traj(1, [3], score_s=0.001)]).run()
    done = 0.002 + COSTS.call_s([7, 7], [3, 3])
    assert got == [pytest.approx(done + 0.003 + 0.004 * k / 2 + 0.005 + 0.001) for k in (1, 2)]


def test_a_tool_that_returns_during_the_pass_overhead_joins_that_passes_call() -> None:
    # t0's tool returns 0.0005 s into the next pass's 0.001 s overhead: the batch is
    # taken after the overhead (as RolloutCore._step does), so t0 joins t1's call.
    trajs = [_traj(0, [3, 5], tool_s=0.0005), _traj(1, [3, 4], tool_s=0.0)]
    got = CpuReplay(_stack(), trajs).run()
    first = 0.001 + COSTS.call_s([7, 7], [3, 3])
    assert got[0] == pytest.approx(first + 0.001 + COSTS.call_s([14, 14], [5, 4]))


def test_measured_loop_costs_start_the_next_pass_after_the_results_are_applied() -> None:
    got = CpuReplay(_stack(loop={"r0": LOOP}), [_traj(0, [3, 5], tool_s=0.0)]).run()
    first = 0.002 + COSTS.call_s([7], [3])
    # Its task starts (and its instant tool returns) after the loop has applied the
    # results and found nothing ready; the waiting loop wakes at once.
    second = 0.002 + COSTS.call_s([7 + 3 + 4], [5])
    tool_done = first + 0.003 + 0.004 + 0.005
    assert got == [pytest.approx(tool_done + second + 0.003 + 0.004 + 0.005)]


def test_batch_cap_splits_nine_ready_trajectories_into_two_calls() -> None:
    got = CpuReplay(_stack(), [_traj(i, [4]) for i in range(9)]).run()
    one = 0.001 + COSTS.call_s([7] * 8, [4] * 8)
    assert sorted(got)[:8] == [pytest.approx(one)] * 8
    assert sorted(got)[8] == pytest.approx(one + 0.001 + COSTS.call_s([7], [4]))


def test_arrival_while_tools_run_waits_for_the_poll() -> None:
    stack = _stack()
    trajs = [_traj(0, [3, 3], tool_s=1.0), _traj(1, [3], at=0.05)]
    got = CpuReplay(stack, trajs).run()
    first_done = 0.001 + COSTS.call_s([7], [3])
    # After its call the instance polls every pass_overhead + poll_s; the arrival at
    # 0.05 is pulled at the first pass after it, not at once.
    passes = [first_done + k * (0.001 + stack.poll_s) for k in range(1, 10)]
    pulled = min(p for p in passes if p >= 0.05)
    assert got[1] == pytest.approx(pulled + 0.001 + COSTS.call_s([7], [3]))


def test_compare_reports_ratio_of_mean_rollout_times() -> None:
    recs = [RecordedTrajectory(_traj(i, [3]).rec, 0.0, 0.1) for i in range(10)]
    out = compare(recs, [0.09] * 10)
    assert out["ratio"] == pytest.approx(0.9)
    assert out["within_tolerance"]


def test_reload_schedule_takes_earliest_load_start_per_version() -> None:
    events = [
        {"kind": "weights_loaded", "version": "0", "reload_s": "0.005", "at_ms": 1010},
        {"kind": "weights_loaded", "version": "1", "reload_s": "0.004", "at_ms": 1204},
        {"kind": "weights_loaded", "version": "1", "reload_s": "0.006", "at_ms": 1210},
        {"kind": "other", "at_ms": 1300},
    ]
    publish, reload_s = reload_schedule(events, 1000)
    assert publish == (pytest.approx(0.2),)
    assert reload_s == pytest.approx(0.005)


def _pass(active: int, version: int, **phases: float) -> dict:
    base = dict.fromkeys(("pull_s", "refresh_s", "prep_s", "dispatch_s", "engine_s",
                          "resume_s", "after_s"), 0.001)
    return {"active": active, "version": version, "batch": 1, **base, **phases}


def test_loop_costs_leave_out_blocked_pulls_and_weight_loads() -> None:
    passes = [_pass(0, 0, pull_s=0.2, refresh_s=0.5),   # first contact, blocked inbox
              _pass(2, 0, pull_s=0.003, refresh_s=0.002),
              _pass(0, 0, pull_s=0.1, refresh_s=0.004),  # blocked on the inbox
              _pass(3, 1, pull_s=0.005, refresh_s=0.3)]  # reloaded weights
    ops = [{"op": "task_start", "at_s": 1.0, "wall_s": 0.002, "key": ""},
           {"op": "task_start", "at_s": 2.0, "wall_s": 0.004, "key": ""}]
    got = loop_costs({"passes": passes, "ops": ops})
    assert got.pass_overhead_s == pytest.approx(0.004 + 0.003 + 0.002)
    assert (got.resume_s, got.after_s) == (pytest.approx(0.001), pytest.approx(0.001))
    assert got.task_start_s == pytest.approx(0.003)
    assert loop_costs({"passes": [], "ops": []}) is None


def test_op_latencies_are_per_key_in_time_order_over_instances() -> None:
    profiles = {
        "r0": {"ops": [{"op": "tool", "at_s": 2.0, "wall_s": 0.2, "key": "t0"},
                       {"op": "score", "at_s": 3.0, "wall_s": 0.9, "key": "t0"}]},
        "r1": {"ops": [{"op": "tool", "at_s": 1.0, "wall_s": 0.1, "key": "t0"}]},
    }
    assert op_latencies(profiles, "tool") == {"t0": [0.1, 0.2]}
