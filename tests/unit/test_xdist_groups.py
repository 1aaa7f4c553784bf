"""`make test`'s parallel scheduling (tests/xdist_groups.py), run for real: pytest with two
pytest-xdist workers over a small suite, each test writing down which worker ran it.

A module runs whole on one worker; modules marked with one ``xdist_group`` run on one
worker, in collection order. Without the scheduler, ``--dist loadgroup`` under pytest 9
hands the tests out one by one to both workers (their marks are lost), which these
assertions catch: the first two tests go to different workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.xdist_groups import (  # noqa: F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_configure_node,
    pytest_xdist_make_scheduler,
)
"""

MODULE = """
import os
from pathlib import Path

import pytest

{mark}

@pytest.mark.parametrize("i", range({num_tests}))
def test_records_its_worker(i, request):
    with open(Path(os.environ["RUN_LOG"]), "a") as log:
        log.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{request.node.nodeid}}\\n")
"""


def _run_suite(tmp_path: Path) -> list[tuple[str, str]]:
    """(worker, node id) of each test, in the order the tests ran."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    grouped = 'pytestmark = pytest.mark.xdist_group("stack")'
    for name, mark, num_tests in [("test_a", "", 6), ("test_b", grouped, 3),
                                  ("test_c", "", 6), ("test_d", grouped, 3)]:
        (suite / f"{name}.py").write_text(MODULE.format(mark=mark, num_tests=num_tests))
    log = tmp_path / "run.log"
    env = {**os.environ, "RUN_LOG": str(log), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-n", "2", "--dist", "loadgroup",
                          # its own temp root: no new numbered dir beside other runs' own
                          "--basetemp", str(tmp_path / "basetemp")],
                         cwd=suite, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split(" ", 1) for line in log.read_text().splitlines()]
    return [(worker, nodeid) for worker, nodeid in rows]


def test_modules_run_whole_and_a_group_of_modules_on_one_worker_in_order(
        tmp_path: Path) -> None:
    ran = _run_suite(tmp_path)
    assert len(ran) == 18
    workers_of: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in ran:
        workers_of[nodeid.split("::")[0]].add(worker)
    assert all(len(workers) == 1 for workers in workers_of.values()), workers_of
    assert workers_of["test_b.py"] == workers_of["test_d.py"]
    group = [nodeid for _, nodeid in ran if nodeid.startswith(("test_b.py", "test_d.py"))]
    assert group == sorted(group)  # b's tests, then d's, each in order
