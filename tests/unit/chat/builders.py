"""Builders for the chat-protocol tests: fixture tokenizers, tool schemas, formats.

Tokenizers are the real byte-level BPE ones of tests/fixtures/hf_models.py (built in
milliseconds); ``tokenizer`` caches one per family for read-only use, tests that change
a tokenizer build their own with ``fresh_tokenizer``.
"""

from __future__ import annotations

import functools
from typing import Any

from libra.chat import ChatFormat, get_parser
from tests.fixtures.hf_models import FAMILIES, build_tokenizer

__all__ = ["FAMILIES", "TOOLS", "chat_format", "fresh_tokenizer", "tokenizer", "tool_schema"]


def tool_schema(name: str, description: str, **properties: str) -> dict[str, Any]:
    """An OpenAI function schema whose parameters are all of the given JSON types."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object",
                       "properties": {k: {"type": v} for k, v in properties.items()},
                       "required": list(properties)}}}


TOOLS = [tool_schema("calculator", "Evaluate an arithmetic expression.", expression="string"),
         tool_schema("search", "Search the corpus.", query="string", k="integer")]


def fresh_tokenizer(family: str) -> Any:
    """A new fixture tokenizer of ``family`` that the caller may change."""
    return build_tokenizer(family)


@functools.cache
def tokenizer(family: str) -> Any:
    """A shared fixture tokenizer of ``family``: do not change it."""
    return build_tokenizer(family)


def chat_format(family: str, *, tools: list[dict[str, Any]] | None = None,
                parser: str = "hermes", **kwargs: Any) -> ChatFormat:
    """A ChatFormat over the shared tokenizer, with TOOLS unless told otherwise."""
    return ChatFormat(tokenizer(family), tools=TOOLS if tools is None else tools,
                      parser=get_parser(parser), **kwargs)
