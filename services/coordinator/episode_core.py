"""The OpenAI-compatible agent endpoint's rules (pure: no fastapi, no redis).

Request checks (each bad input is an error naming the field, as the OpenAI API names
its ``param``), the extension check between an episode's calls, and the response
shapes (a ``chat.completion``, or ``chat.completion.chunk`` events for ``stream``).

The extension check is done on messages, not by re-tokenising: the conversation of
call k+1 must start with call k's messages followed by the reply exactly as it was
returned (tool-call ids, names and arguments; argument JSON compared as objects). Then
only the new messages go to the rollout, which appends them as the chat template
renders them after the sampled turn, so the sampled ids are never re-tokenised (a model
rarely re-renders its own sampled text to the same ids). A conversation that does not
extend (history rewritten, tools changed, an assistant message the endpoint did not
write) is sent whole and starts a new training sequence (``episode_splits``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

from libra import episodes as ep
from libra.errors import InvalidArgument, NotFound
from libra.jobspec import JobSpec

ROLES = ("system", "user", "assistant", "tool")
TOOL_CHOICES = ("auto", "none", "required")


class ModelNotFound(NotFound):
    """A request for another model than the episode's job serves (404, as OpenAI)."""

    code = "model_not_found"


class ContextTooLong(InvalidArgument):
    """The conversation does not fit the model's context (400 naming the limit)."""

    code = ep.CONTEXT_LENGTH_EXCEEDED


def model_id(spec: JobSpec) -> str:
    """The model name a job serves (``GET /v1/models``): a Hugging Face directory's
    name, else the built-in model kind."""
    if spec.model.path:
        return spec.model.path.rstrip("/").rsplit("/", 1)[-1]
    return spec.model.kind


@dataclass(frozen=True)
class ChatRequest:
    """A checked ``POST /v1/chat/completions`` body (messages in canonical form)."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    stream: bool = False
    max_tokens: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None


# OpenAI allows at most this many stop sequences per request.
MAX_STOP_STRINGS = 4
# Fields that reshape the sampling distribution and their neutral values: anything else
# is refused (see _check_sampling).
NEUTRAL_FIELDS = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}}


def parse_request(body: Any, model: str, temperature: float = 1.0,
                  top_p: float = 1.0) -> ChatRequest:
    """Check a chat-completions body against the episode's model and its job's sampling
    (``temperature``, ``top_p``: the job's ``algorithm.temperature``/``top_p``).

    Raises:
        InvalidArgument: A malformed field (named: ``messages[2].role``, ``tools[0]``...),
            or a sampling field the trainer cannot account for (``temperature``...).
        ModelNotFound: ``model`` is not the episode's.
    """
    if not isinstance(body, dict):
        raise InvalidArgument("body", "expected a JSON object")
    asked = body.get("model")
    if not isinstance(asked, str) or not asked:
        raise InvalidArgument("model", "required: the job's model name (GET /v1/models)")
    if asked != model:
        raise ModelNotFound(f"The model '{asked}' does not exist or is not served to this "
                            f"episode (it serves '{model}')")
    tools = _checked_tools(body.get("tools"))
    _check_tool_choice(body.get("tool_choice"), tools)
    if body.get("n", 1) != 1:
        raise InvalidArgument("n", "only n = 1 is supported (one sample per call)")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidArgument("stream", "must be a boolean")
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = body.get(limit) or 0
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise InvalidArgument(limit, "must be a positive integer")
    _check_sampling(body, temperature, top_p)
    return ChatRequest(asked, canonical_messages(body.get("messages")), tools, stream,
                       max_tokens, _checked_stop(body.get("stop")), _checked_seed(body))


def _check_sampling(body: dict[str, Any], temperature: float, top_p: float) -> None:
    """Refuse sampling the trainer cannot account for. The trainer takes the recorded
    log-probs as the behaviour policy's and recomputes them under the job's sampling;
    a per-call temperature, nucleus or penalty would sample from another distribution
    than the one recorded (the engines record the raw softmax log-prob). The job's own
    values (or none) are accepted."""
    for name, job_value in (("temperature", temperature), ("top_p", top_p)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidArgument(name, "must be a number")
        if abs(value - job_value) > 1e-9:
            raise InvalidArgument(name, (
                f"{value:g} differs from the job's algorithm.{name} = {job_value:g}: "
                "training needs the policy's own samples; leave it out or send the job's"))
    for name, neutral in NEUTRAL_FIELDS.items():
        if body.get(name) not in (None, neutral):
            raise InvalidArgument(name, f"only {neutral!r} is supported: it would change "
                                  "the sampling distribution the trainer accounts for")


def _checked_stop(raw: Any) -> tuple[str, ...]:
    stops = [raw] if isinstance(raw, str) else [] if raw is None else raw
    if (not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stops)):
        raise InvalidArgument("stop", f"a non-empty string or a list of at most "
                              f"{MAX_STOP_STRINGS} non-empty strings")
    return tuple(stops)


def _checked_seed(body: dict[str, Any]) -> int | None:
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidArgument("seed", "must be an integer")
    return seed


def canonical_messages(raw: Any) -> list[dict[str, Any]]:
    """Messages as the template renders them and the extension check compares them:
    text content, tool calls with decoded arguments, tool messages with their name.

    Raises:
        InvalidArgument: Not a non-empty list of messages (the field named).
    """
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument("messages", "must be a non-empty list of messages")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for index, message in enumerate(raw):
        out.append(_canonical(message, f"messages[{index}]", names))
    return out


def _canonical(message: Any, path: str, names: dict[str, str]) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise InvalidArgument(path, "must be an object with role and content")
    role = message.get("role")
    if role not in ROLES:
        raise InvalidArgument(f"{path}.role", f"must be one of {list(ROLES)}, got {role!r}")
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"), path)}
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [_canonical_call(c, f"{path}.tool_calls[{i}]", names)
                             for i, c in enumerate(message["tool_calls"])]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidArgument(f"{path}.tool_call_id", "required for a tool message")
        out["tool_call_id"] = call_id
        out["name"] = message.get("name") or names.get(call_id, "tool")
    return out


def _text(content: Any, path: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidArgument(f"{path}.content", "must be a string or a list of text parts")


def _canonical_call(call: Any, path: str, names: dict[str, str]) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidArgument(f"{path}.function", "must be an object with a name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"{path}.function.arguments", f"not JSON: {exc}") from exc
    if not isinstance(arguments, dict):
        raise InvalidArgument(f"{path}.function.arguments", "must be a JSON object")
    call_id = str(call.get("id") or "")
    names[call_id] = function["name"]
    return {"id": call_id, "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}


def _checked_tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidArgument("tools", "must be a list of function tools")
    for index, tool in enumerate(raw):
        path = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InvalidArgument(f"{path}.type", 'must be "function"')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidArgument(f"{path}.function", "must be an object")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidArgument(f"{path}.function.name", "must be a non-empty string")
        if not isinstance(function.get("parameters", {}), dict):
            raise InvalidArgument(f"{path}.function.parameters", "must be a JSON schema object")
    return raw


def _check_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> None:
    """``tool_choice`` is checked but advisory: the policy samples freely (training
    must see what it would do), and the program sees the result."""
    if choice is None or choice in TOOL_CHOICES:
        return
    names = {tool["function"]["name"] for tool in tools}
    function = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(function, dict) or function.get("name") not in names:
        raise InvalidArgument("tool_choice", f"one of {list(TOOL_CHOICES)} or "
                              '{"type": "function", "function": {"name": <a tool in tools>}}')


def plan_call(state: ep.EpisodeState, request: ChatRequest) -> ep.EpisodeCall:
    """The call to send the rollout: the new messages when the conversation extends
    the previous one, else the whole conversation (a split when a reply was given)."""
    previous = json.loads(state.messages_json)
    tools_json = json.dumps(request.tools)  # as given: the template renders them in order
    index = state.num_calls + 1
    new = request.messages[len(previous):]
    extends = (bool(previous) and request.messages[:len(previous)] == previous and bool(new)
               and all(m["role"] != "assistant" for m in new)
               and tools_json == state.tools_json)
    if extends:
        return ep.EpisodeCall(ep.CALL, index, json.dumps(new), tools_json,
                              max_tokens=request.max_tokens, stop=request.stop,
                              seed=request.seed, stream=request.stream,
                              num_context_tokens=state.num_context_tokens)
    return whole_call(request, index, is_split=bool(previous))


def whole_call(request: ChatRequest, call_index: int, is_split: bool) -> ep.EpisodeCall:
    """The call carrying the whole conversation: the first call, a rewritten history
    (``is_split``), or a call sent again for a rollout that answered ``RESYNC``."""
    return ep.EpisodeCall(ep.CALL, call_index, json.dumps(request.messages),
                          json.dumps(request.tools), is_whole=True, is_split=is_split,
                          max_tokens=request.max_tokens, stop=request.stop, seed=request.seed,
                          stream=request.stream)


def after_call(state: ep.EpisodeState, request: ChatRequest, call: ep.EpisodeCall,
               reply: ep.EpisodeReply | None) -> ep.EpisodeState:
    """The state after a call: counted; with a reply, the conversation now ends with it
    (None: refused or aborted, the conversation stays as it was)."""
    state = replace(state, num_calls=call.call_index,
                    num_splits=state.num_splits + int(call.is_split and reply is not None))
    if reply is None:
        return state
    messages = [*request.messages, assistant_message(reply)]
    return replace(state, messages_json=json.dumps(messages), tools_json=call.tools_json,
                   num_context_tokens=reply.prompt_tokens + reply.completion_tokens)


def assistant_message(reply: ep.EpisodeReply) -> dict[str, Any]:
    """The reply as the canonical assistant message the next call must repeat."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.call_id, "type": "function",
             "function": {"name": c.name, "arguments": json.loads(c.arguments_json)}}
            for c in reply.tool_calls]
    return message


def reply_error(reply: ep.EpisodeReply) -> InvalidArgument:
    """A refused call's error (400) for the program."""
    if reply.error_code == ep.CONTEXT_LENGTH_EXCEEDED:
        return ContextTooLong("messages", reply.error_message)
    return InvalidArgument("messages", reply.error_message)


def _openai_calls(reply: ep.EpisodeReply, with_index: bool = False) -> list[dict[str, Any]]:
    calls = []
    for index, c in enumerate(reply.tool_calls):
        entry: dict[str, Any] = {"id": c.call_id, "type": "function",
                                 "function": {"name": c.name, "arguments": c.arguments_json}}
        if with_index:
            entry["index"] = index
        calls.append(entry)
    return calls


def completion_body(reply: ep.EpisodeReply, model: str, completion_id: str,
                    created_s: int | None = None) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.tool_calls:
        message["tool_calls"] = _openai_calls(reply)
    return {
        "id": completion_id, "object": "chat.completion",
        "created": int(time.time()) if created_s is None else created_s, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason,
                     "logprobs": None}],
        "usage": {"prompt_tokens": reply.prompt_tokens,
                  "completion_tokens": reply.completion_tokens,
                  "total_tokens": reply.prompt_tokens + reply.completion_tokens},
        "system_fingerprint": f"policy-v{reply.policy_version}",
    }


def stream_chunks(reply: ep.EpisodeReply, model: str, completion_id: str,
                  created_s: int | None = None, with_role: bool = True) -> list[dict[str, Any]]:
    """A reply as ``chat.completion.chunk`` events: the role (first reply only), the
    content; for the final reply (not ``is_delta``) also the tool calls and the finish
    reason."""
    created = int(time.time()) if created_s is None else created_s

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [{"index": 0, "delta": delta,
                                             "finish_reason": finish, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})] if with_role else []
    if reply.content:
        chunks.append(chunk({"content": reply.content}))
    if reply.is_delta:
        return chunks
    if reply.tool_calls:
        chunks.append(chunk({"tool_calls": _openai_calls(reply, with_index=True)}))
    chunks.append(chunk({}, reply.finish_reason))
    return chunks


def openai_error(status: int, message: str, param: str | None = None,
                 code: str | None = None) -> dict[str, Any]:
    """An error body as the OpenAI API writes it (the ``openai`` client reads it)."""
    kind = {400: "invalid_request_error", 401: "authentication_error",
            404: "invalid_request_error", 409: "invalid_request_error"}.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
