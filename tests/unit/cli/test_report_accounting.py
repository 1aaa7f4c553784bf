"""The report's accounting identity has an independently measured in-flight term, so a
lost trajectory shows (``unaccounted``) instead of being absorbed by a difference."""

from __future__ import annotations

from libra import types as t
from libra_cli.report import build_report

COUNTED = {"produced": 10, "failed": 2, "trained": 6, "dropped_stale": 2, "dropped_failed": 1}


def _job() -> t.Job:
    return t.Job(job_id=t.JobId("job-1"), name="n", state=t.JobState.SUCCEEDED,
                 spec_json="{}", created_at_ms=0, updated_at_ms=0)


def _trajectories(counters: dict[str, int]) -> dict:
    return build_report(_job(), [], counters, 1.0)["trajectories"]


def test_a_measured_backlog_that_matches_leaves_nothing_unaccounted() -> None:
    report = _trajectories({**COUNTED, "in_flight_unconsumed": 3, "in_flight_running": 4,
                            "in_flight_pending_admission": 1})
    assert report["produced"] == 12 and report["in_flight_at_end"] == 3
    assert (report["running_at_end"], report["pending_admission_at_end"]) == (4, 1)
    assert report["unaccounted"] == 0 and report["accounting"] == "measured"


def test_a_trajectory_acknowledged_without_being_counted_is_caught() -> None:
    # The trainer acked one entry (it left the stream) but never counted it.
    report = _trajectories({**COUNTED, "in_flight_unconsumed": 2})
    assert report["unaccounted"] == 1


def test_a_trajectory_counted_twice_shows_as_negative() -> None:
    report = _trajectories({**COUNTED, "trained": 7, "in_flight_unconsumed": 3})
    assert report["unaccounted"] == -1


def test_without_a_measured_backlog_the_report_says_the_term_is_derived() -> None:
    report = _trajectories(COUNTED)
    assert report["in_flight_at_end"] == 3 and report["accounting"] == "derived"
