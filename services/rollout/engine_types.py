"""Request and result types of an inference engine; pure, so the rollout core can import them.

The rollout core builds :class:`GenerationRequest` objects for one turn of many
trajectories and hands them to an engine adapter (``TorchEngine`` on CPU or CUDA, or vLLM).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "aborted"]


@dataclass(frozen=True, kw_only=True, slots=True)
class GenerationRequest:
    """One continuation to sample.

    Attributes:
        prompt_token_ids: Full context so far (prompt plus earlier turns and tool outputs).
        max_new_tokens: Upper bound on sampled tokens for this turn.
        temperature: Softmax temperature; 0 means greedy.
        top_p: Nucleus mass kept before sampling (1.0 keeps everything).
        stop_token_ids: Sampling stops after emitting any of these (the token is kept).
        stop_strings: Sampling stops once the decoded text of the new tokens contains any
            of these; the tokens up to and including the one that completed it are kept
            (the text may run past the stop string inside that token). Needs an engine
            that can decode (``TorchEngine(decode=...)``).
        seed: Per-request seed; equal seeds give equal samples. None uses the engine RNG.
    """

    prompt_token_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        if self.max_new_tokens < 0 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"bad sampling params: max_new_tokens={self.max_new_tokens} "
                f"temperature={self.temperature} top_p={self.top_p}"
            )
        if any(not stop for stop in self.stop_strings):
            # An empty stop string would end every turn before its first token counted.
            raise ValueError("stop_strings must not contain an empty string")


@dataclass(frozen=True, kw_only=True, slots=True)
class GenerationResult:
    """What one request produced.

    Attributes:
        token_ids: Sampled tokens, including the stop token when one ended the turn.
        logprobs: Per sampled token, its log-prob under the policy at temperature 1 (the
            raw softmax of the logits), whatever temperature/top_p was used to sample;
            this is the quantity the trainer recomputes, so the two are comparable.
        finish_reason: ``stop`` (stop token or stop string), ``length``
            (max_new_tokens) or ``aborted`` (interrupted at a token boundary; the tokens
            so far are kept).
        policy_version: Weights version that produced every token of this result.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int


@dataclass(frozen=True, slots=True)
class EngineCall:
    """One timed ``generate`` call of a turn-batched engine.

    Attributes:
        at_s: Wall clock (Unix seconds) when the call returned.
        batch: Requests in the call.
        prompt_len: Padded prompt length (the longest context in the batch).
        prompt_tokens: Context tokens over all requests (unpadded).
        decode_steps: Decode forwards after the prefill (the longest row's tokens - 1).
        new_tokens: Tokens sampled over all requests.
        wall_s: Wall time of the call, as the serving process experienced it.
        aborted: Cut short by ``abort`` (a weight update).
    """

    at_s: float
    batch: int
    prompt_len: int
    prompt_tokens: int
    decode_steps: int
    new_tokens: int
    wall_s: float
    aborted: bool


class EngineCallLog:
    """The last ``maxlen`` engine calls (a ring buffer; thread-safe appends).

    The rollout service reports it in ``GetInstanceStatus.engine_profile_json`` so that a
    measurement of the instance's speed is taken in the run itself, under its real
    contention (``libra_cli/sim_validation.py`` fits its step-cost model to it).
    """

    def __init__(self, maxlen: int = 2048) -> None:
        self._calls: deque[EngineCall] = deque(maxlen=maxlen)

    def record(self, call: EngineCall) -> None:
        self._calls.append(call)

    def calls(self) -> list[EngineCall]:
        return list(self._calls)

    def last(self) -> EngineCall | None:
        """The newest call, if any (read at every metrics scrape: no copy)."""
        try:
            return self._calls[-1]
        except IndexError:
            return None

    def to_json(self) -> str:
        """``[{at_s, batch, prompt_len, ...}, ...]``, oldest first."""
        return json.dumps([asdict(c) for c in self.calls()], separators=(",", ":"))
