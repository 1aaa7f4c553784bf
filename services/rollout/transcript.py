"""The whole trajectory as messages, for the reward (``libra.types.ScoreInput``).

Rebuilt from what the trajectory already carries, so a handed-over trajectory needs
nothing extra: the prompt messages, then the generated part split into runs of the
loss mask: a run of model tokens (mask 1) is one assistant turn, parsed again for its
tool calls; a run of context tokens (mask 0) holds the returns of that turn's calls
(``tool_states`` give each return's tool and status, in order). Each tool message's
content is that return's own text where the rendering marks returns (the Hermes/Qwen
``<tool_response>`` blocks, the arith ``<res>``/``<err>`` tags) and their number matches;
otherwise the run's whole text (template markup included) goes on the turn's first tool
message and the others carry tool and status only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

from libra import types as t
from libra.chat.toolcalls import ParsedTurn

_RETURN = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>|(<(res|err)>.*?</\3>)",
                     re.S)


def split_returns(text: str, num_returns: int) -> list[str]:
    """The text of each of ``num_returns`` returns rendered together in ``text``."""
    found = [m.group(1) if m.group(1) is not None else m.group(2)
             for m in _RETURN.finditer(text)]
    if len(found) == num_returns:
        return found
    return [text] + [""] * (num_returns - 1)


def _runs(traj: t.Trajectory) -> Iterator[tuple[int, int, int]]:
    """(mask, start, end) of each same-mask run after the prompt."""
    start = traj.num_prompt_tokens
    for i in range(start + 1, len(traj.token_ids) + 1):
        if i == len(traj.token_ids) or traj.loss_mask[i] != traj.loss_mask[start]:
            yield traj.loss_mask[start], start, i
            start = i


def build_transcript(traj: t.Trajectory, prompt: list[dict], decode: Callable[[list[int]], str],
                     parse: Callable[[str], ParsedTurn]) -> tuple[t.TranscriptMessage, ...]:
    """Messages of ``traj``: ``prompt`` (chat messages), then its turns and tool returns.

    ``decode`` turns one run of ids into text, ``parse`` reads an assistant turn's calls
    (the agent's own, so the reward sees the calls the agent acted on)."""
    messages = [t.TranscriptMessage(str(m.get("role", "user")), str(m.get("content") or ""))
                for m in prompt]
    num_returns = 0
    for mask, start, end in _runs(traj):
        text = decode(traj.token_ids[start:end])
        if mask:
            calls = tuple(t.TranscriptToolCall(c.name, json.dumps(c.arguments, sort_keys=True))
                          for c in parse(text).calls)
            messages.append(t.TranscriptMessage("assistant", text, calls))
            continue
        # The returns that ended at this run's end (tool_return_positions count from the
        # end of the prompt).
        ends = [i for i, pos in enumerate(traj.tool_return_positions)
                if pos == end - traj.num_prompt_tokens and i >= num_returns]
        texts = split_returns(text, max(len(ends), 1))
        for k, index in enumerate(ends or [None]):
            state = traj.tool_states[index] if index is not None else None
            messages.append(t.TranscriptMessage(
                "tool", texts[k], name=state.tool_type if state else "",
                tool_status=state.status.value if state else ""))
        num_returns += len(ends)
    return tuple(messages)
