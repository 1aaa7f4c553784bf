"""Request and result types of an inference engine; pure, so the rollout core can import them.

The rollout core builds :class:`GenerationRequest` objects for one turn of many
trajectories and hands them to an engine adapter (``TorchEngine`` on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
        seed: Per-request seed; equal seeds give equal samples. None uses the engine RNG.
    """

    prompt_token_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        if self.max_new_tokens < 0 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"bad sampling params: max_new_tokens={self.max_new_tokens} "
                f"temperature={self.temperature} top_p={self.top_p}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class GenerationResult:
    """What one request produced.

    Attributes:
        token_ids: Sampled tokens, including the stop token when one ended the turn.
        logprobs: Per sampled token, its log-prob under the policy at temperature 1 (the
            raw softmax of the logits), whatever temperature/top_p was used to sample;
            this is the quantity the trainer recomputes, so the two are comparable.
        finish_reason: ``stop`` (stop token), ``length`` (max_new_tokens) or ``aborted``
            (interrupted at a token boundary; the tokens so far are kept).
        policy_version: Weights version that produced every token of this result.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int
