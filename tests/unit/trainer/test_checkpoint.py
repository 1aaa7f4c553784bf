"""Checkpoint folders: atomic write, keep-last-2, verified load naming the bad file."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.trainer import checkpoint


def _writer(payload: str):
    def write(directory: str) -> list[str]:
        Path(directory, "model.bin").write_text(payload)
        Path(directory, "rng.bin").write_text("rng")
        return ["model.bin", "rng.bin"]
    return write


def test_latest_returns_the_newest_checkpoint_with_its_step_and_version(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 2, 1, _writer("a"))
    checkpoint.save(tmp_path, 4, 3, _writer("b"))
    ckpt = checkpoint.latest(tmp_path)
    assert (ckpt.step, ckpt.policy_version) == (4, 3)
    assert (ckpt.path / "model.bin").read_text() == "b"


def test_only_the_last_two_checkpoints_are_kept(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        checkpoint.save(tmp_path, step, step, _writer(str(step)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000003", "step_000004"]


def test_a_half_written_checkpoint_is_ignored(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 2, 1, _writer("a"))
    (tmp_path / ".step_000004.tmp").mkdir()  # a crash mid-write leaves only this
    assert checkpoint.latest(tmp_path).step == 2


def test_no_checkpoint_folder_means_no_checkpoint(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path / "missing") is None


def test_a_redone_step_replaces_its_checkpoint(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 2, 1, _writer("old"))
    checkpoint.save(tmp_path, 2, 5, _writer("new"))
    ckpt = checkpoint.latest(tmp_path)
    assert ckpt.policy_version == 5 and (ckpt.path / "model.bin").read_text() == "new"


def test_a_corrupt_file_is_an_error_naming_it(tmp_path: Path) -> None:
    ckpt = checkpoint.save(tmp_path, 2, 1, _writer("a"))
    (ckpt.path / "model.bin").write_text("flipped")
    with pytest.raises(checkpoint.CheckpointError, match=r"step_000002/model\.bin"):
        checkpoint.latest(tmp_path)


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    ckpt = checkpoint.save(tmp_path, 2, 1, _writer("a"))
    (ckpt.path / "rng.bin").unlink()
    with pytest.raises(checkpoint.CheckpointError, match=r"step_000002/rng\.bin"):
        checkpoint.latest(tmp_path)


def test_unreadable_meta_is_an_error_naming_it(tmp_path: Path) -> None:
    ckpt = checkpoint.save(tmp_path, 2, 1, _writer("a"))
    (ckpt.path / "meta.json").write_text("{not json")
    with pytest.raises(checkpoint.CheckpointError, match=r"step_000002/meta\.json"):
        checkpoint.latest(tmp_path)
