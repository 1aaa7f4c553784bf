"""``libra model import`` draws transformers' progress bars only for a person at a
terminal: with stderr a pipe (CI, a log file) they are left out and the ``[import]``
stage lines stay; with stderr a terminal (a pseudo-terminal here) they are drawn.
Real: the CLI in a subprocess, a GGUF written by tests/fixtures/gguf_files.py, and
transformers' converter (before: both bars, redraws included, in the piped log)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.fixtures.gguf_files import gguf_from_hf_llama

ROOT = Path(__file__).resolve().parents[3]
BARS = ("Converting and de-quantizing", "Loading weights")


@pytest.fixture(scope="module")
def tiny_gguf(hf_model_dir, tmp_path_factory) -> Path:
    return gguf_from_hf_llama(hf_model_dir("llama"),
                              tmp_path_factory.mktemp("gguf") / "tiny-llama.f32.gguf")


def import_command(gguf: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "libra_cli.main", "model", "import", "--gguf", str(gguf),
            "--out", str(out)]


def child_env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    return env


def test_a_piped_stderr_gets_the_stage_lines_and_no_bars(tiny_gguf: Path,
                                                         tmp_path: Path) -> None:
    done = subprocess.run(import_command(tiny_gguf, tmp_path / "m"), cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[import] done:" in done.stderr
    assert not [bar for bar in BARS if bar in done.stderr], done.stderr
    assert "\r" not in done.stderr


def test_a_terminal_gets_the_bars(tiny_gguf: Path, tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    # A terminal of 24 x 80 (a new pseudo-terminal is 0 x 0: tqdm draws empty lines).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        proc = subprocess.Popen(import_command(tiny_gguf, tmp_path / "m"), cwd=ROOT,
                                env=child_env(), stdout=subprocess.DEVNULL,
                                stderr=follower)
        os.close(follower)
        seen = read_until_closed(leader)
        assert proc.wait(timeout=300) == 0, seen
    finally:
        os.close(leader)
    assert "[import] done:" in seen
    assert all(bar in seen for bar in BARS), seen


def read_until_closed(fd: int) -> str:
    """Everything written to the pseudo-terminal until the child closed its end."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: no writer left
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")
