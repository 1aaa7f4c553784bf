"""The decision profile's options and figures (issue 20, session 16): bad workloads and
seeds are refused before any run; a profiled decision's recorded runs agree with the
search (the pick's run scores what the search picked; every run has a fill and a window)."""

from __future__ import annotations

import pytest

from benchmarks import profile_decision


@pytest.mark.parametrize(
    ("argv", "message"),
    [(("--shapes", "r2e,nope"), "--shapes"), (("--seeds", "0,x"), "--seeds")],
)
def test_bad_options_exit_2_naming_the_option(refused, argv: tuple, message: str) -> None:
    refused(profile_decision.main, argv, message)


def test_recorded_runs_agree_with_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.twin

    recording = profile_decision._recording_simulator()
    monkeypatch.setattr(sim.twin, "Simulator", recording)
    got = profile_decision._decision("search", 0, recording, profile_decision._Sampler())
    runs = {r["plan"]: r for r in got["runs"]}
    assert len(runs) == len(got["runs"]) >= 2  # one run per refined candidate
    assert runs[got["picked"]]["events_after_cut"] == 0
    assert runs[got["picked"]]["score_s"] == got["picked_rollout_s"]
    for run in got["runs"]:
        assert 0 < run["fill_events"] < run["events"]
        assert run["events_after_cut"] <= run["events"] - run["fill_events"]
