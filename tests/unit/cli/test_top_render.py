"""`libra top` frames and `libra status` job counters from a run view (pure; the frame
from a live stack is tests/integration/test_ui_browser.py)."""

from __future__ import annotations

import json

import pytest

from libra import types as t
from libra.errors import NotFound
from libra.run_view import build_run_view
from libra_cli.main import build_parser
from libra_cli.top import FRAME_WIDTH, job_counters, pick_job, render, sparkline


def make_job(job_id: str, state: t.JobState, created_at_ms: int) -> t.Job:
    return t.Job(job_id=job_id, name="demo", state=state,
                 spec_json=json.dumps({"algorithm": {"num_steps": 8}}),
                 created_at_ms=created_at_ms, updated_at_ms=created_at_ms, step=2)


def a_view():
    job = make_job("demo-1", t.JobState.RUNNING, 1)
    steps = [{"step": n, "reward_mean": 0.1 * n, "rollout_s": 0.5, "train_s": 2.0,
              "wall_s": 2.5, "num_trajectories": 4, "bucket_occupancy": {"short": 4},
              "migrations": 1} for n in (1, 2)]
    lease = t.Lease(worker_id="rollout-0", role=t.WorkerRole.CORE_ROLLOUT, bucket="short",
                    address="a", epoch=2, expires_at_ms=0, ttl_ms=1)
    events = [{"kind": "plan", "ts_ms": 1, "step": 2, "worker_id": "", "wanted": 1}]
    return build_run_view(job, steps, {"produced": 8, "trained": 8}, events, [lease], [job])


def test_a_frame_has_every_panel_of_the_web_view() -> None:
    frame = render(a_view(), now_s=0)
    assert frame.startswith("libra top  demo demo-1  running  step 2/8  policy v0")
    assert "verdict  train-bound: rollouts wait for the trainer" in frame
    for panel in ("reward   ", "step time", "trajectories  produced 8  trained 8",
                  "buckets", "migrations 2 (last step 1)", "workers", "rollout-0",
                  "events (newest last)", "plan", "jobs and queue"):
        assert panel in frame, panel
    assert max(len(line) for line in frame.splitlines()) <= FRAME_WIDTH


def test_a_view_without_steps_still_renders() -> None:
    job = make_job("empty-1", t.JobState.PENDING, 1)
    frame = render(build_run_view(job, [], {}, [], [], [job]), now_s=0)
    assert "verdict  unknown: no timed step yet" in frame and "no live lease" in frame


def test_sparkline_scales_to_its_own_range_and_keeps_the_newest() -> None:
    assert sparkline([0.0, 0.5, 1.0], 10) == "▁▄█"
    assert sparkline([1.0] * 3, 10) == "▁▁▁"
    assert sparkline(list(range(100)), 5) == "▁▂▄▆█" and sparkline([], 5) == ""


def test_top_picks_the_running_job_else_the_newest() -> None:
    old = make_job("a", t.JobState.SUCCEEDED, 1)
    new = make_job("b", t.JobState.FAILED, 3)
    running = make_job("c", t.JobState.RUNNING, 2)
    assert pick_job([old, running, new]) == "c"
    assert pick_job([new, old]) == "b"
    with pytest.raises(NotFound):
        pick_job([])


def test_status_counters_are_one_flat_object() -> None:
    counters = job_counters(a_view())
    assert counters["job_id"] == "demo-1" and counters["verdict"] == "train-bound"
    assert (counters["step"], counters["target_steps"], counters["trained"]) == (2, 8, 8)
    assert all(not isinstance(v, dict | list) for v in counters.values())


@pytest.mark.parametrize("bad", ["0.1", "x", "-1"])
def test_a_bad_interval_is_refused_naming_the_flag(
        bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["top", f"--interval-s={bad}"])
    assert exc.value.code == 2 and "--interval-s" in capsys.readouterr().err
