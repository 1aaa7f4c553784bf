"""One dataset row as the runtime sees it, and how a raw row becomes one (pure).

A raw row is a mapping of column name to value (a JSONL object, a Parquet or Arrow row
as ``datasets`` returns it). The job spec's field mapping (:class:`FieldMap`) names
the columns; :func:`render_row` turns a raw row into a :class:`DatasetRow` or raises
:class:`RowError` naming the spec field and the row number, the same check at submit
(coordinator) and when a prompt is served (scheduler, warm start).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from libra.errors import InvalidArgument
from libra.types import PromptId

Message = dict[str, Any]
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class FieldMap:
    """Which column holds what (``""``: not mapped). Exactly one of ``prompt`` and
    ``messages`` is set for a file dataset."""

    prompt: str = ""
    messages: str = ""
    reference: str = ""
    metadata: str = ""
    demonstration: str = ""

    def columns(self) -> dict[str, str]:
        """Mapped columns by the spec field that names them (``task.prompt_field``...)."""
        named = {"task.prompt_field": self.prompt, "task.messages_field": self.messages,
                 "task.reference_field": self.reference, "task.metadata_field": self.metadata,
                 "task.demonstration_field": self.demonstration}
        return {spec_field: column for spec_field, column in named.items() if column}


@dataclass(frozen=True, slots=True)
class DatasetRow:
    """A prompt as the scheduler hands it out.

    Attributes:
        prompt_id: Stable id of the row (the same prompt recurs under it every epoch).
        prompt_text: The text prompt; for a messages row, the messages' contents joined
            by newlines (length estimates and logs; the agent renders the messages).
        reference: What the reward compares the answer with (text as given; any other
            value as JSON).
        prompt_messages_json: ``""`` for a text prompt, else the chat messages (JSON).
        metadata_json: The row's ``metadata_field`` value as JSON (``""``: none).
        demonstration_json: The row's warm-start conversation as JSON (``""``: none).
    """

    prompt_id: PromptId
    prompt_text: str
    reference: str
    prompt_messages_json: str = ""
    metadata_json: str = ""
    demonstration_json: str = ""

    def messages(self) -> list[Message]:
        """The prompt as chat messages (a text prompt is one user message)."""
        if self.prompt_messages_json:
            return json.loads(self.prompt_messages_json)
        return [{"role": "user", "content": self.prompt_text}]

    def demonstration(self) -> list[Message] | None:
        """The warm-start conversation, or None when the row has none."""
        return json.loads(self.demonstration_json) if self.demonstration_json else None


class RowError(InvalidArgument):
    """A row that cannot be rendered: ``field`` is the spec field, ``row`` the row number."""

    def __init__(self, field: str, row: int, reason: str) -> None:
        super().__init__(field, f"row {row} {reason}")
        self.row = row


def render_row(raw: Mapping[str, Any], row: int, fields: FieldMap,
               prompt_id: PromptId) -> DatasetRow:
    """The :class:`DatasetRow` of raw row number ``row`` (counted from 0).

    Raises:
        RowError: A mapped field is missing or null, a prompt is empty or not text, or
            messages are not a chat prompt (roles, text contents, ending with a user or
            tool turn); the error names the spec field and the row.
    """
    if fields.messages:
        messages = _prompt_messages(_value(raw, fields.messages, "task.messages_field", row),
                                    fields.messages, row)
        text = "\n".join(m["content"] for m in messages)
        messages_json = _dumps(messages)
    else:
        text = _text(_value(raw, fields.prompt, "task.prompt_field", row), fields.prompt, row)
        messages_json = ""
    reference = _value(raw, fields.reference, "task.reference_field", row)
    metadata = raw.get(fields.metadata) if fields.metadata else None
    demo = ""
    if fields.demonstration:
        demo = _dumps(_demonstration(_value(raw, fields.demonstration,
                                            "task.demonstration_field", row),
                                     fields.demonstration, row))
    return DatasetRow(prompt_id=prompt_id, prompt_text=text,
                      reference=reference if isinstance(reference, str) else _dumps(reference),
                      prompt_messages_json=messages_json,
                      metadata_json="" if metadata is None else _dumps(metadata),
                      demonstration_json=demo)


def _value(raw: Mapping[str, Any], column: str, spec_field: str, row: int) -> Any:
    value = raw.get(column)
    if value is None:
        raise RowError(spec_field, row, f"has no field {column!r}")
    return value


def _text(value: Any, column: str, row: int) -> str:
    if not isinstance(value, str):
        raise RowError("task.prompt_field", row,
                       f"field {column!r} is {type(value).__name__}, not text")
    if not value.strip():
        raise RowError("task.prompt_field", row, f"field {column!r} is empty")
    return value


def _messages(value: Any, spec_field: str, column: str, row: int) -> list[Message]:
    """Messages with null keys dropped (Arrow fills keys another row has with null)."""
    if not isinstance(value, list) or not value:
        raise RowError(spec_field, row, f"field {column!r} is not a non-empty list of "
                       "messages ({\"role\", \"content\"})")
    messages = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise RowError(spec_field, row, f"message {i} of {column!r} is not an object")
        message = _drop_nulls(item)
        if message.get("role") not in ROLES:
            raise RowError(spec_field, row, f"message {i} of {column!r} has role "
                           f"{message.get('role')!r} (roles: {', '.join(ROLES)})")
        if not isinstance(message.get("content", ""), str):
            raise RowError(spec_field, row, f"message {i} of {column!r} has non-text content")
        messages.append(message)
    return messages


def _prompt_messages(value: Any, column: str, row: int) -> list[Message]:
    messages = _messages(value, "task.messages_field", column, row)
    for i, message in enumerate(messages):
        if not isinstance(message.get("content"), str):
            raise RowError("task.messages_field", row,
                           f"message {i} of {column!r} has no text content")
    if messages[-1]["role"] == "assistant" or not any(m["role"] == "user" for m in messages):
        raise RowError("task.messages_field", row, f"field {column!r} is not a prompt: it "
                       "needs a user message and must not end with an assistant message")
    return messages


def _demonstration(value: Any, column: str, row: int) -> list[Message]:
    messages = _messages(value, "task.demonstration_field", column, row)
    roles = [m["role"] for m in messages]
    if roles[0] == "assistant" or roles[-1] != "assistant":
        raise RowError("task.demonstration_field", row, f"field {column!r} is not a "
                       "conversation: prompt messages, then assistant turns, ending with "
                       "an assistant message")
    return messages


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
