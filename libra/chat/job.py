"""A job's chat setup, the same in the trainer's warm start and in every rollout (pure)."""

from __future__ import annotations

import json
from typing import Any

from libra.chat.protocol import ChatFormat
from libra.chat.toolcalls import get_parser
from libra.jobspec import JobSpec
from libra.tasks import TASK_SYSTEM_PROMPTS


def openai_tools(spec: JobSpec) -> list[dict[str, Any]]:
    """The job's tools as OpenAI function schemas, in ``tools.enabled`` order."""
    by_name = {schema.name: schema for schema in spec.tools.schemas}
    tools = []
    for name in spec.tools.enabled:
        schema = by_name.get(name)
        if schema is None:
            raise ValueError(f"tools.schemas has no entry for enabled tool {name!r} (the "
                             "coordinator fills it in at submit from the tool gateway)")
        tools.append({"type": "function", "function": {
            "name": name, "description": schema.description,
            "parameters": json.loads(schema.parameters_json or "{}")}})
    return tools


def system_prompt(spec: JobSpec) -> str:
    """``task.system_prompt``, else the task's default (may be empty)."""
    return spec.task.system_prompt or TASK_SYSTEM_PROMPTS.get(spec.task.resolved_kind, "")


def chat_format(spec: JobSpec, tokenizer: Any) -> ChatFormat:
    """The job's :class:`ChatFormat` over a Hugging Face tokenizer."""
    return ChatFormat(tokenizer, tools=openai_tools(spec), tool_template=spec.model.tool_template,
                      system_prompt=system_prompt(spec),
                      parser=get_parser(spec.task.tool_call_format))
