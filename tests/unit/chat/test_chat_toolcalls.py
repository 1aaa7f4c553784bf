"""Tool-call parsers (libra/chat/toolcalls.py): Hermes JSON calls and the arith tags."""

from __future__ import annotations

import json
import random

import pytest

from libra.chat.toolcalls import (
    PARSERS,
    ArithParser,
    HermesParser,
    ParsedTurn,
    ToolCall,
    get_parser,
)
from libra.tasks import arith

hermes = HermesParser()


def call_text(name: str, arguments: object, *, pad: str = "\n") -> str:
    return f"<tool_call>{pad}{json.dumps({'name': name, 'arguments': arguments})}{pad}</tool_call>"


def test_registry_lists_both_formats_and_lookup_returns_them():
    assert sorted(PARSERS) == ["arith", "hermes"]
    assert get_parser("hermes") is PARSERS["hermes"]
    assert get_parser("arith").name == "arith"


def test_unknown_format_error_lists_known_names():
    known = r"unknown tool-call format 'xml' \(known: arith, hermes\)"
    with pytest.raises(ValueError, match=known):
        get_parser("xml")


def test_hermes_parses_several_calls_in_order_with_content_outside():
    text = ("I will compute both.\n" + call_text("calculator", {"expression": "1+2"})
            + "\n" + call_text("search", {"query": "eggs", "k": 3}, pad=" \n  ") + "\n")
    turn = hermes.parse(text)
    assert turn == ParsedTurn("I will compute both.", [
        ToolCall("calculator", {"expression": "1+2"}),
        ToolCall("search", {"query": "eggs", "k": 3})], [], final=False, answer=None)


def test_hermes_accepts_arguments_as_a_json_string():
    arguments = json.dumps({"expression": "7*6"})
    text = f"<tool_call>{json.dumps({'name': 'calculator', 'arguments': arguments})}</tool_call>"
    assert hermes.parse(text).calls == [ToolCall("calculator", {"expression": "7*6"})]


def test_hermes_call_without_arguments_has_empty_arguments():
    assert hermes.parse('<tool_call>{"name": "now"}</tool_call>').calls == [ToolCall("now", {})]


def test_hermes_bad_json_is_an_error_and_good_calls_survive():
    text = (call_text("calculator", {"expression": "1"})
            + '<tool_call>{"name": "calculator", "arguments": {"expression": 2+}}</tool_call>')
    turn = hermes.parse(text)
    assert turn.calls == [ToolCall("calculator", {"expression": "1"})]
    assert len(turn.errors) == 1 and turn.errors[0].startswith("bad json in tool call 2: ")
    assert not turn.final


@pytest.mark.parametrize(("body", "expected"), [
    ('{"arguments": {}}', "tool call 1 without a name"),
    ('{"name": "", "arguments": {}}', "tool call 1 without a name"),
    ('{"name": 3, "arguments": {}}', "tool call 1 without a name"),
    ('["calculator"]', "tool call 1 must be a JSON object with name and arguments"),
    ('{"name": "calc", "arguments": [1]}', "arguments must be a JSON object, got list"),
    ('{"name": "calc", "arguments": "[1]"}', "arguments must be a JSON object, got list"),
    ('{"name": "calc", "arguments": "{oops"}', "bad json in arguments string"),
])
def test_hermes_malformed_call_becomes_one_error_never_an_exception(body, expected):
    turn = hermes.parse(f"<tool_call>{body}</tool_call>")
    assert turn.calls == [] and len(turn.errors) == 1
    assert expected in turn.errors[0]
    assert not turn.final and turn.answer is None


def test_hermes_unclosed_call_cut_by_the_budget_is_malformed():
    text = call_text("calculator", {"expression": "1"}) + '\n<tool_call>\n{"name": "calcu'
    turn = hermes.parse(text)
    assert turn.calls == [ToolCall("calculator", {"expression": "1"})]
    assert turn.errors == ["tool call 2 is not closed: end it with </tool_call>"]
    assert turn.content == "" and not turn.final


def test_hermes_turn_without_calls_is_final_with_the_content_as_answer():
    turn = hermes.parse("  The answer is 42.\n")
    assert turn == ParsedTurn("The answer is 42.", [], [], final=True, answer="The answer is 42.")


def test_hermes_answer_drops_a_leading_think_block_but_content_keeps_it():
    turn = hermes.parse("<think>\n6*7 is 42\n</think>\n\n42")
    assert turn.final and turn.answer == "42"
    assert turn.content.startswith("<think>")


def test_hermes_turn_cut_while_thinking_ends_without_answer():
    turn = hermes.parse("<think>\nlet me see, 6*7 is")
    assert turn.final and turn.answer is None


def test_hermes_empty_turn_ends_without_answer():
    assert hermes.parse(" \n").answer is None


def test_hermes_stray_closing_tag_stays_in_content():
    turn = hermes.parse("done</tool_call>")
    assert turn.final and turn.content == "done</tool_call>"


def test_hermes_render_call_parses_back_to_the_same_call():
    call = ToolCall("search", {"query": "caf\u00e9 \"quoted\"\n", "k": 2,
                               "deep": {"a": [1.5, None]}})
    text = hermes.render_call(call)
    assert text.startswith("<tool_call>\n{\"name\": \"search\", \"arguments\": ")
    assert text.endswith("}\n</tool_call>") and "caf\u00e9" in text
    assert hermes.parse(text).calls == [call]


def test_tool_call_openai_round_trip_and_string_arguments():
    call = ToolCall("calculator", {"expression": "1+1"})
    assert ToolCall.from_openai(call.to_openai()) == call
    flat = {"name": "calculator", "arguments": '{"expression": "1+1"}'}
    assert ToolCall.from_openai(flat) == call
    with pytest.raises(ValueError, match="without a name"):
        ToolCall.from_openai({"function": {"arguments": {}}})
    with pytest.raises(ValueError, match="must be a JSON object"):
        ToolCall.from_openai({"function": {"name": "x", "arguments": "[]"}})


def test_arith_stop_strings_are_the_task_stop_tags():
    assert ArithParser().stop_strings == arith.STOP_STRINGS
    assert HermesParser().stop_strings == ()


def test_arith_render_call_speaks_the_calc_tag_and_refuses_other_tools():
    parser = ArithParser()
    assert parser.render_call(ToolCall("calculator", {"expression": "2*3"})) == "<calc>2*3</calc>"
    with pytest.raises(ValueError, match="renders only calculator"):
        parser.render_call(ToolCall("search", {"query": "x"}))


_ARITH_PIECES = ["<calc>", "</calc>", "<ans>", "</ans>", "<res>", "</res>", "<err>",
                 "1", "23", "+", "*", "(", ")", " ", "\n", "abc", "Q:", "=", "<", ">"]


def random_arith_text(rng: random.Random) -> str:
    return "".join(rng.choice(_ARITH_PIECES) for _ in range(rng.randint(0, 12)))


def test_arith_parser_matches_parse_action_on_random_strings():
    rng = random.Random(1234)
    parser = ArithParser()
    kinds = set()
    for _ in range(500):
        text = random_arith_text(rng)
        action, turn = arith.parse_action(text), parser.parse(text)
        kinds.add(action.kind)
        assert turn.errors == []
        if action.kind is arith.ActionKind.TOOL_CALL:
            assert turn.calls == [ToolCall("calculator", {"expression": action.argument})]
            assert not turn.final and turn.answer is None, text
        elif action.kind is arith.ActionKind.ANSWER:
            assert turn.calls == [] and turn.final and turn.answer == action.argument, text
        else:
            assert turn.calls == [] and turn.final and turn.answer is None, text
    assert kinds == set(arith.ActionKind)  # the generator reached every branch


def test_arith_content_is_the_text_around_the_first_action():
    turn = ArithParser().parse("let me <calc>1+2</calc> and <ans>3</ans>")
    assert turn.content == "let me  and <ans>3</ans>"
