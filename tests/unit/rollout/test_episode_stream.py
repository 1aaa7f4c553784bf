"""Streamed turn text (services/rollout/episode_stream.py): only text the final reply's
content starts with goes out, piece by piece."""

from __future__ import annotations

import pytest

from services.rollout.episode_stream import TurnStream, streamable_text


@pytest.mark.parametrize("text, stops, sent", [
    ("  Let me see. ", (), "Let me see."),
    ("Let me see. <tool_call>\n{", (), "Let me see."),
    ("Let me see. <tool_", (), "Let me see."),  # may become a tool call's tag
    ("a < b", (), "a < b"),
    ("It is 4. END and more", ("END",), "It is 4."),
    ("It is 4. EN", ("END",), "It is 4."),
])
def test_streamable_text_is_what_the_final_content_starts_with(
        text: str, stops: tuple[str, ...], sent: str) -> None:
    assert streamable_text(text, stops) == sent


def test_a_turn_stream_sends_each_new_piece_once() -> None:
    stream = TurnStream(call_index=2)
    decode = "".join  # "token ids" are characters here
    chunks = ("It ", "is", " 4", ". <tool", "_call>")
    pieces = [stream.take(list(chunk), decode) for chunk in chunks]  # type: ignore[arg-type]
    assert pieces == ["It", " is", " 4", ".", ""]
    assert stream.sent == "It is 4."
