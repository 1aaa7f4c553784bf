"""Rendering one raw row through the spec's field mapping (libra/data/rows.py; pure)."""

from __future__ import annotations

import json

import pytest

from libra.data import DatasetRow, FieldMap, RowError, render_row
from libra.types import PromptId

TEXT = FieldMap(prompt="question", reference="answer", metadata="meta")
CHAT = FieldMap(messages="messages", reference="answer", demonstration="demo")
PID = PromptId("row-3")


def _chat(*roles: str) -> list[dict]:
    return [{"role": role, "content": f"{role} says hi"} for role in roles]


def test_text_row_carries_prompt_reference_and_metadata() -> None:
    row = render_row({"question": "2+2?", "answer": "4", "meta": {"b": 1, "a": [2]}}, 3,
                     TEXT, PID)
    assert row == DatasetRow(prompt_id=PID, prompt_text="2+2?", reference="4",
                             metadata_json='{"a": [2], "b": 1}')
    assert row.messages() == [{"role": "user", "content": "2+2?"}]


def test_non_text_reference_becomes_json_text() -> None:
    assert render_row({"question": "q", "answer": 42}, 0, TEXT, PID).reference == "42"
    assert render_row({"question": "q", "answer": [1, 2]}, 0, TEXT, PID).reference == "[1, 2]"


def test_row_without_metadata_has_empty_metadata_json() -> None:
    assert render_row({"question": "q", "answer": "a", "meta": None}, 0, TEXT,
                      PID).metadata_json == ""


@pytest.mark.parametrize(("raw", "field", "reason"), [
    ({"answer": "4"}, "task.prompt_field", "row 3 has no field 'question'"),
    ({"question": None, "answer": "4"}, "task.prompt_field", "row 3 has no field 'question'"),
    ({"question": 7, "answer": "4"}, "task.prompt_field", "row 3 field 'question' is int, "
     "not text"),
    ({"question": "  ", "answer": "4"}, "task.prompt_field", "row 3 field 'question' is empty"),
    ({"question": "q"}, "task.reference_field", "row 3 has no field 'answer'"),
])
def test_unrenderable_text_row_names_field_and_row(raw: dict, field: str, reason: str) -> None:
    with pytest.raises(RowError) as err:
        render_row(raw, 3, TEXT, PID)
    assert (err.value.field, err.value.reason, err.value.row) == (field, reason, 3)


def test_messages_row_keeps_messages_and_joins_their_text() -> None:
    raw = {"messages": _chat("system", "user"), "answer": "4",
           "demo": _chat("user", "assistant")}
    row = render_row(raw, 0, CHAT, PID)
    assert row.messages() == _chat("system", "user")
    assert row.prompt_text == "system says hi\nuser says hi"
    assert row.demonstration() == _chat("user", "assistant")


def test_null_keys_arrow_adds_to_messages_are_dropped() -> None:
    messages = [{"role": "user", "content": "hi", "name": None}]
    raw = {"messages": messages, "answer": "4", "demo": _chat("user", "assistant")}
    assert render_row(raw, 0, CHAT, PID).messages() == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("messages", "reason"), [
    ([], "is not a non-empty list"),
    ("hello", "is not a non-empty list"),
    (["hello"], "message 0 of 'messages' is not an object"),
    ([{"role": "bot", "content": "x"}], "message 0 of 'messages' has role 'bot'"),
    ([{"role": "user", "content": 3}], "message 0 of 'messages' has non-text content"),
    ([{"role": "user"}], "message 0 of 'messages' has no text content"),
    (_chat("user", "assistant"), "is not a prompt"),
    (_chat("system"), "is not a prompt"),
])
def test_messages_that_are_not_a_chat_prompt_are_refused(messages: object, reason: str) -> None:
    raw = {"messages": messages, "answer": "4", "demo": _chat("user", "assistant")}
    with pytest.raises(RowError) as err:
        render_row(raw, 5, CHAT, PID)
    assert err.value.field == "task.messages_field" and reason in err.value.reason
    assert err.value.reason.startswith("row 5 ")


@pytest.mark.parametrize("roles", [("user",), ("assistant", "user", "assistant")])
def test_demonstration_must_be_prompt_then_assistant_turns(roles: tuple[str, ...]) -> None:
    raw = {"messages": _chat("user"), "answer": "4", "demo": _chat(*roles)}
    with pytest.raises(RowError) as err:
        render_row(raw, 1, CHAT, PID)
    assert err.value.field == "task.demonstration_field"


def test_demonstration_with_tool_calls_round_trips_as_json() -> None:
    demo = [{"role": "user", "content": "2*3?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"name": "calculator", "arguments": {"expression": "2*3", "x": None}}]},
            {"role": "tool", "name": "calculator", "content": "6"},
            {"role": "assistant", "content": "6"}]
    row = render_row({"messages": _chat("user"), "answer": "6", "demo": demo}, 0, CHAT, PID)
    assert json.loads(row.demonstration_json)[1]["tool_calls"][0]["arguments"] == {
        "expression": "2*3"}


def test_field_map_lists_only_mapped_columns() -> None:
    assert TEXT.columns() == {"task.prompt_field": "question", "task.reference_field": "answer",
                              "task.metadata_field": "meta"}
