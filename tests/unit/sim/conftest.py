"""Fixtures shared by the simulator's benchmark tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import pytest


@pytest.fixture
def refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[[Callable[[], object], Sequence[str], str], None]:
    """``refused(main, argv, option)``: a benchmark's ``main`` given ``argv`` exits 2
    before any run, naming ``option`` on stderr."""

    def check(main: Callable[[], object], argv: Sequence[str], option: str) -> None:
        monkeypatch.setattr(sys, "argv", ["benchmark", *argv])
        with pytest.raises(SystemExit) as exit_info:
            main()
        assert exit_info.value.code == 2
        assert option in capsys.readouterr().err

    return check
