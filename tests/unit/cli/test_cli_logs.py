"""``libra logs``: the launcher's log files read back, filtered by time, followed.

Real: log files written where the launcher writes them (``launcher.logs_dir``), in the
formats ``libra.telemetry`` writes (text and JSON lines, rotated backups), the CLI's own
``main``, and for ``-f`` a real ``libra logs`` process stopped by pid. The stack itself is
not started here (tests/integration/test_observe_stack.py reads a live one).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from libra_cli import logs
from libra_cli.launcher import DEFAULT_STACK, ROOT, logs_dir, service_names
from libra_cli.main import main

T0 = "2026-12-01 16:00:00,000"  # 1796140800.0 UTC
T0_S = 1796140800.0


def _text(at: str, msg: str) -> str:
    return f"{at} level=INFO service=coordinator logger=x {msg}"


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    folder = logs_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "coordinator.log.2").write_text(_text("2026-12-01 15:00:00,000", "oldest") + "\n")
    (folder / "coordinator.log.1").write_text(_text("2026-12-01 15:30:00,000", "older") + "\n")
    (folder / "coordinator.log").write_text("\n".join([
        _text(T0, "start"),
        _text("2026-12-01 16:10:00,000", "boom"),
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        _text("2026-12-01 16:20:00,000", "after"),
    ]) + "\n")
    return tmp_path


def test_the_whole_log_prints_rotated_files_first(run_root: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    assert main(["--run-root", str(run_root), "logs", "coordinator"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.rsplit(" ", 1)[-1] for line in out[:3]] == ["oldest", "older", "start"]
    assert len(out) == 7


def test_since_a_timestamp_keeps_later_records_with_their_continuation_lines(
        run_root: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--run-root", str(run_root), "logs", "coordinator",
                 "--since", "2026-12-01T16:05:00"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("boom") and out[1].startswith("Traceback")
    assert out[-1].endswith("after") and len(out) == 4


def test_since_a_duration_counts_back_from_now() -> None:
    assert logs.parse_since("10m", now_s=T0_S) == T0_S - 600
    assert logs.parse_since("2026-12-01T16:00:00+01:00", now_s=0.0) == T0_S - 3600


@pytest.mark.parametrize("bad", ["yesterday", "10 minutes", "5 m"])
def test_a_bad_since_is_invalid_argument_naming_the_option(
        run_root: Path, bad: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["--run-root", str(run_root), "logs", "coordinator", "--since", bad]) == 2
    err = capsys.readouterr().err
    assert "InvalidArgument" in err and "--since" in err


def test_an_unknown_service_exits_2_naming_the_launchers_services(
        run_root: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--run-root", str(run_root), "logs", "coordinater"]) == 2
    err = capsys.readouterr().err
    assert "unknown service 'coordinater'" in err
    expected = service_names(tomllib.loads(DEFAULT_STACK.read_text()))
    assert expected[-1].startswith("rollout-")  # the stack's instance ids, not a copy
    for name in [*expected, "supervisor"]:
        assert name in err


def test_a_known_service_without_a_log_yet_exits_1(run_root: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    assert main(["--run-root", str(run_root), "logs", "scheduler"]) == 1
    assert "no log yet for scheduler" in capsys.readouterr().err


def test_json_lines_keep_their_fields_and_text_lines_are_wrapped(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = logs_dir(tmp_path)
    folder.mkdir(parents=True)
    entry = {"ts": T0_S + 60, "level": "info", "service": "trainer", "msg": "step=1"}
    (folder / "trainer.log").write_text(json.dumps({"ts": T0_S - 60, "msg": "early"})
                                        + "\n" + json.dumps(entry) + "\n")
    (folder / "scheduler.log").write_text(_text(T0, "hello") + "\n")
    assert main(["--run-root", str(tmp_path), "logs", "trainer", "--json",
                 "--since", "2026-12-01T16:00:00"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {**entry, "service": "trainer"}
    assert main(["--run-root", str(tmp_path), "logs", "scheduler", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == {"service": "scheduler", "ts": T0_S, "line": _text(T0, "hello")}


def _as_from_a_terminal() -> None:
    # A child inherits an ignored SIGINT: bash ignores it for a job it starts with `&`
    # without job control (a suite run in the background), and Python then keeps it
    # ignored, so Ctrl-C could never end `-f`. A terminal's Ctrl-C reaches a process
    # whose SIGINT is the default, as here.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_follow_prints_appended_lines_and_follows_a_rotation(run_root: Path) -> None:
    current = logs_dir(run_root) / "coordinator.log"
    proc = subprocess.Popen([sys.executable, "-m", "libra_cli.main", "--run-root",
                             str(run_root), "logs", "coordinator", "-f"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_terminal)
    try:
        assert proc.stdout is not None
        seen = [proc.stdout.readline() for _ in range(7)]  # the log so far
        assert seen[-1].rstrip().endswith("after")
        with current.open("a") as fh:
            fh.write(_text("2026-12-01 16:30:00,000", "appended") + "\n")
        assert proc.stdout.readline().rstrip().endswith("appended")
        current.rename(current.with_suffix(".log.1"))  # what the rotating handler does
        current.write_text(_text("2026-12-01 16:40:00,000", "rotated") + "\n")
        assert proc.stdout.readline().rstrip().endswith("rotated")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()  # not left following the log after the test
            proc.wait()
            raise
    assert code == 0
