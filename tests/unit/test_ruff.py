"""``make lint``'s ruff check holds on the tree, so CI (which runs ``make test``) refuses
what the rules ban: among them ``asyncio.wait_for`` outside tests (pyproject.toml's
banned-api: on 3.11 it can swallow a cancel, and a polling loop then never stops).
A second check runs the same configuration over a file that breaks the ban, so a rule
that could never fire is caught.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")
CHECKED = ["libra", "libra_cli", "scheduling", "services", "sim", "tests", "scripts"]


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RUFF), "check", "--no-cache", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_the_tree_passes_ruff() -> None:
    out = _ruff(*CHECKED)
    assert out.returncode == 0, out.stdout + out.stderr


def test_wait_for_is_refused_outside_tests() -> None:
    # Read from stdin under a service's path (the per-file rules go by path).
    probe = ('"""Probe."""\n\nimport asyncio\n\n\nasync def poll() -> None:\n'
             "    await asyncio.wait_for(asyncio.sleep(0), 1)\n")
    out = _ruff("--stdin-filename", "services/rollout/probe.py", "-", stdin=probe)
    assert out.returncode == 1 and "TID251" in out.stdout, out.stdout + out.stderr
    allowed = _ruff("--stdin-filename", "tests/unit/probe.py", "-", stdin=probe)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
