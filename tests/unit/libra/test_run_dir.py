"""A job's run directory: weight-version pruning rules and report.json's ``storage``."""

from __future__ import annotations

import json
from pathlib import Path

from libra import types as t
from libra.run_dir import (
    prune_weight_versions,
    published_versions,
    run_dir_usage,
    versions_to_prune,
    weights_file,
)
from libra.weight_sync import MANIFEST_SUFFIX, write_manifest
from libra_cli.report import SCHEMA_VERSION, build_report


def publish(run_dir: Path, version: int, size_bytes: int = 100) -> Path:
    """A published version as the trainer leaves it: weights file + manifest."""
    path = weights_file(run_dir, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes([version % 256]) * size_bytes)
    write_manifest(path, version)
    return path


def test_keeps_the_newest_k_and_every_version_in_use() -> None:
    assert versions_to_prune(range(8), keep=3, in_use=[1]) == [0, 2, 3, 4]


def test_keep_zero_keeps_everything() -> None:
    assert versions_to_prune(range(8), keep=0, in_use=[]) == []


def test_the_newest_is_kept_even_when_nothing_uses_it() -> None:
    assert versions_to_prune([4, 2, 9], keep=1, in_use=[2]) == [4]


def test_prune_deletes_weights_and_manifests_of_old_unused_versions(tmp_path: Path) -> None:
    for version in range(6):
        publish(tmp_path, version)
    pruned = prune_weight_versions(tmp_path, keep=2, in_use=[1])
    assert pruned == [0, 2, 3]
    assert sorted(published_versions(tmp_path)) == [1, 4, 5]
    left = sorted(p.name for p in (tmp_path / "weights").iterdir())
    assert left == sorted(n for v in (1, 4, 5) for n in (
        f"v{v:06d}.safetensors", f"v{v:06d}.safetensors{MANIFEST_SUFFIX}"))


def test_usage_counts_each_part_and_not_symlinked_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "job"
    publish(run_dir, 0, 1000)
    publish(run_dir, 1, 1000)
    manifests = sum(p.stat().st_size for p in (run_dir / "weights").glob(f"*{MANIFEST_SUFFIX}"))
    (run_dir / "checkpoints" / "step_000005").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000005" / "model.safetensors").write_bytes(b"x" * 3000)
    (run_dir / "model").mkdir()
    (run_dir / "model" / "config.json").write_bytes(b"{}" * 10)
    (run_dir / "report.json").write_bytes(b"r" * 7)
    outside = tmp_path / "big.bin"
    outside.write_bytes(b"b" * 10_000)
    (run_dir / "model" / "linked.bin").symlink_to(outside)
    usage = run_dir_usage(run_dir)
    assert usage == {"run_dir_bytes": 2000 + manifests + 3000 + 20 + 7,
                     "weights_bytes": 2000 + manifests, "checkpoints_bytes": 3000,
                     "model_bytes": 20, "other_bytes": 7, "num_weight_versions": 2}


def test_report_records_the_run_dir_size(tmp_path: Path) -> None:
    publish(tmp_path, 0, 4096)
    job = t.Job(job_id=t.JobId("j-1"), name="j", state=t.JobState.SUCCEEDED,
                spec_json=json.dumps({"name": "j"}), created_at_ms=1, updated_at_ms=2,
                run_dir=str(tmp_path))
    storage = build_report(job, [], {}, 0.0)["storage"]
    assert storage["weights_bytes"] >= 4096 and storage["num_weight_versions"] == 1
    assert storage["run_dir_bytes"] == storage["weights_bytes"]
    assert SCHEMA_VERSION == 3


def test_report_of_a_job_without_run_dir_has_zero_storage() -> None:
    job = t.Job(job_id=t.JobId("j-1"), name="j", state=t.JobState.PENDING,
                spec_json="{}", created_at_ms=1, updated_at_ms=2)
    assert set(build_report(job, [], {}, 0.0)["storage"].values()) == {0}
