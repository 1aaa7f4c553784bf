"""Every option and argument of every ``libra`` command says what it is in ``--help``
(``libra bench paper --gpus {48,1000}`` said nothing of what the two presets are), and
the ``--gpus`` help names the preset each choice runs (``sim.paper.SCALES``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from libra_cli.main import build_parser, main
from sim.paper import SCALES


def _actions(parser: argparse.ArgumentParser,
             path: tuple[str, ...]) -> Iterator[tuple[str, argparse.Action]]:
    """(command, action) for every option and argument, sub-commands walked."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction):
            yield " ".join(path), action


def test_every_option_of_every_command_has_help_text() -> None:
    missing = [f"{command} {'/'.join(action.option_strings) or action.dest}"
               for command, action in _actions(build_parser(), ("libra",))
               if action.help != argparse.SUPPRESS and not (action.help or "").strip()]
    assert missing == []


def test_bench_paper_help_names_each_gpu_preset(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "paper", "--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for gpus, scale in SCALES.items():
        assert f"{gpus} = {scale['cluster']}" in out
        assert f"{scale['prompts_per_step']} prompts/step, {scale['num_steps']} steps" in out
    for option in ("--gpus", "--seeds", "--oracle", "--held-out", "--jobs", "--out-dir",
                   "--json"):
        assert option in out
