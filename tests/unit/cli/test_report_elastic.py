"""report.json: per-step ``hybrid_workers`` and the job's ``events`` list."""

from __future__ import annotations

import json

import pytest

from libra import types as t
from libra.errors import InvalidArgument
from libra_cli.report import SCHEMA_VERSION, build_report


def make_job() -> t.Job:
    return t.Job(job_id=t.JobId("j-1"), name="j", state=t.JobState.SUCCEEDED,
                 spec_json=json.dumps({"name": "j"}), created_at_ms=1, updated_at_ms=2)


def test_steps_without_hybrid_workers_report_zero() -> None:
    steps = [{"step": 1, "reward_mean": 0.1}, {"step": 2, "reward_mean": 0.2,
                                                "hybrid_workers": 2}]
    report = build_report(make_job(), steps, {}, 1.0)
    assert [s["hybrid_workers"] for s in report["steps"]] == [0, 2]
    assert "hybrid_workers" not in steps[0]  # the caller's records are left alone


def test_events_are_listed_in_recorded_order() -> None:
    events = [{"ts_ms": 10, "kind": "plan", "action": "join"},
              {"ts_ms": 12, "kind": "join_requested", "worker_id": "r1", "epoch": 4},
              {"ts_ms": 11, "kind": "requeue"}]
    report = build_report(make_job(), [], {}, 0.0, events)
    assert [e["kind"] for e in report["events"]] == ["plan", "join_requested", "requeue"]
    assert report["schema_version"] == SCHEMA_VERSION == 3


def test_report_without_events_has_an_empty_list() -> None:
    assert build_report(make_job(), [], {}, 0.0)["events"] == []


def test_steps_go_through_the_step_record_codec() -> None:
    """Typed records and stored JSON objects give the same report entries; a stored step
    the codec refuses is named, not copied into report.json."""
    typed = t.StepRecord(step=1, reward_mean=0.5, wall_s=2.0, metrics={"loss": 0.25})
    stored = {"step": 1, "reward_mean": 0.5, "wall_s": 2.0, "loss": 0.25}
    for steps in ([typed], [stored]):
        report = build_report(make_job(), steps, {}, 1.0)
        assert report["steps"] == [{**stored, "hybrid_workers": 0}]
    with pytest.raises(InvalidArgument) as err:
        build_report(make_job(), [{"step": 1, "reward_mean": "high"}], {}, 1.0)
    assert err.value.field == "step_json.reward_mean"
