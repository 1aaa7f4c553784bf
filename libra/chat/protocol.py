"""The multi-turn token protocol of chat models: messages -> token ids, built incrementally.

The rollout tokenizes the prompt once (:meth:`ChatFormat.prompt_ids`), appends each
sampled assistant turn as the engine produced it, and after each turn appends only the
*delta* tokens the chat template renders for the tool results up to the next assistant
header (:meth:`ChatFormat.tool_turn_ids`). Nothing already in the trajectory is ever
re-tokenized, so the trainer sees exactly the sampled ids (no re-tokenization drift).
Supervised demonstrations use the same pieces (:meth:`ChatFormat.demonstration`).

Deltas are found in text: render a conversation prefix with and without the new
messages, check the longer render starts with the shorter, take the suffix, and
tokenize it with ``add_special_tokens=False``. The tokenizer is duck-typed (a
``transformers`` tokenizer fits); this module imports neither torch nor transformers.
See docs/chat-protocol.md.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from libra.chat.toolcalls import ToolCall, ToolCallParser

TOOL_TEMPLATES = ("auto", "model", "hermes")
HERMES_TEMPLATE_PATH = Path(__file__).with_name("templates") / "hermes.jinja"
# Probe contents: distinctive so they never collide with template text.
_MARKER = "LIBRA_PROBE_MARKER"
_PROBE_USER = "LIBRA_PROBE_USER"
_PROBE_TOOL = {"type": "function", "function": {
    "name": "libra_probe_tool", "description": "probe",
    "parameters": {"type": "object", "properties": {}}}}
_CHATML_START = "<|im_start|>"

Message = dict[str, Any]


@functools.cache
def hermes_template() -> str:
    """The shipped Hermes-style ChatML template (templates/hermes.jinja)."""
    return HERMES_TEMPLATE_PATH.read_text(encoding="utf-8")


class ChatFormat:
    """How one chat model's conversation becomes token ids.

    Args:
        tokenizer: A tokenizer with ``apply_chat_template``, ``encode``, ``decode``,
            ``convert_tokens_to_ids``, ``eos_token_id`` and ``chat_template``.
        tools: OpenAI function schemas (``{"type": "function", "function": {"name",
            "description", "parameters"}}``) rendered into the system prompt.
        tool_template: ``auto`` (the model's template when it renders ``tools``, else
            the shipped Hermes one), ``model`` or ``hermes``.
        system_prompt: System message put first when a conversation has none.
        parser: The tool-call format; its ``render_call`` writes demonstration calls.

    Attributes:
        template_renders_tools: The model's own template renders ``tools`` (probed by
            rendering with and without a tool); False when it has no template.
        template_name: Which template is used, for messages ("the model's chat
            template" or "the shipped Hermes template (hermes.jinja)").
        template_source: The Jinja source of that template.
        end_of_turn_id: The token that ends an assistant turn (ChatML: <|im_end|>),
            read from the template; eos when the template writes no token there.
        end_of_turn_text: Its text.
        stop_token_ids: eos id(s) and ``end_of_turn_id``, for the engine.

    Raises:
        ValueError: Unknown ``tool_template``; no chat template to use; ``model`` with
            tools and a template that ignores them; malformed tool schemas; the shipped
            template for a tokenizer without ChatML tokens; neither an end-of-turn nor
            an eos token.
    """

    def __init__(self, tokenizer: Any, *, tools: Sequence[Message] = (),
                 tool_template: str = "auto", system_prompt: str = "",
                 parser: ToolCallParser) -> None:
        self.tokenizer = tokenizer
        self.tools: list[Message] = _checked_tools(tools)
        self.system_prompt = system_prompt
        self.parser = parser
        self._init_template(tool_template)
        self._init_end_of_turn()

    def _init_template(self, tool_template: str) -> None:
        if tool_template not in TOOL_TEMPLATES:
            raise ValueError(f"tool_template={tool_template!r}: use one of {TOOL_TEMPLATES}")
        model_source = _model_template(self.tokenizer, has_tools=bool(self.tools))
        self.template_renders_tools = (
            model_source is not None and self._renders_tools(model_source))
        if tool_template == "hermes":
            self._use_hermes()
            return
        if model_source is None:
            raise ValueError(
                "the tokenizer has no chat template: use an instruct/chat checkpoint, set "
                "tokenizer.chat_template, or pass tool_template='hermes' to use the shipped "
                "ChatML template (only for models trained on ChatML)")
        if self.template_renders_tools or (tool_template == "model" and not self.tools):
            self.template_source, self.template_name = model_source, "the model's chat template"
        elif tool_template == "model":
            raise ValueError(
                "tool_template='model' but the model's chat template ignores tools=, so the "
                "model would never see the tool schemas: use tool_template='auto' or "
                "'hermes' (the shipped Hermes template)")
        else:
            self._use_hermes()

    def _use_hermes(self) -> None:
        # The shipped template is ChatML: a tokenizer without <|im_start|> as one token
        # was not trained on it and would read the role headers as plain text.
        if len(self._encode(_CHATML_START)) != 1:
            raise ValueError(
                f"the shipped Hermes template is ChatML but the tokenizer has no single "
                f"{_CHATML_START} token: use tool_template='model' with the model's template")
        self.template_source = hermes_template()
        self.template_name = f"the shipped Hermes template ({HERMES_TEMPLATE_PATH.name})"

    def _renders_tools(self, source: str) -> bool:
        probe = [{"role": "user", "content": _PROBE_USER}]
        with_tools = self._render(probe, True, source=source, tools=[_PROBE_TOOL])
        without = self._render(probe, True, source=source, tools=[])
        return with_tools != without and _PROBE_TOOL["function"]["name"] in with_tools

    def _init_end_of_turn(self) -> None:
        # The token right after an assistant message's content ends its turn (ChatML:
        # <|im_end|>); a template that puts plain text there falls back to eos.
        text = self._render(self._with_system(
            [{"role": "user", "content": _PROBE_USER},
             {"role": "assistant", "content": _MARKER}]), False)
        after = text[text.rfind(_MARKER) + len(_MARKER):] if _MARKER in text else ""
        token = self._whole_token_at_start(after)
        eos_ids = _eos_ids(self.tokenizer)
        # False: the sampled turn's closing eos is not in the template's text, so tool
        # turns start right after the assistant content (see tool_turn_ids).
        self._end_of_turn_rendered = token is not None
        if token is None:
            if not eos_ids:
                raise ValueError(f"{self.template_name} puts no special token after an "
                                 "assistant message and the tokenizer has no eos token")
            token = eos_ids[0]
        self.end_of_turn_id: int = token
        self.end_of_turn_text: str = self.tokenizer.decode([token])
        self.stop_token_ids: list[int] = list(dict.fromkeys([*eos_ids, token]))

    def _whole_token_at_start(self, text: str) -> int | None:
        """The first token of ``text`` when it is a vocabulary token of its own (an
        added/special token such as <|im_end|>), else None."""
        ids = self._encode(text)
        if not ids:
            return None
        piece = self.tokenizer.decode([ids[0]])
        is_whole = piece and self.tokenizer.convert_tokens_to_ids(piece) == ids[0]
        return ids[0] if is_whole and text.startswith(piece) else None

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """System (+tools) and the given messages, through the assistant header."""
        if not messages:
            raise ValueError("prompt_ids needs at least one message (e.g. the user's)")
        return self._encode(self._render(self._with_system(messages), True))

    def tool_turn_ids(self, tool_messages: Sequence[Message], *, turn_closed: bool) -> list[int]:
        """Tokens to append after a sampled assistant turn: what the template renders
        after the assistant's end-of-turn token for ``tool_messages`` (tool results,
        or user follow-ups), through the next assistant header.

        Args:
            tool_messages: Messages of roles other than assistant, in order.
            turn_closed: The sampled turn ended with :attr:`end_of_turn_id`. When False
                (cut by the token budget, or ended by another stop token) the
                end-of-turn token is prepended to close it.
        """
        if not tool_messages or any(m.get("role") == "assistant" for m in tool_messages):
            raise ValueError("tool_turn_ids takes one or more non-assistant messages")
        prefix = self._probe_turn(tool_messages)
        closed = self._render(prefix, False)
        longer = self._render([*prefix, *tool_messages], True)
        self._check_extends(closed, longer, "tool messages after an assistant turn")
        ids = self._encode(longer[self._turn_end(closed):])
        return ids if turn_closed else [self.end_of_turn_id, *ids]

    def assistant_ids(self, content: str, calls: Sequence[ToolCall]) -> list[int]:
        """An assistant turn as the model should sample it, ending with end-of-turn.

        Calls are written by the parser's ``render_call``; like Qwen's template, each
        call starts on a new line after non-empty content or a previous call.
        """
        pieces = [content] if content else []
        pieces += [self.parser.render_call(call) for call in calls]
        return [*self._encode("\n".join(pieces)), self.end_of_turn_id]

    def demonstration(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """``(ids, loss_mask)`` of a whole conversation from the incremental pieces:
        the prompt, then each assistant message (mask 1) and each run of other messages
        (mask 0). Assistant ``tool_calls`` (OpenAI entries) become parser-rendered text.

        Raises:
            ValueError: No message before the first assistant message, or the
                conversation does not end with an assistant message.
        """
        roles = [m.get("role") for m in messages]
        if "assistant" not in roles or roles[0] == "assistant" or roles[-1] != "assistant":
            raise ValueError("a demonstration is prompt messages, then assistant turns "
                             "(with tool/user messages between), ending with an assistant")
        start = roles.index("assistant")
        ids = self.prompt_ids(messages[:start])
        mask = [0] * len(ids)
        while start < len(messages):
            if roles[start] == "assistant":
                message, stop = messages[start], start + 1
                calls = [ToolCall.from_openai(c) for c in message.get("tool_calls") or []]
                piece, flag = self.assistant_ids(message.get("content") or "", calls), 1
            else:
                stop = roles.index("assistant", start)
                piece, flag = self.tool_turn_ids(messages[start:stop], turn_closed=True), 0
            ids += piece
            mask += [flag] * len(piece)
            start = stop
        return ids, mask

    def render_ids(self, messages: Sequence[Message], *,
                   add_generation_prompt: bool = False) -> list[int]:
        """The whole conversation re-rendered by the template and tokenized at once
        (for comparison only: training uses the incremental pieces)."""
        return self._encode(self._render(self._with_system(messages), add_generation_prompt))

    def render_text(self, messages: Sequence[Message], *,
                    add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (system prompt and tools included)."""
        return self._render(self._with_system(messages), add_generation_prompt)

    def _with_system(self, messages: Sequence[Message]) -> list[Message]:
        if self.system_prompt and (not messages or messages[0].get("role") != "system"):
            return [{"role": "system", "content": self.system_prompt}, *messages]
        return list(messages)

    def _probe_turn(self, tool_messages: Sequence[Message]) -> list[Message]:
        """A stand-in conversation ending with a closed assistant turn that made one
        call per tool message (some templates look back at the calls)."""
        default_name = self.tools[0]["function"]["name"] if self.tools else "probe"
        calls = [ToolCall(m.get("name") or default_name, {}).to_openai()
                 for m in tool_messages if m.get("role") == "tool"]
        assistant: Message = {"role": "assistant", "content": _MARKER}
        # Without a rendered end-of-turn token the turn's end is found right after the
        # marker, so nothing may follow it inside the turn.
        if calls and self._end_of_turn_rendered:
            assistant["tool_calls"] = calls
        return self._with_system([{"role": "user", "content": _PROBE_USER}, assistant])

    def _turn_end(self, closed: str) -> int:
        """Where the probe's assistant turn ends in its render: after its end-of-turn
        token (the sampled turn holds that token), else right after its content."""
        marker_end = closed.rfind(_MARKER) + len(_MARKER)
        if not self._end_of_turn_rendered:
            return marker_end
        end = closed.find(self.end_of_turn_text, marker_end)
        if end < 0:
            raise ValueError(f"{self.template_name} does not end an assistant turn with "
                             f"{self.end_of_turn_text!r} after tool calls")
        return end + len(self.end_of_turn_text)

    def _check_extends(self, shorter: str, longer: str, what: str) -> None:
        if not longer.startswith(shorter):
            at = len(os.path.commonprefix([shorter, longer]))
            raise ValueError(
                f"{self.template_name} re-renders earlier text when {what} are added "
                f"(renders differ at char {at}: {shorter[at:at + 40]!r} vs "
                f"{longer[at:at + 40]!r}), so turns cannot be appended incrementally: "
                "use tool_template='hermes' or fix the template")

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool, *,
                source: str | None = None, tools: Sequence[Message] | None = None) -> str:
        source = source if source is not None else self.template_source
        tools = self.tools if tools is None else tools
        return self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) or None, chat_template=source,
            add_generation_prompt=add_generation_prompt, tokenize=False)

    def _encode(self, text: str) -> list[int]:
        # Rendered text already holds every special token the template wants.
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _model_template(tokenizer: Any, *, has_tools: bool) -> str | None:
    """The model's template source; of a named set, ``tool_use`` when tools are given
    (as transformers picks), else ``default``."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        if has_tools and template.get("tool_use"):
            return template["tool_use"]
        template = template.get("default")
    return template or None


def _eos_ids(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def _checked_tools(tools: Sequence[Message]) -> list[Message]:
    checked = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (not isinstance(function, dict) or tool.get("type") != "function"
                or not isinstance(function.get("name"), str) or not function["name"]):
            raise ValueError(
                f"tools[{index}] is not an OpenAI function schema: expected "
                '{"type": "function", "function": {"name", "description", "parameters"}}, '
                f"got {tool!r}")
        checked.append(tool)
    return checked
