"""The agent endpoint's pure rules: request checks naming the field, the message-level
extension check (extend / split), and the response shapes."""

from __future__ import annotations

import json

import pytest

from libra import episodes as ep
from libra.errors import InvalidArgument
from services.coordinator.episode_core import (
    ModelNotFound,
    after_call,
    completion_body,
    parse_request,
    plan_call,
    stream_chunks,
    whole_call,
)

MODEL = "smollm2-135m-instruct"
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}]
REPLY = ep.EpisodeReply(call_index=1, content="", finish_reason="tool_calls",
                        tool_calls=(ep.ToolCallOut("call_1", "calculator",
                                                   '{"expression": "2+3"}'),),
                        prompt_tokens=40, completion_tokens=12)


def state() -> ep.EpisodeState:
    return ep.EpisodeState(episode_id="tr-1", job_id="job-1", model=MODEL, key_sha256="x",
                           idle_timeout_s=60.0)


def body(messages: list[dict], **extra: object) -> dict:
    return {"model": MODEL, "messages": messages, "tools": TOOLS, **extra}


def first_exchange() -> tuple[ep.EpisodeState, list[dict]]:
    """One call answered with a calculator call; returns the state and the messages an
    agent sends next (its history, the reply as the openai client dumps it, the result)."""
    user = [{"role": "user", "content": "2+3?"}]
    request = parse_request(body(user), MODEL)
    call = plan_call(state(), request)
    after = after_call(state(), request, call, REPLY)
    echoed = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "calculator", "arguments": '{"expression":"2+3"}'}}]}
    return after, [*user, echoed, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]


@pytest.mark.parametrize("bad, field", [
    (body([]), "messages"),
    (body([{"role": "robot", "content": "hi"}]), "messages[0].role"),
    (body([{"role": "user", "content": 3}]), "messages[0].content"),
    (body([{"role": "tool", "content": "5"}]), "messages[0].tool_call_id"),
    (body([{"role": "user", "content": "hi"}], tools=[{"type": "function"}]),
     "tools[0].function"),
    (body([{"role": "user", "content": "hi"}], tools=[{"type": "retrieval"}]), "tools[0].type"),
    (body([{"role": "user", "content": "hi"}],
          tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]),
     "tools[0].function.parameters"),
    (body([{"role": "user", "content": "hi"}],
          tool_choice={"type": "function", "function": {"name": "search"}}), "tool_choice"),
    (body([{"role": "user", "content": "hi"}], n=2), "n"),
    (body([{"role": "user", "content": "hi"}], max_tokens=-1), "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    (body([{"role": "user", "content": "hi"}], max_completion_tokens="8"),
     "max_completion_tokens"),
    (body([{"role": "user", "content": "hi"}], stop=["a", ""]), "stop"),
    (body([{"role": "user", "content": "hi"}], stop=["a", "b", "c", "d", "e"]), "stop"),
    (body([{"role": "user", "content": "hi"}], seed="7"), "seed"),
    (body([{"role": "user", "content": "hi"}], temperature="hot"), "temperature"),
])
def test_a_malformed_request_names_its_field(bad: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_request(bad, MODEL)
    assert refused.value.field == field


@pytest.mark.parametrize("field, value", [
    ("temperature", 0.0), ("temperature", 0.7), ("top_p", 0.9),
    ("frequency_penalty", 0.5), ("presence_penalty", -1.0), ("logit_bias", {"50256": -100}),
])
def test_sampling_the_trainer_cannot_account_for_is_refused_naming_the_field(
        field: str, value: object) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_request(body([{"role": "user", "content": "hi"}], **{field: value}), MODEL,
                      temperature=1.0, top_p=1.0)
    assert refused.value.field == field


def test_the_jobs_own_sampling_and_the_per_call_fields_are_taken() -> None:
    request = parse_request(body([{"role": "user", "content": "hi"}], temperature=0.6,
                                 top_p=0.95, frequency_penalty=0, stop="END", seed=7,
                                 max_completion_tokens=12), MODEL, temperature=0.6, top_p=0.95)
    assert (request.stop, request.seed, request.max_tokens) == (("END",), 7, 12)
    call = plan_call(state(), request)
    assert ep.decode(ep.EpisodeCall, ep.encode(call)) == call  # the codec keeps them
    assert (call.stop, call.seed, call.max_tokens) == (("END",), 7, 12)


def test_another_model_is_not_found_naming_it() -> None:
    with pytest.raises(ModelNotFound, match="gpt-4o"):
        parse_request({**body([{"role": "user", "content": "hi"}]), "model": "gpt-4o"}, MODEL)


def test_the_first_call_sends_the_whole_conversation() -> None:
    call = plan_call(state(), parse_request(body([{"role": "user", "content": "2+3?"}]), MODEL))
    assert (call.is_whole, call.is_split, call.call_index) == (True, False, 1)


def test_a_call_that_repeats_the_reply_sends_only_the_new_messages() -> None:
    after, messages = first_exchange()
    call = plan_call(after, parse_request(body(messages), MODEL))
    assert not call.is_whole and not call.is_split
    # The tool message gets its tool's name from the call it answers (the causal signal).
    assert json.loads(call.messages_json) == [
        {"role": "tool", "content": "5", "tool_call_id": "call_1", "name": "calculator"}]


def test_a_call_that_extends_names_the_tokens_it_extends_and_a_resend_is_whole() -> None:
    """A rollout holding another count (re-placed from an older state) answers RESYNC;
    the endpoint then sends the same call again with the whole conversation."""
    after, messages = first_exchange()
    assert after.num_context_tokens == 40 + 12  # the reply's prompt and completion
    request = parse_request(body(messages), MODEL)
    call = plan_call(after, request)
    assert call.num_context_tokens == 52 and not call.is_whole
    again = whole_call(request, call.call_index, is_split=False)
    assert (again.is_whole, again.is_split, again.call_index) == (True, False, 2)
    assert json.loads(again.messages_json) == request.messages
    assert again.num_context_tokens == 0  # nothing to check against: it renders all


@pytest.mark.parametrize("rewrite", ["edited_user", "other_arguments", "tools_changed",
                                     "assistant_appended"])
def test_a_conversation_that_does_not_extend_is_a_split(rewrite: str) -> None:
    after, messages = first_exchange()
    extra: dict = {}
    if rewrite == "edited_user":
        messages[0] = {"role": "user", "content": "2+3? (be brief)"}
    elif rewrite == "other_arguments":
        messages[1]["tool_calls"][0]["function"]["arguments"] = '{"expression": "3+2"}'
    elif rewrite == "tools_changed":
        extra = {"tools": [*TOOLS, {"type": "function", "function": {"name": "search"}}]}
    else:
        messages.append({"role": "assistant", "content": "so it is 5"})
    call = plan_call(after, parse_request(body(messages, **extra), MODEL))
    assert call.is_whole and call.is_split
    after_split = after_call(after, parse_request(body(messages, **extra), MODEL), call, REPLY)
    assert after_split.num_splits == 1


def test_a_refused_call_leaves_the_conversation_as_it_was() -> None:
    after, messages = first_exchange()
    request = parse_request(body(messages), MODEL)
    call = plan_call(after, request)
    refused = after_call(after, request, call, None)
    assert refused.messages_json == after.messages_json and refused.num_calls == 2


def test_responses_are_openai_shaped() -> None:
    completion = completion_body(REPLY, MODEL, "chatcmpl-1", created_s=0)
    message = completion["choices"][0]["message"]
    assert message["content"] is None and completion["choices"][0]["finish_reason"] == \
        "tool_calls"
    assert message["tool_calls"][0]["function"] == {"name": "calculator",
                                                    "arguments": '{"expression": "2+3"}'}
    chunks = stream_chunks(REPLY, MODEL, "chatcmpl-1", created_s=0)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[1]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0


def test_records_round_trip_through_the_one_codec() -> None:
    assert ep.decode(ep.EpisodeReply, ep.encode(REPLY)) == REPLY
    call = ep.EpisodeCall(ep.CLOSE, 3, has_reward=True, reward=0.5)
    assert ep.decode(ep.EpisodeCall, ep.encode(call)) == call
