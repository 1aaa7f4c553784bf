"""The agent loop of one trajectory, turn by turn, token in / token out (pure).

A turn: the engine samples model tokens (loss mask 1, log-prob and policy version per
token); the turn text is parsed for tool calls; each call's output is appended as
non-trainable tokens (mask 0, version -1); a turn without a call ends the trajectory.

Two agents share this bookkeeping and differ in how text becomes tokens:

- :class:`ArithAgent`: the tiny model's tag protocol (``<calc>..</calc>``,
  ``<ans>..</ans>``, tool output as ``<res>..</res>`` / ``<err>..</err>``);
- :class:`ChatAgent`: a chat model's own template (libra/chat): the prompt is rendered
  with the job's tool schemas, calls are parsed by the job's tool-call format (Hermes
  JSON), and tool messages are appended as the template renders them, so the trainer
  sees exactly the sampled ids.

Partial rollout: a turn interrupted by a weight update (``finish_reason == "aborted"``)
is kept with :func:`apply_partial` (its tokens carry the old version) and resumed on the
new weights with the rest of the turn's token budget; only the completed turn is parsed.
Everything an agent needs to go on lives in the trajectory, so any instance can continue
a handed-over one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from libra import types as t
from libra.chat.toolcalls import ParsedTurn, ToolCall, get_parser
from libra.jobspec import JobSpec
from libra.tasks.arith import format_tool_output
from services.rollout.engine_types import GenerationRequest, GenerationResult
from services.rollout.transcript import build_transcript

# The causal signal of a call that never reached a tool (unknown name, bad JSON, a turn
# cut mid-call): one bounded tool type, so the prefix tree's keys stay few.
INVALID_TOOL_TYPE = "invalid"


class Tokenizer(Protocol):
    """What the agent loop needs from a tokenizer (``tokenizer``: the HF object)."""

    tokenizer: Any
    stop_token_ids: list[int]
    max_context_tokens: int

    def encode_prompt(self, text: str) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass
class TurnOutcome:
    """What to do after a turn: run its calls (and report its malformed ones), or finish
    (with an answer or not)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    finished: bool = False
    final_answer: str | None = None


@dataclass(frozen=True, slots=True)
class ToolTurnResult:
    """One call of a turn and what it returned (from the gateway, or refused here)."""

    name: str
    result: t.ToolResult


def invalid_call_result(error: str, tool_type: str = INVALID_TOOL_TYPE) -> t.ToolResult:
    """A call that never ran (bad name, bad JSON, bad arguments): a ``failure`` return
    whose error the model reads."""
    return t.ToolResult(t.ToolStatus.FAILURE, "", error, 0, 0,
                        t.ToolReturnState(tool_type, t.SizeClass.SMALL, t.ToolStatus.FAILURE))


class Agent(Protocol):
    """One job's agent loop (the rollout core holds one per job; ``task.agent`` picks it,
    services/rollout/agent_registry.py builds it, docs/plugins.md shows a plugin).

    The agent never generates: the core batches every ready trajectory's
    ``next_request`` into one engine call, runs the calls a turn asks for on the tool
    gateway, and reports every tool return to the scheduler. The agent owns the text:

    - ``start``: tokenize the prompt of a fresh trajectory (a handed-over one already has
      tokens: leave them); raise ``ValueError`` for a prompt it cannot render (that
      trajectory fails, the job goes on).
    - ``next_request``: the next turn's request, or None to stop (the trajectory then
      finishes without an answer, reward 0, not scored). Stop conditions live here and in
      ``apply_generation``: context full (``max_context_tokens``), turns used up
      (``task.max_turns``).
    - ``apply_generation``: append the sampled turn (mask 1) and say what it asks for: a
      ``TurnOutcome`` with calls (and malformed-call errors the model should read), or
      ``finished`` with the ``final_answer`` the reward scores.
    - ``apply_tool_results``: append what the model reads of the returns (mask 0,
      version -1) and record each return's ``state`` and position on the trajectory.
    - ``transcript``: the finished trajectory as messages for the reward.

    Everything needed to go on must live in the trajectory (a move hands it to another
    instance, which continues with its own agent).
    """

    max_context_tokens: int

    def start(self, traj: t.Trajectory) -> None: ...

    def next_request(self, traj: t.Trajectory, seed: int | None,
                     num_turn_tokens: int = 0) -> GenerationRequest | None: ...

    def apply_generation(self, traj: t.Trajectory, result: GenerationResult,
                         turn_prefix: Sequence[int] = ()) -> TurnOutcome: ...

    def apply_tool_results(self, traj: t.Trajectory,
                           results: Sequence[ToolTurnResult]) -> None: ...

    def transcript(self, traj: t.Trajectory) -> tuple[t.TranscriptMessage, ...]: ...


class _AgentBase:
    """Token bookkeeping both agents share."""

    def __init__(self, spec: JobSpec, tokenizer: Tokenizer, stop_token_ids: list[int],
                 stop_strings: Sequence[str]) -> None:
        self._spec = spec
        self._tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids)
        self.stop_strings = list(stop_strings)
        self.max_context_tokens = tokenizer.max_context_tokens

    def _start_with(self, traj: t.Trajectory, ids: list[int]) -> None:
        traj.token_ids = list(ids)
        traj.num_prompt_tokens = len(ids)
        traj.loss_mask = [0] * len(ids)
        traj.logprobs = [0.0] * len(ids)
        traj.token_versions = [-1] * len(ids)

    def next_request(self, traj: t.Trajectory, seed: int | None,
                     num_turn_tokens: int = 0) -> GenerationRequest | None:
        """The engine request for the next turn (or the rest of an interrupted one, which
        already sampled ``num_turn_tokens``), or None when nothing more fits."""
        room = self.max_context_tokens - len(traj.token_ids)
        max_new = min(self._spec.task.max_new_tokens_per_turn - num_turn_tokens, room)
        if max_new <= 0:
            return None
        a = self._spec.algorithm
        # Held-out eval samples at its own temperature (0: greedy), like verl's val_kwargs.
        temperature = self._spec.task.eval_temperature if traj.is_eval else a.temperature
        return GenerationRequest(prompt_token_ids=list(traj.token_ids), max_new_tokens=max_new,
                                 temperature=temperature, top_p=a.top_p,
                                 stop_token_ids=self.stop_token_ids,
                                 stop_strings=self.stop_strings, seed=seed)

    def apply_generation(self, traj: t.Trajectory, result: GenerationResult,
                         turn_prefix: Sequence[int] = ()) -> TurnOutcome:
        """Append the end of a sampled turn and decide what the whole turn asks for
        (``turn_prefix``: its tokens from before an interruption, already appended)."""
        apply_partial(traj, result)
        traj.num_turns += 1
        parsed = self._parse(self._turn_text(list(turn_prefix) + result.token_ids))
        if parsed.final:
            return TurnOutcome(finished=True, final_answer=parsed.answer)
        if traj.num_turns >= self._spec.task.max_turns:
            return TurnOutcome(finished=True)
        return TurnOutcome(calls=list(parsed.calls), errors=list(parsed.errors))

    def apply_tool_results(self, traj: t.Trajectory,
                           results: Sequence[ToolTurnResult]) -> None:
        """Append the tool outputs as context the model reads but is not trained on."""
        ids = self._tool_ids(traj, results)
        room = self.max_context_tokens - len(traj.token_ids)
        append_context(traj, ids[:max(room, 0)])
        for item in results:
            traj.tool_states.append(item.result.state)
            traj.tool_return_positions.append(traj.num_generated_tokens)

    def transcript(self, traj: t.Trajectory) -> tuple[t.TranscriptMessage, ...]:
        """The finished trajectory as messages, for the reward (services/rollout/
        transcript.py)."""
        return build_transcript(traj, prompt_messages(traj), self._turn_text, self._parse)

    def _turn_text(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)

    def _parse(self, text: str) -> ParsedTurn:
        raise NotImplementedError

    def _tool_ids(self, traj: t.Trajectory, results: Sequence[ToolTurnResult]) -> list[int]:
        raise NotImplementedError


class ArithAgent(_AgentBase):
    """The tiny model's tag protocol (libra/tasks/arith.py)."""

    def __init__(self, spec: JobSpec, tokenizer: Tokenizer) -> None:
        self._parser = get_parser("arith")
        # The tiny tokenizer has each closing tag as one stop token; other tokenizers
        # split them, and the engine then matches the text (which costs a decode a step).
        stop_ids = set(tokenizer.stop_token_ids)
        strings = [tag for tag in self._parser.stop_strings
                   if not _is_one_of(tokenizer.encode(tag), stop_ids)]
        super().__init__(spec, tokenizer, tokenizer.stop_token_ids, strings)

    def start(self, traj: t.Trajectory) -> None:
        """Tokenize the prompt of a fresh trajectory (a handed-over one keeps its tokens).

        Raises:
            ValueError: The prompt is chat messages (the job spec refuses such a dataset
                for the arith format at submit; this is the backstop).
        """
        if traj.prompt_messages_json:
            raise ValueError("the arith tag agent renders text prompts only; a messages "
                             "dataset needs a chat tool_call_format (hermes)")
        if not traj.token_ids:
            self._start_with(traj, self._tokenizer.encode_prompt(traj.prompt_text))

    def _parse(self, text: str) -> ParsedTurn:
        return self._parser.parse(text)

    def _tool_ids(self, traj: t.Trajectory, results: Sequence[ToolTurnResult]) -> list[int]:
        ids: list[int] = []
        for item in results:
            r = item.result
            ids += self._tokenizer.encode(format_tool_output(r.ok, r.output if r.ok else r.error))
        return ids


class ChatAgent(_AgentBase):
    """A chat model's template and tool-call format (``chat``: a libra.chat ChatFormat)."""

    def __init__(self, spec: JobSpec, tokenizer: Tokenizer, chat: Any) -> None:
        self._chat = chat
        self._parser = get_parser(spec.task.tool_call_format)
        super().__init__(spec, tokenizer, chat.stop_token_ids, self._parser.stop_strings)

    def start(self, traj: t.Trajectory) -> None:
        """Render the prompt of a fresh trajectory with the model's template: the row's
        chat messages when it has them, else one user message of ``prompt_text`` (the
        job's system prompt goes first unless the messages bring their own).

        Raises:
            ValueError: The messages are malformed or the template refuses them (the
                rollout fails that trajectory; the job goes on).
        """
        if traj.token_ids:
            return
        messages = prompt_messages(traj)
        try:
            ids = self._chat.prompt_ids(messages)
        except ValueError:
            raise
        except Exception as exc:  # the template refuses the row's messages (jinja error)
            if not traj.prompt_messages_json:
                raise
            raise ValueError(f"the chat template cannot render the messages: {exc}") from exc
        self._start_with(traj, ids)

    def _turn_text(self, ids: list[int]) -> str:
        # The turn's end token is the template's, not the model's words (nor its answer).
        while ids and ids[-1] in self._chat.stop_token_ids:
            ids = ids[:-1]
        return self._tokenizer.decode(ids)

    def _parse(self, text: str) -> ParsedTurn:
        return self._parser.parse(text)

    def _tool_ids(self, traj: t.Trajectory, results: Sequence[ToolTurnResult]) -> list[int]:
        messages = [{"role": "tool", "name": item.name, "content": tool_message_text(item.result)}
                    for item in results]
        closed = bool(traj.token_ids) and traj.token_ids[-1] in self._chat.stop_token_ids
        return list(self._chat.tool_turn_ids(messages, turn_closed=closed))


def prompt_messages(traj: t.Trajectory) -> list[dict[str, Any]]:
    """The trajectory's prompt as chat messages.

    Raises:
        ValueError: ``prompt_messages_json`` is not a JSON list of messages.
    """
    if not traj.prompt_messages_json:
        return [{"role": "user", "content": traj.prompt_text}]
    try:
        messages = json.loads(traj.prompt_messages_json)
    except json.JSONDecodeError as exc:
        raise ValueError(f"prompt_messages_json is not JSON: {exc}") from exc
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("prompt_messages_json is not a list of messages")
    return messages


def _is_one_of(ids: list[int], token_ids: set[int]) -> bool:
    return len(ids) == 1 and ids[0] in token_ids


def tool_message_text(result: t.ToolResult) -> str:
    """What a chat model reads for a tool return: its output, or ``error: <reason>``."""
    return result.output if result.ok else f"error: {result.error}"


def apply_partial(traj: t.Trajectory, result: GenerationResult) -> None:
    """Append the tokens of an interrupted turn (not a turn yet: nothing is parsed)."""
    traj.token_ids.extend(result.token_ids)
    traj.loss_mask.extend([1] * len(result.token_ids))
    traj.logprobs.extend(result.logprobs)
    traj.token_versions.extend([result.policy_version] * len(result.token_ids))


def append_context(traj: t.Trajectory, ids: Sequence[int]) -> None:
    """Append tokens the model reads but is not trained on (mask 0, version -1)."""
    traj.token_ids.extend(ids)
    traj.loss_mask.extend([0] * len(ids))
    traj.logprobs.extend([0.0] * len(ids))
    traj.token_versions.extend([-1] * len(ids))
