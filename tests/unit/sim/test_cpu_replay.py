"""The CPU engine cost fit and the replay of a recorded CPU stack (no services)."""

from __future__ import annotations

import pytest

from libra.types import Bucket
from sim.cpu_engine import CpuEngineCosts, fit, fit_report
from sim.cpu_replay import CpuReplay, CpuStack, RecordedTrajectory
from sim.trace import ToolCall, TraceTrajectory, Turn
from sim.validation import compare, reload_schedule

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
        pass_overhead_s=kw.get("pass_s", 0.001), tool_report_s=kw.get("report_s", 0.002),
        first_load_s={"r0": kw.get("load_s", 0.0)}, reload_s=0.0,
        gil_wait_s=kw.get("gil_s", 0.0),
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
    trajs = [_traj(0, [3, 5], tool_s=0.0), _traj(1, [3], score_s=0.001)]
    got = CpuReplay(_stack(gil_s=0.005, report_s=0.0), trajs).run()
    assert second > 0.003  # the call is still running when the answer arrives
    assert got[1] == pytest.approx(first + 0.001 + 0.005)
    without = CpuReplay(_stack(report_s=0.0), trajs).run()
    assert without[1] == pytest.approx(first + 0.001)


def test_tool_turn_adds_tool_latency_report_and_a_second_call() -> None:
    got = CpuReplay(_stack(), [_traj(0, [3, 5], tool_s=0.1)]).run()
    first = 0.001 + COSTS.call_s([7], [3])
    second = 0.001 + COSTS.call_s([7 + 3 + 4], [5])
    assert got == [pytest.approx(first + 0.1 + 0.002 + second)]


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
