"""``make test``'s worker count (PYTEST_WORKERS) follows the CPUs this process may use:
``nproc``, at most PYTEST_MAX_WORKERS (8), at least 1; set by hand it is kept, and 0
still means one process. Real make on the repository's Makefile, with a stand-in
``nproc`` first on PATH (before: 2 whatever the host)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def pytest_args(tmp_path: Path, cpus: str | None, *overrides: str) -> str:
    """What ``make test`` would pass to pytest for parallelism, on a host with ``cpus``
    (None: the real ``nproc``)."""
    env = dict(os.environ)
    env.pop("PYTEST_WORKERS", None)
    env.pop("MAKEFLAGS", None)
    if cpus is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        fake = bin_dir / "nproc"
        fake.write_text(f"#!/bin/sh\necho {cpus}\n")
        fake.chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT),
                           "pytest-parallel", *overrides],
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


@pytest.mark.parametrize(("cpus", "workers"), [("1", 1), ("4", 4), ("8", 8), ("64", 8)])
def test_workers_follow_the_cpu_count_up_to_the_cap(tmp_path: Path, cpus: str,
                                                    workers: int) -> None:
    assert pytest_args(tmp_path, cpus) == f"-n {workers} --dist loadgroup"


@pytest.mark.parametrize("cpus", ["0", "garbage"])
def test_an_unusable_cpu_count_still_gives_one_worker(tmp_path: Path, cpus: str) -> None:
    assert pytest_args(tmp_path, cpus) == "-n 1 --dist loadgroup"


def test_the_cap_can_be_raised(tmp_path: Path) -> None:
    assert pytest_args(tmp_path, "64", "PYTEST_MAX_WORKERS=16") == "-n 16 --dist loadgroup"


@pytest.mark.parametrize("workers", ["0", "3"])
def test_a_count_given_by_hand_is_kept(tmp_path: Path, workers: str) -> None:
    assert pytest_args(tmp_path, "64", f"PYTEST_WORKERS={workers}") == (
        f"-n {workers} --dist loadgroup")
