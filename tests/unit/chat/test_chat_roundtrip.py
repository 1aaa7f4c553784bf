"""Property test: a conversation built incrementally (prompt, sampled turns, tool turns)
equals the template's full re-render, up to the documented differences only.

Documented differences (docs/chat-protocol.md), for the ChatML families here:
1. the full render ends with the newline the template writes after the final
   ``<|im_end|>``; a sampled turn stops at ``<|im_end|>`` (the stop token);
2. assistant content that begins with whitespace may merge with the header's newline
   in the full render (same text, other ids); models start content with text, so the
   random conversations do too and a separate test pins the difference down.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from tokenizers import AddedToken

from libra.chat import ChatFormat, ToolCall
from tests.unit.chat.builders import FAMILIES, TOOLS, chat_format, fresh_tokenizer, tokenizer

NUM_CONVERSATIONS = 200
SEED = 20260101
# Multilingual, JSON-ish, tag-ish and whitespace-heavy pieces: byte-level BPE must
# round-trip all of them, and boundaries between pieces vary.
_WORDS = ["the", "eggs", "42", "3.5", "-7", "caf\u00e9", "\u6771\u4eac", "\U0001f642", "(", ")",
          "+", "*", "?", "!", ",", "'s", "don't", "<b>", "\\", '"quoted"', "{json}", "x=y",
          "You", "assistant", "user", "<tool>", "</think>", "tab\tbed", "\u00a0nbsp"]
_SEPARATORS = [" ", " ", " ", "", "\n", "\n\n", "  ", "\t"]
Message = dict[str, Any]


def random_text(rng: random.Random, max_words: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(1, max_words))]
    return "".join(w + rng.choice(_SEPARATORS) for w in words[:-1]) + words[-1]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["str", "int", "float", "bool", "null", "list", "dict"][:7 - 2 * depth])
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "dict":
        return {random_text(rng, 2): random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return {"str": lambda: random_text(rng, 4), "int": lambda: rng.randint(-10**6, 10**6),
            "float": lambda: round(rng.uniform(-100, 100), rng.randint(0, 6)),
            "bool": lambda: rng.random() < 0.5, "null": lambda: None}[kind]()


def random_call(rng: random.Random) -> ToolCall:
    name = rng.choice([t["function"]["name"] for t in TOOLS] + ["lookup_v2"])
    return ToolCall(name, {random_text(rng, 1): random_json(rng) for _ in range(rng.randint(0, 3))})


def random_content(rng: random.Random, *, final: bool) -> str:
    """Assistant text as a model writes it: starts with text, may think first."""
    if not final and rng.random() < 0.4:
        return ""
    text = rng.choice(["Sure", "So", "42", "<think>"]) + " " + random_text(rng, 8)
    if text.startswith("<think>"):
        text += "</think>\n\n" + ("The answer is " + random_text(rng, 3) if final else "Calling.")
    return text


def random_conversation(rng: random.Random) -> list[Message]:
    """Optional system message; 1-2 user rounds of 0-3 tool rounds with 1-3 calls each
    (a tool message per call) and a final answer."""
    messages: list[Message] = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": random_text(rng, 6)})
    for _ in range(rng.randint(1, 2)):
        messages.append({"role": "user", "content": random_text(rng, 12)})
        for _ in range(rng.randint(0, 3)):
            calls = [random_call(rng) for _ in range(rng.randint(1, 3))]
            messages.append({"role": "assistant", "content": random_content(rng, final=False),
                             "tool_calls": [c.to_openai() for c in calls]})
            messages += [{"role": "tool", "name": c.name, "content": random_text(rng, 10)}
                         for c in calls]
        messages.append({"role": "assistant", "content": random_content(rng, final=True)})
    return messages


def rollout(fmt: ChatFormat, messages: list[Message]) -> tuple[list[int], list[int],
                                                               list[list[int]]]:
    """What the agent loop appends: the prompt, each sampled turn (here: the turn the
    model should sample) and each tool turn. Returns (ids, mask, sampled turns)."""
    start = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = fmt.prompt_ids(messages[:start])
    mask, sampled = [0] * len(ids), []
    for is_assistant, group in itertools.groupby(messages[start:],
                                                 key=lambda m: m["role"] == "assistant"):
        run = list(group)
        if is_assistant:
            (message,) = run  # assistant turns are never adjacent here
            calls = [ToolCall.from_openai(c) for c in message.get("tool_calls", [])]
            piece = fmt.assistant_ids(message["content"], calls)
            check_parses_back(fmt, piece, message["content"], calls)
            sampled.append(piece)
        else:
            piece = fmt.tool_turn_ids(run, turn_closed=True)
        ids, mask = ids + piece, mask + [int(is_assistant)] * len(piece)
    return ids, mask, sampled


def check_parses_back(fmt: ChatFormat, turn_ids: list[int], content: str,
                      calls: list[ToolCall]) -> None:
    """The parser reads a demonstration turn back to the same calls or answer."""
    assert turn_ids[-1] == fmt.end_of_turn_id
    turn = fmt.parser.parse(fmt.tokenizer.decode(turn_ids[:-1]))
    assert (turn.calls, turn.errors, turn.final) == (calls, [], not calls)
    assert turn.content == content.strip()
    if not calls:
        assert turn.answer == expected_answer(content)


def expected_answer(content: str) -> str | None:
    """The spec: the content without a leading think block; empty is no answer."""
    if content.startswith("<think>"):
        content = content.split("</think>", 1)[1]
    return content.strip() or None


def mask_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for trainable, group in itertools.groupby(zip(ids, mask, strict=True), key=lambda p: p[1]):
        if trainable:
            runs.append([token for token, _ in group])
    return runs


def describe_difference(tok: Any, incremental: list[int], full: list[int]) -> str:
    """Where two id sequences part: the index and the tokens on both sides."""
    at = next((i for i, (a, b) in enumerate(zip(incremental, full, strict=False))
               if a != b),
              min(len(incremental), len(full)))
    window = slice(max(at - 3, 0), at + 4)
    return (f"differ at id {at} of {len(incremental)} (incremental) / {len(full)} (full): "
            f"incremental {tok.convert_ids_to_tokens(incremental[window])} vs "
            f"full {tok.convert_ids_to_tokens(full[window])}")


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_build_matches_the_full_render_up_to_the_final_newline(family):
    fmt, tok = chat_format(family, system_prompt="You solve problems."), tokenizer(family)
    rng = random.Random(f"{SEED}-{family}")
    tails, num_turns, num_calls = set(), 0, 0
    for index in range(NUM_CONVERSATIONS):
        messages = random_conversation(rng)
        ids, mask, sampled = rollout(fmt, messages)
        num_turns += len(sampled)
        num_calls += sum(len(m.get("tool_calls", [])) for m in messages)
        # What is sampled is what is trained: mask-1 ids are exactly the sampled turns.
        assert mask_runs(ids, mask) == sampled
        assert fmt.demonstration(messages) == (ids, mask), f"conversation {index}"
        full = fmt.render_ids(messages)
        assert full[:len(ids)] == ids, (f"conversation {index}: "
                                        + describe_difference(tok, ids, full)
                                        + f"\nmessages: {json.dumps(messages)[:2000]}")
        tails.add(tok.decode(full[len(ids):]))
        assert tok.decode(ids) + "\n" == fmt.render_text(messages), f"conversation {index}"
    assert tails == {"\n"}  # the only documented difference, seen in every conversation
    assert num_turns > 2 * NUM_CONVERSATIONS and num_calls > NUM_CONVERSATIONS  # not trivial


def test_leading_whitespace_in_content_can_merge_with_the_header_in_a_full_render():
    tok = fresh_tokenizer("qwen2")
    # A merged "\n\n" token, as real vocabularies have: the header's newline and the
    # content's leading newlines then split differently in one long string.
    tok.add_tokens([AddedToken("\n\n", normalized=False)])
    fmt = ChatFormat(tok, tools=TOOLS, parser=chat_format("qwen2").parser)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\n\nhi"}]
    ids, _ = fmt.demonstration(messages)
    full = fmt.render_ids(messages)
    assert tok.decode(ids) + "\n" == fmt.render_text(messages)  # same text...
    assert full[:len(ids)] != ids  # ...other ids, and only inside that assistant turn:
    header = fmt.prompt_ids(messages[:1])
    assert full[:len(header) - 1] == header[:-1]
    assert tok.decode(full[len(header) - 1:]) == tok.decode(ids[len(header) - 1:]) + "\n"
