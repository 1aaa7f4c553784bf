"""`libra up --observe` before anything starts: where the Phoenix virtualenv is looked
for, and the refusal that names the make target when it is absent (nothing is started).
The running viewer is tested on a real stack: tests/integration/test_observe_stack.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from libra_cli import observe
from libra_cli.main import main


def test_the_venv_comes_from_the_env_var_else_the_repository(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(observe.PHOENIX_VENV_ENV, raising=False)
    assert observe.default_venv(tmp_path) == tmp_path / ".venv-phoenix"
    monkeypatch.setenv(observe.PHOENIX_VENV_ENV, str(tmp_path / "elsewhere"))
    assert observe.default_venv(tmp_path) == tmp_path / "elsewhere"


def test_observe_without_the_venv_names_the_make_target_and_starts_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["--run-root", str(tmp_path), "up", "--observe", "--phoenix-venv",
                 str(tmp_path / "no-such-venv")])
    assert code == 2
    err = capsys.readouterr().err
    assert "FailedPrecondition" in err and "make observe-venv" in err
    assert "no-such-venv" in err
    assert not (tmp_path / ".libra").exists()


def test_a_stopped_viewer_is_dead_in_status(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    state = {"pid": proc.pid, "url": "http://127.0.0.1:9", "otlp_endpoint": "127.0.0.1:9",
             "log_path": str(tmp_path / "phoenix.log")}
    row = observe.status_row(state)
    assert (row["name"], row["health"], row["url"]) == ("phoenix", "DEAD", state["url"])
