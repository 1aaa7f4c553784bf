"""Run retention rules (libra/retention.py) on real folders under tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libra.retention import (
    DELETE,
    KEEP,
    PRUNE_WEIGHTS,
    RetentionPolicy,
    RunFolder,
    apply_gc,
    plan_gc,
    scan_run_root,
    with_weight_pruning,
)
from libra.run_dir import published_versions, weights_file
from libra.types import Job, JobState

DAY_MS = 86_400_000
NOW_MS = 100 * DAY_MS


def job(job_id: str, state: JobState, ended_days_ago: float = 0.0) -> Job:
    ended = NOW_MS - int(ended_days_ago * DAY_MS)
    return Job(job_id=job_id, name="n", state=state, spec_json="{}", created_at_ms=0,
               updated_at_ms=ended)


def folder(job_id: str, modified_days_ago: float = 0.0) -> RunFolder:
    return RunFolder(job_id, Path("/runs") / job_id, NOW_MS - int(modified_days_ago * DAY_MS))


def actions_by_id(folders: list[RunFolder], jobs: list[Job],
                  policy: RetentionPolicy) -> dict[str, str]:
    return {a.job_id: a.action for a in plan_gc(folders, jobs, policy, NOW_MS)}


def test_live_jobs_are_kept_however_old() -> None:
    jobs = [job("run-00000001", JobState.RUNNING, 30), job("q-00000002", JobState.PENDING, 30)]
    folders = [folder("run-00000001", 30), folder("q-00000002", 30)]
    got = actions_by_id(folders, jobs, RetentionPolicy(max_age_s=1, keep_last=0,
                                                       delete_all_ended=True))
    assert got == {"run-00000001": KEEP, "q-00000002": KEEP}


def test_old_ended_runs_go_beyond_the_newest_keep_last() -> None:
    jobs = [job("a-00000001", JobState.SUCCEEDED, 10), job("b-00000002", JobState.FAILED, 9),
            job("c-00000003", JobState.CANCELLED, 8), job("d-00000004", JobState.SUCCEEDED, 1)]
    folders = [folder(j.job_id) for j in jobs]
    got = actions_by_id(folders, jobs, RetentionPolicy(max_age_s=7 * 86400, keep_last=2))
    # c is among the newest two although older than 7 days; d is young.
    assert got == {"a-00000001": DELETE, "b-00000002": DELETE, "c-00000003": KEEP,
                   "d-00000004": KEEP}


def test_zero_age_keeps_every_run_unless_all_ended_is_asked() -> None:
    jobs = [job("a-00000001", JobState.SUCCEEDED, 400)]
    folders = [folder("a-00000001")]
    assert actions_by_id(folders, jobs, RetentionPolicy(max_age_s=0, keep_last=0)) == {
        "a-00000001": KEEP}
    assert actions_by_id(folders, [job("a-00000001", JobState.SUCCEEDED, 0)],
                         RetentionPolicy(max_age_s=0, keep_last=0, delete_all_ended=True)) == {
        "a-00000001": DELETE}


def test_a_folder_unknown_to_the_coordinator_is_aged_by_its_files() -> None:
    folders = [folder("old-00000001", 20), folder("new-00000002", 1)]
    plan = plan_gc(folders, [], RetentionPolicy(max_age_s=7 * 86400, keep_last=0), NOW_MS)
    assert [(a.job_id, a.action, a.state) for a in plan] == [
        ("old-00000001", DELETE, "unknown"), ("new-00000002", KEEP, "unknown")]


def test_policy_refuses_negative_counts() -> None:
    with pytest.raises(ValueError, match="keep_last"):
        RetentionPolicy(max_age_s=0, keep_last=-1)
    with pytest.raises(ValueError, match="keep_weight_versions"):
        RetentionPolicy(max_age_s=0, keep_weight_versions=-1)


def make_run(run_root: Path, job_id: str, num_versions: int = 3) -> Path:
    run_dir = run_root / job_id
    for version in range(num_versions):
        path = weights_file(run_dir, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"w" * 100)
        path.with_name(path.name + ".manifest.json").write_text("{}")
    (run_dir / "checkpoints" / "step_000001").mkdir(parents=True)
    return run_dir


def test_scan_skips_symlinks_stack_state_and_other_folders(tmp_path: Path) -> None:
    make_run(tmp_path, "demo-0badc0de")
    (tmp_path / ".libra").mkdir()
    (tmp_path / "my-notes").mkdir()
    other = make_run(tmp_path / "elsewhere", "ext-00000001")
    (tmp_path / "ext-00000001").symlink_to(other)
    (tmp_path / "file-00000002").write_text("not a folder")
    assert [f.job_id for f in scan_run_root(tmp_path)] == ["demo-0badc0de"]
    assert scan_run_root(tmp_path / "missing") == []


def test_scan_ages_a_folder_by_its_newest_entry(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "demo-0badc0de")
    old_s = NOW_MS / 1000 - 20 * 86400
    for path in (run_dir, *run_dir.iterdir()):
        os.utime(path, (old_s, old_s))
    os.utime(run_dir / "checkpoints", (old_s + 3600, old_s + 3600))
    [found] = scan_run_root(tmp_path)
    assert found.modified_ms == int((old_s + 3600) * 1000)


def test_apply_deletes_and_prunes_only_what_was_planned(tmp_path: Path) -> None:
    gone, pruned, running = (make_run(tmp_path, f"{n}-0000000{i}")
                             for i, n in enumerate(("gone", "pruned", "running")))
    jobs = [job("gone-00000000", JobState.SUCCEEDED, 30),
            job("pruned-00000001", JobState.CANCELLED, 1),
            job("running-00000002", JobState.RUNNING)]
    policy = RetentionPolicy(max_age_s=7 * 86400, keep_last=0, keep_weight_versions=1)
    plan = with_weight_pruning(plan_gc(scan_run_root(tmp_path), jobs, policy, NOW_MS), 1)
    assert [(a.action, a.prune_versions) for a in plan] == [
        (DELETE, []), (PRUNE_WEIGHTS, [0, 1]), (KEEP, [])]
    assert apply_gc(plan, tmp_path) == 2
    assert not gone.exists()
    assert sorted(published_versions(pruned)) == [2]
    assert not (pruned / "weights" / "v000000.safetensors.manifest.json").exists()
    assert (pruned / "checkpoints" / "step_000001").is_dir()  # a resume needs it
    assert sorted(published_versions(running)) == [0, 1, 2]


def test_apply_never_leaves_the_run_root(tmp_path: Path) -> None:
    outside = make_run(tmp_path / "other-root", "x-00000001")
    plan = plan_gc([RunFolder("x-00000001", outside, 0)], [],
                   RetentionPolicy(max_age_s=1, keep_last=0), NOW_MS)
    assert plan[0].action == DELETE
    assert apply_gc(plan, tmp_path / "runs") == 0
    assert outside.is_dir()
