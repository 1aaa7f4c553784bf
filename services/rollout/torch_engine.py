"""CPU inference engine for the tiny policy: a batched decode loop with a KV cache.

The rollout worker calls :meth:`TorchEngine.generate` for one turn of many trajectories,
and :meth:`TorchEngine.load_weights` when the trainer publishes a new policy version.
The loop is our own rather than HF ``generate`` so that (a) the returned log-probs are
exactly the policy's, and (b) :meth:`TorchEngine.abort` can stop it at a token boundary.

Batching uses left padding: every row's last prompt token sits in the same column, so
one forward per step serves the whole batch; attention masks hide the padding and
position ids restart at 0 after it, so a row's logits do not depend on its batch mates.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file
from transformers import DynamicCache, PreTrainedModel

from services.rollout.engine_types import (
    EngineCall,
    EngineCallLog,
    FinishReason,
    GenerationRequest,
    GenerationResult,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _RowState:
    """Mutable per-request decode state."""

    request: GenerationRequest
    generator: torch.Generator | None
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None = None


class TorchEngine:
    """Blocking, batched sampler over a causal LM held in this process.

    Args:
        model: A HF causal LM (e.g. the tiny Llama); switched to eval mode.
        pad_token_id: Token fed for padding and for rows that already finished.
        num_threads: ``torch.set_num_threads`` value; 1 keeps a worker on one core.
        seed: Seeds the RNG used by requests that carry no seed of their own.
        policy_version: Version of the weights the model starts with.
        call_log: Where every ``generate`` call is recorded (shape and wall time); a
            fresh one when not given. Shared by the engines a loader builds.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        pad_token_id: int,
        num_threads: int = 1,
        seed: int = 0,
        policy_version: int = 0,
        call_log: EngineCallLog | None = None,
    ) -> None:
        self._model = model.eval()
        self._pad_token_id = pad_token_id
        self._policy_version = policy_version
        self._abort_event = threading.Event()
        # Rows of the call in flight to stop at their next token boundary (the others go
        # on); a set swapped whole, so reading it from the decode thread needs no lock.
        self._aborted_rows: frozenset[int] = frozenset()
        self._default_generator = torch.Generator().manual_seed(seed)
        self.call_log = call_log if call_log is not None else EngineCallLog()
        torch.set_num_threads(num_threads)

    @property
    def policy_version(self) -> int:
        """Version of the weights currently loaded."""
        return self._policy_version

    def abort(self) -> None:
        """Interrupt the ``generate`` call in flight at its next token boundary.

        Safe to call from another thread. It affects only the call in flight: each
        ``generate`` clears the flag when it starts.
        """
        self._abort_event.set()

    def abort_rows(self, rows: Iterable[int]) -> None:
        """Interrupt only these requests (indices into the ``generate`` call in flight)
        at their next token boundary; they come back ``aborted`` with the tokens sampled
        so far while the other rows carry on. Safe from another thread; like
        :meth:`abort`, it affects only the call in flight.
        """
        self._aborted_rows = self._aborted_rows | frozenset(rows)

    def load_weights(self, path: str, version: int) -> None:
        """Replace the weights in place from a safetensors state dict.

        Must not run concurrently with ``generate`` (abort and wait first): a result's
        tokens must all come from one policy version.
        """
        state_dict = load_file(path)
        with torch.no_grad():
            self._model.load_state_dict(state_dict, strict=True)
        self._policy_version = version
        logger.info("[weights] loaded policy_version=%d path=%s", version, path)

    def load_weights_bytes(self, data: bytes, version: int) -> None:
        """Like :meth:`load_weights`, from verified safetensors bytes (no second read)."""
        state_dict = load_bytes(data)
        with torch.no_grad():
            self._model.load_state_dict(state_dict, strict=True)
        self._policy_version = version
        logger.info("[weights] loaded policy_version=%d bytes=%d", version, len(data))

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Sample continuations for all requests as one batch.

        Returns:
            One result per request, in request order.
        """
        self._abort_event.clear()
        self._aborted_rows = frozenset()
        if not requests:
            return []
        started = time.perf_counter()
        rows = [self._new_row(request) for request in requests]
        with torch.inference_mode():
            decode_steps = self._decode(rows)
        self._record(rows, decode_steps, time.perf_counter() - started)
        return [
            GenerationResult(
                token_ids=row.token_ids,
                logprobs=row.logprobs,
                finish_reason=row.finish_reason or "aborted",
                policy_version=self._policy_version,
            )
            for row in rows
        ]

    def _record(self, rows: list[_RowState], decode_steps: int, wall_s: float) -> None:
        prompts = [len(row.request.prompt_token_ids) for row in rows]
        self.call_log.record(EngineCall(
            at_s=time.time(), batch=len(rows), prompt_len=max(prompts),
            prompt_tokens=sum(prompts), decode_steps=decode_steps,
            new_tokens=sum(len(row.token_ids) for row in rows), wall_s=wall_s,
            aborted=any(row.finish_reason is None for row in rows)))

    def _new_row(self, request: GenerationRequest) -> _RowState:
        generator = None
        if request.seed is not None:
            generator = torch.Generator().manual_seed(request.seed)
        row = _RowState(request, generator, [], [])
        if request.max_new_tokens == 0:
            row.finish_reason = "length"
        return row

    def _decode(self, rows: list[_RowState]) -> int:
        """Prefill, then decode until every row ended; returns the decode forwards."""
        input_ids, attention_mask, position_ids = _left_pad(
            [row.request.prompt_token_ids for row in rows], self._pad_token_id
        )
        cache = DynamicCache()
        logits = self._forward(input_ids, attention_mask, position_ids, cache)
        steps = 0
        while True:
            # 1) Honour an abort before sampling, so aborted rows keep whole tokens only.
            if self._abort_event.is_set():
                return steps
            # 2) Sample one token for every live row and update finish reasons.
            next_ids = self._sample_step(rows, logits)
            if all(row.finish_reason is not None for row in rows):
                return steps
            # 3) Feed the sampled tokens (pad for finished rows) one position further.
            attention_mask = torch.cat(
                [attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1
            )
            position_ids = position_ids[:, -1:] + 1
            logits = self._forward(next_ids.unsqueeze(1), attention_mask, position_ids, cache)
            steps += 1

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        output = self._model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :].float()

    def _sample_step(self, rows: list[_RowState], logits: torch.Tensor) -> torch.Tensor:
        policy_logprobs = torch.log_softmax(logits, dim=-1)
        next_ids = torch.full((len(rows),), self._pad_token_id, dtype=torch.long)
        aborted_rows = self._aborted_rows
        for index, row in enumerate(rows):
            if row.finish_reason is not None:
                continue
            if index in aborted_rows:
                row.finish_reason = "aborted"
                continue
            token_id = _sample_token(logits[index], row.request, self._generator_for(row))
            next_ids[index] = token_id
            row.token_ids.append(token_id)
            row.logprobs.append(float(policy_logprobs[index, token_id]))
            if token_id in row.request.stop_token_ids:
                row.finish_reason = "stop"
            elif len(row.token_ids) >= row.request.max_new_tokens:
                row.finish_reason = "length"
        return next_ids

    def _generator_for(self, row: _RowState) -> torch.Generator:
        return row.generator if row.generator is not None else self._default_generator


def _left_pad(
    sequences: list[list[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad to one length; positions count real tokens only (0 on padding)."""
    length = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for index, sequence in enumerate(sequences):
        input_ids[index, length - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[index, length - len(sequence) :] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def _sample_token(
    logits: torch.Tensor, request: GenerationRequest, generator: torch.Generator
) -> int:
    """Sample one token id with temperature and nucleus (top-p) filtering."""
    if request.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / request.temperature, dim=-1)
    if request.top_p < 1.0:
        sorted_probs, sorted_ids = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = torch.where(mass_before < request.top_p, sorted_probs, 0.0)
        probs = torch.zeros_like(probs).scatter(0, sorted_ids, sorted_probs)
    return int(torch.multinomial(probs, num_samples=1, generator=generator))
