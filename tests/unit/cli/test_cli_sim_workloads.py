"""``libra sim`` with drift variants: a generated drift trace, and bad workload names or
impossible drift exit 2 naming the problem (issue 20 item 5)."""

from __future__ import annotations

import json

import pytest

from libra_cli.main import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_trace_writes_a_drift_variant(capsys, tmp_path) -> None:
    out_path = tmp_path / "d.jsonl"
    code, out, _ = run_cli(capsys, "sim", "trace", "--shape", "math-drift", "--steps", "3",
                           "--prompts", "2", "--out", str(out_path))
    assert code == 0
    assert json.loads(out) == {"path": str(out_path), "trajectories": 24}
    assert len(out_path.read_text().splitlines()) == 24


@pytest.mark.parametrize("argv", [
    ("sim", "--generate", "r2e-shrink"),
    ("sim", "trace", "--shape", "r2e-shrink", "--out", "unused.jsonl"),
])
def test_unknown_workload_exits_2_listing_the_variants(capsys, argv) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert "unknown workload 'r2e-shrink'" in err and "r2e-drift" in err


def test_drift_that_cannot_grow_exits_2(capsys) -> None:
    code, _, err = run_cli(capsys, "sim", "--generate", "math-drift", "--steps", "1")
    assert code == 2
    assert "length_growth 3.5 needs num_steps >= 2" in err
