"""Torch inference engine: a batched decode loop with a KV cache, on CPU or CUDA.

The rollout worker calls :meth:`TorchEngine.generate` for one turn of many trajectories,
and :meth:`TorchEngine.load_weights` when the trainer publishes a new policy version.
The loop is our own rather than HF ``generate`` so that (a) the returned log-probs are
exactly the policy's, and (b) :meth:`TorchEngine.abort` can stop it at a token boundary.

Batching uses left padding: every row's last prompt token sits in the same column, so
one forward per step serves the whole batch; attention masks hide the padding and
position ids restart at 0 after it, so a row's logits do not depend on its batch mates.

Everything runs on the model's device: inputs, masks and the KV cache live there, and
sampling is vectorised over the batch there (``torch_sampling``). The one device-to-host
copy per step is the sampled ids and their log-probs (the rows' stop checks and results
need them); seeded uniforms come from CPU generators in blocks (see ``torch_sampling``).
Log-probs come from a float32 softmax whatever the model's dtype.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file
from transformers import DynamicCache, PreTrainedModel

from libra.training.tensors import with_tied_aliases
from services.rollout.engine_types import (
    EngineCall,
    EngineCallLog,
    FinishReason,
    GenerationRequest,
    GenerationResult,
)
from services.rollout.torch_sampling import BatchSampler, StopStringMatcher

logger = logging.getLogger(__name__)

Decode = Callable[[list[int]], str]


@dataclass(slots=True)
class _RowState:
    """Mutable per-request decode state."""

    request: GenerationRequest
    generator: torch.Generator
    token_ids: list[int]
    logprobs: list[float]
    stop_matcher: StopStringMatcher | None
    finish_reason: FinishReason | None = None

    def append(self, token_id: int, logprob: float) -> None:
        """Keep a sampled token and set the finish reason it causes, if any."""
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        if token_id in self.request.stop_token_ids:
            self.finish_reason = "stop"
        elif self.stop_matcher is not None and self.stop_matcher.completed_by_last(
                self.token_ids):
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self.request.max_new_tokens:
            self.finish_reason = "length"


class TorchEngine:
    """Blocking, batched sampler over a causal LM held in this process.

    Args:
        model: A HF causal LM on its device (CPU or CUDA; any dtype); switched to eval mode.
        pad_token_id: Token fed for left padding (masked out, so any id in the vocabulary).
        num_threads: ``torch.set_num_threads`` value; 1 keeps a worker on one core.
        seed: Seeds the RNG used by requests that carry no seed of their own.
        policy_version: Version of the weights the model starts with.
        call_log: Where every ``generate`` call is recorded (shape and wall time); a
            fresh one when not given. Shared by the engines a loader builds.
        decode: Token ids -> text (the tokenizer's decode); needed by requests with
            ``stop_strings``, which are refused without it.
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
        decode: Decode | None = None,
    ) -> None:
        self._model = model.eval()
        self._device = next(model.parameters()).device
        self._pad_token_id = pad_token_id
        self._policy_version = policy_version
        self._decode_text = decode
        self._abort_event = threading.Event()
        # Rows of the call in flight to stop at their next token boundary (the others go
        # on); a set swapped whole, so reading it from the decode thread needs no lock.
        self._aborted_rows: frozenset[int] = frozenset()
        # Called from the decode thread after every step with the step's (row, token id)
        # pairs, so a caller can stream turns as they are sampled (None: nobody listens).
        self.token_sink: Callable[[list[tuple[int, int]]], None] | None = None
        # A CPU generator on every device: see torch_sampling (reproducible uniforms).
        self._default_generator = torch.Generator().manual_seed(seed)
        self.call_log = call_log if call_log is not None else EngineCallLog()
        torch.set_num_threads(num_threads)

    @classmethod
    def from_model_dir(
        cls,
        path: str,
        *,
        dtype: str = "auto",
        device: str | None = None,
        num_threads: int = 1,
        seed: int = 0,
        policy_version: int = 0,
        call_log: EngineCallLog | None = None,
        decode: Decode | None = None,
    ) -> TorchEngine:
        """An engine over the HF model directory ``path`` (``libra.models.hf``).

        Args:
            dtype: ``auto`` (float32 on CPU, bfloat16 on CUDA), ``float32`` or ``bfloat16``.
            device: ``cpu``, ``cuda`` or ``cuda:<n>``; None: CUDA when visible, else CPU.
        """
        from libra.models.hf import default_device, load_causal_lm

        torch.set_num_threads(num_threads)
        model = load_causal_lm(path, dtype=dtype, device=device or default_device())
        return cls(model, pad_token_id=_pad_token_id(model), num_threads=num_threads,
                   seed=seed, policy_version=policy_version, call_log=call_log,
                   decode=decode)

    @property
    def policy_version(self) -> int:
        """Version of the weights currently loaded."""
        return self._policy_version

    @property
    def device(self) -> torch.device:
        """Where the model, the batch and the KV cache live."""
        return self._device

    @property
    def model(self) -> PreTrainedModel:
        """The policy being served (read only: weights change through load_weights)."""
        return self._model

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
        """Replace the weights in place from a published safetensors file.

        The file is the trainer's published format (``libra.training.tensors``): every
        state-dict name of the model, a tied alias (``lm_head.weight`` when
        ``tie_word_embeddings``) optional. Must not run concurrently with ``generate``
        (abort and wait first): a result's tokens must all come from one policy version.

        Raises:
            ValueError: A missing, unexpected or mis-shaped key (named); the weights
                loaded before are kept.
        """
        self._load_state(load_file(path))
        self._policy_version = version
        logger.info("[weights] loaded policy_version=%d path=%s", version, path)

    def load_weights_bytes(self, data: bytes, version: int) -> None:
        """Like :meth:`load_weights`, from verified safetensors bytes (no second read)."""
        self._load_state(load_bytes(data))
        self._policy_version = version
        logger.info("[weights] loaded policy_version=%d bytes=%d", version, len(data))

    def _load_state(self, state: dict[str, torch.Tensor]) -> None:
        complete = with_tied_aliases(self._model, state)  # checks all before any copy
        with torch.no_grad():
            # Copies onto the model's device and casts to its dtype (e.g. fp32 -> bf16).
            self._model.load_state_dict(complete, strict=True)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Sample continuations for all requests as one batch.

        Returns:
            One result per request, in request order.

        Raises:
            ValueError: A request has ``stop_strings`` and the engine has no ``decode``.
        """
        self._abort_event.clear()
        self._aborted_rows = frozenset()
        if not requests:
            return []
        if self._decode_text is None and any(r.stop_strings for r in requests):
            raise ValueError("stop_strings need an engine built with decode=")
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
        generator = self._default_generator
        if request.seed is not None:
            generator = torch.Generator().manual_seed(request.seed)
        matcher = None
        if request.stop_strings and self._decode_text is not None:
            matcher = StopStringMatcher(request.stop_strings, self._decode_text)
        row = _RowState(request, generator, [], [], matcher)
        if request.max_new_tokens == 0:
            row.finish_reason = "length"
        return row

    def _decode(self, rows: list[_RowState]) -> int:
        """Prefill, then decode until every row ended; returns the decode forwards."""
        input_ids, attention_mask, position_ids = _left_pad(
            [row.request.prompt_token_ids for row in rows], self._pad_token_id, self._device
        )
        sampler = BatchSampler([row.request for row in rows],
                               [row.generator for row in rows], self._device)
        cache = DynamicCache()
        logits = self._prefill(rows, input_ids, attention_mask, position_ids, cache)
        last_position = position_ids[:, -1:]
        new_column = torch.ones_like(attention_mask[:, :1])
        steps = 0
        while True:
            # 1) Honour an abort before sampling, so aborted rows keep whole tokens only.
            if self._abort_event.is_set():
                return steps
            # 2) Sample one token for every row and update the live rows' finish reasons.
            next_ids = self._sample_step(rows, logits, sampler)
            if all(row.finish_reason is not None for row in rows):
                return steps
            # 3) Feed the sampled tokens one position further. Finished rows are fed
            # their (ignored) samples too: rows never see each other, and swapping in
            # padding would cost a host-to-device copy per step.
            steps += 1
            attention_mask = torch.cat([attention_mask, new_column], dim=1)
            logits = self._forward(next_ids.unsqueeze(1), attention_mask,
                                   last_position + steps, cache)

    def _prefill(self, rows: list[_RowState], input_ids: torch.Tensor,
                 attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: DynamicCache) -> torch.Tensor:
        """The prompts' forward, once per distinct prompt.

        A GRPO group's first turn sends the same prompt many times: its rows' KV and
        logits are identical, so the prompt runs once and the cache rows are copied out
        (``batch_select_indices``), cutting the prefill by the group size.
        """
        first_row: dict[tuple[int, ...], int] = {}
        owners = [first_row.setdefault(tuple(row.request.prompt_token_ids), index)
                  for index, row in enumerate(rows)]
        if len(first_row) == len(rows):
            return self._forward(input_ids, attention_mask, position_ids, cache)
        unique = torch.tensor(list(first_row.values()), device=self._device)
        logits = self._forward(input_ids[unique], attention_mask[unique],
                               position_ids[unique], cache)
        # Row i of the batch reads the unique row its prompt was first seen in.
        position_of = {row: position for position, row in enumerate(first_row.values())}
        expand = torch.tensor([position_of[owner] for owner in owners], device=self._device)
        cache.batch_select_indices(expand)
        return logits.index_select(0, expand)

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

    def _sample_step(self, rows: list[_RowState], logits: torch.Tensor,
                     sampler: BatchSampler) -> torch.Tensor:
        token_ids, logprobs = sampler.sample(logits)
        # The step's one device-to-host copy (float64 holds every token id exactly).
        host_ids, host_logprobs = torch.stack(
            [token_ids.double(), logprobs.double()]).tolist()
        aborted_rows, sampled = self._aborted_rows, []
        for index, row in enumerate(rows):
            if row.finish_reason is not None:
                continue
            if index in aborted_rows:
                row.finish_reason = "aborted"
                continue
            row.append(int(host_ids[index]), host_logprobs[index])
            sampled.append((index, int(host_ids[index])))
        sink = self.token_sink
        if sink is not None and sampled:
            sink(sampled)
        return token_ids


def _pad_token_id(model: PreTrainedModel) -> int:
    """The config's pad token, else its (first) EOS, else 0: padding is masked anyway."""
    for name in ("pad_token_id", "eos_token_id"):
        for config in (model.config, getattr(model, "generation_config", None)):
            value = getattr(config, name, None)
            if isinstance(value, list):
                value = value[0] if value else None
            if value is not None:
                return int(value)
    return 0


def _left_pad(
    sequences: list[list[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad to one length; positions count real tokens only (0 on padding).

    Built on the CPU and copied to ``device`` once (one copy per tensor, not per row).
    """
    length = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for index, sequence in enumerate(sequences):
        input_ids[index, length - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[index, length - len(sequence) :] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)
