"""Checked-in ``libra/proto`` matches what ``scripts/gen_protos.py`` generates from
``protos/`` (the drift test), and the check notices an edit. Runs the real script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "scripts" / "gen_protos.py"), "--check"],
                          cwd=root, capture_output=True, text=True, timeout=60)


def test_checked_in_generated_code_matches_protos() -> None:
    result = run_check(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_fails_when_generated_code_was_edited(tmp_path: Path) -> None:
    # The script finds protos/ and libra/proto relative to itself, so a copy of those
    # three paths is a complete sandbox.
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gen_protos.py", tmp_path / "scripts")
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    shutil.copytree(ROOT / "libra" / "proto", tmp_path / "libra" / "proto",
                    ignore=shutil.ignore_patterns("__pycache__"))
    edited = tmp_path / "libra" / "proto" / "coordinator" / "v1" / "coordinator_pb2.py"
    edited.write_text(edited.read_text() + "\n# hand edit\n")
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert "coordinator/v1/coordinator_pb2.py differs" in result.stdout
