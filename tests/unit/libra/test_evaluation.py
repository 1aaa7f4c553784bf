"""libra/evaluation.py: the round schedule, pass@k, a round's aggregate and its record in
report.json (libra_cli/report.py), drawn on the reward plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from libra import types as t
from libra.evaluation import (
    EvalRecord,
    aggregate_round,
    due_round,
    eval_rows,
    eval_steps,
    pass_at_k,
    pass_at_k_values,
)
from libra.jobspec import JobSpec, parse_job_spec
from libra_cli.report import build_report, write_report

OK, FAIL, TIMEOUT = t.ToolStatus.SUCCESS, t.ToolStatus.FAILURE, t.ToolStatus.TIMEOUT


def traj(prompt: int, sample: int, reward: float, *, turns: int = 1,
         tools: tuple[t.ToolStatus, ...] = (), versions: tuple[int, ...] = (3,),
         failed: bool = False) -> t.Trajectory:
    states = [t.ToolReturnState("calculator", t.SizeClass.SMALL, s) for s in tools]
    n = len(versions)
    return t.Trajectory(
        t.TrajectoryId(f"e-{prompt}-{sample}"), t.JobId("j"), t.GroupId(f"g{prompt}"),
        t.PromptId(f"p{prompt}"), "Q", "A",
        status=t.TrajectoryStatus.FAILED if failed else t.TrajectoryStatus.FINISHED,
        token_ids=[0] * (n + 1), num_prompt_tokens=1, loss_mask=[0] + [1] * n,
        logprobs=[0.0] * (n + 1), token_versions=[-1, *versions], reward=reward,
        num_turns=turns, tool_states=states, created_at_ms=10_000 + prompt,
        finished_at_ms=12_000 + 500 * sample, eval_round=1)


# -- the schedule -----------------------------------------------------------------------

def test_rounds_run_before_training_every_interval_and_after_the_last_step() -> None:
    assert eval_steps(10, 4) == [0, 4, 8, 10]
    assert eval_steps(8, 4) == [0, 4, 8]
    assert eval_steps(3, 5) == [0, 3]
    assert eval_steps(10, 0) == []


def test_due_round_is_the_latest_due_and_never_one_already_admitted() -> None:
    steps = [0, 4, 8, 10]
    assert [due_round(steps, 0, s) for s in (0, 3)] == [1, 1]
    assert due_round(steps, 1, 3) == 0  # round 1 admitted, round 2 not due yet
    assert due_round(steps, 1, 9) == 3  # round 2 was overtaken: skipped
    assert due_round(steps, 3, 10) == 4 and due_round(steps, 4, 10) == 0


def test_eval_rows_are_the_first_held_out_rows_every_time() -> None:
    from libra.data import open_job_dataset

    spec = parse_job_spec("[task]\nnum_prompts = 40\neval_fraction = 0.25\n")
    held = open_job_dataset(spec.task).eval
    rows = eval_rows(held, 4)
    assert [r.prompt_id for r in rows] == [held.row(i).prompt_id for i in range(4)]
    assert len(eval_rows(held, 1000)) == len(held) == 10
    assert eval_rows(None, 4) == []


# -- pass@k -------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (4, 0, 1, 0.0), (4, 4, 1, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5), (4, 2, 2, 5 / 6),
    (4, 1, 4, 1.0), (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)), (5, 0, 5, 0.0)])
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_refuses_k_outside_one_to_n() -> None:
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 0)


def test_reported_k_are_one_powers_of_two_and_n() -> None:
    assert pass_at_k_values(1) == [1]
    assert pass_at_k_values(4) == [1, 2, 4]
    assert pass_at_k_values(10) == [1, 2, 4, 8, 10]


# -- a round's aggregate --------------------------------------------------------------------

def test_round_aggregate_of_known_trajectories() -> None:
    trajs = [traj(0, 0, 1.0, turns=2, tools=(OK,)), traj(0, 1, 0.0, turns=3, tools=(FAIL, OK)),
             traj(1, 0, 0.5, tools=(TIMEOUT,), versions=(4, 5)), traj(1, 1, 0.0)]
    record = aggregate_round(2, 6, trajs, num_expected=4, correct_reward=1.0)
    assert (record.eval_round, record.step, record.num_prompts, record.num_samples) == (2, 6, 2, 4)
    assert record.reward_mean == pytest.approx(1.5 / 4)
    assert record.accuracy == 0.25
    # Prompt 0: 1 of 2 correct; prompt 1: none.
    assert record.pass_at_k == {"1": 0.25, "2": 0.5}
    assert record.turns_mean == 1.75
    assert (record.tool_error_rate, record.num_tool_calls) == (0.5, 4)
    assert (record.policy_version_min, record.policy_version_max) == (3, 5)
    assert record.is_complete and record.num_failed == 0
    assert record.duration_s == 2.5  # first created 10.000 s, last finished 12.500 s


def test_correct_reward_threshold_decides_accuracy() -> None:
    trajs = [traj(0, 0, 0.5), traj(0, 1, 0.25)]
    assert aggregate_round(1, 0, trajs, num_expected=2, correct_reward=0.5).accuracy == 0.5
    assert aggregate_round(1, 0, trajs, num_expected=2, correct_reward=0.2).accuracy == 1.0


def test_failed_sample_counts_as_reward_zero_and_incorrect() -> None:
    trajs = [traj(0, 0, 1.0), traj(0, 1, 1.0, failed=True)]
    record = aggregate_round(1, 0, trajs, num_expected=3, correct_reward=1.0)
    assert (record.reward_mean, record.accuracy, record.num_failed) == (0.5, 0.5, 1)
    assert not record.is_complete and record.num_expected == 3


def test_empty_round_records_zeros() -> None:
    record = aggregate_round(1, 0, [], num_expected=2, correct_reward=1.0)
    assert (record.num_samples, record.pass_at_k, record.policy_version_min) == (0, {}, -1)
    assert not record.is_complete


def test_record_round_trips_through_json() -> None:
    record = aggregate_round(1, 0, [traj(0, 0, 1.0, tools=(OK,))], num_expected=1,
                             correct_reward=1.0)
    assert EvalRecord.from_json(record.to_json()) == record


# -- report.json and the plot --------------------------------------------------------------

def report_with(events: list[dict]) -> dict:
    job = t.Job(t.JobId("j"), "j", t.JobState.SUCCEEDED, JobSpec().to_json(), 0, 0)
    steps = [{"step": s, "reward_mean": 0.1 * s, "wall_s": 1.0} for s in range(1, 5)]
    counters = {"produced": 10, "trained": 8, "eval_produced": 5, "eval_failed": 1,
                "eval_consumed": 6, "eval_size:1": 3, "eval_size:2": 3}
    return build_report(job, steps, counters, 1.0, events)


def test_report_lists_eval_rounds_apart_from_events_and_training_counts() -> None:
    first = aggregate_round(1, 0, [traj(0, 0, 0.0)], num_expected=1, correct_reward=1.0)
    second = aggregate_round(2, 4, [traj(0, 0, 1.0)], num_expected=1, correct_reward=1.0)
    report = report_with([{"kind": "eval", "record": second.to_json()},
                          {"kind": "join_requested", "step": 2},
                          {"kind": "eval", "record": first.to_json()}])
    assert [(e["eval_round"], e["step"], e["accuracy"]) for e in report["eval"]] == [
        (1, 0, 0.0), (2, 4, 1.0)]
    assert [e["kind"] for e in report["events"]] == ["join_requested"]
    assert report["eval_trajectories"] == {"admitted": 6, "produced": 6, "failed": 1,
                                           "consumed": 6}
    acc = report["trajectories"]
    assert (acc["produced"], acc["trained"], acc["in_flight_at_end"]) == (10, 8, 2)


def test_a_round_recorded_twice_keeps_its_complete_record() -> None:
    """A restarted trainer may record a late copy of a round as an incomplete one."""
    full = aggregate_round(1, 0, [traj(0, 0, 1.0), traj(0, 1, 0.0)], num_expected=2,
                           correct_reward=1.0)
    late = aggregate_round(1, 0, [traj(0, 1, 0.0)], num_expected=2, correct_reward=1.0)
    for events in ([full, late], [late, full]):
        report = report_with([{"kind": "eval", "record": r.to_json()} for r in events])
        assert [(e["num_samples"], e["is_complete"]) for e in report["eval"]] == [(2, True)]


def test_report_without_eval_has_an_empty_list() -> None:
    report = report_with([])
    assert report["eval"] == []


def test_reward_plot_is_written_with_eval_points(tmp_path: Path) -> None:
    rec = aggregate_round(1, 2, [traj(0, 0, 1.0)], num_expected=1, correct_reward=1.0)
    report = report_with([{"kind": "eval", "record": rec.to_json()}])
    path, png = write_report(report, tmp_path)
    assert json.loads(path.read_text())["eval"][0]["step"] == 2
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"


def test_libra_run_summary_shows_the_first_and_last_eval_accuracy() -> None:
    from libra_cli.run import _summary

    rounds = [aggregate_round(r, 2 * r, [traj(0, 0, float(r == 2))], num_expected=1,
                              correct_reward=1.0) for r in (1, 2)]
    report = report_with([{"kind": "eval", "record": r.to_json()} for r in rounds])
    report["_paths"] = {}
    job = t.Job(t.JobId("j"), "j", t.JobState.SUCCEEDED, "{}", 0, 0)
    summary = _summary(job, report)
    assert (summary["eval_rounds"], summary["eval_accuracy_first"],
            summary["eval_accuracy_last"]) == (2, 0.0, 1.0)
    assert "eval_rounds" not in _summary(job, {**report_with([]), "_paths": {}})
