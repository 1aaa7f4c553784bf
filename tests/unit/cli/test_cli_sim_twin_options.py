"""``libra sim``'s twin options: bad worker counts and slice sizes exit 2 naming the
option; ``--twin-slice-nodes none`` runs the whole-fleet twin (issue 20, sessions 18-19)."""

from __future__ import annotations

import json

import pytest

from libra_cli.main import main


@pytest.mark.parametrize("argv", [
    ("--twin-workers", "0"), ("--twin-workers", "x"),
    ("--twin-slice-nodes", "0"), ("--twin-slice-nodes", "-2"), ("--twin-slice-nodes", "all"),
])
def test_bad_twin_options_exit_2_naming_the_option(capsys, argv) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["sim", "--generate", "search", "--steps", "2", *argv])
    assert exited.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize("value", ["none", "NONE", "2"])
def test_a_slice_size_or_none_runs(capsys, value) -> None:
    code = main(["sim", "--generate", "search", "--steps", "2", "--prompts", "4",
                 "--twin-slice-nodes", value])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["feasible"] and result["twin_runs"] >= 1
