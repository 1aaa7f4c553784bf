"""services/rollout/transcript.py: how the text of several returns rendered together is
split across their tool messages (pure)."""

from __future__ import annotations

import pytest

from services.rollout.transcript import split_returns


@pytest.mark.parametrize("text, n, want", [
    ("<res>3</res><err>busy</err>", 2, ["<res>3</res>", "<err>busy</err>"]),
    ("<|im_start|>user\n<tool_response>\n84\n</tool_response>\n<tool_response>\n2\n"
     "</tool_response><|im_end|>", 2, ["84", "2"]),
    # Unmarked (or a count that does not match): the whole text on the first message.
    ("[84] [2]", 2, ["[84] [2]", ""]),
    ("<res>3</res>", 2, ["<res>3</res>", ""]),
    ("<res>3</res>", 1, ["<res>3</res>"]),
])
def test_returns_are_split_where_the_rendering_marks_them(text, n, want) -> None:
    assert split_returns(text, n) == want
