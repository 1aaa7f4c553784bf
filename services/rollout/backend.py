"""Torch adapter of the rollout service: builds the engine and tokenizer from a model dir.

The only place the rollout service touches transformers; the core sees the ``Engine`` and
``Tokenizer`` protocols. The same loader serves the built-in tiny model and any Hugging
Face causal LM (``[model] kind = "hf"``): the trainer writes either as an HF directory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from libra import types as t
from libra.jobspec import ModelSpec
from services.rollout.engine_types import EngineCallLog

if TYPE_CHECKING:
    from services.rollout.torch_engine import TorchEngine

logger = logging.getLogger(__name__)

# ``model.max_context_tokens = 0`` takes the model's own limit, capped here: positions
# beyond what an RL job uses only cost KV memory.
DEFAULT_MAX_CONTEXT_TOKENS = 4096


@dataclass
class HfTokenizer:
    """The agent loop's view of a Hugging Face tokenizer."""

    tokenizer: Any
    stop_token_ids: list[int]
    max_context_tokens: int

    def encode_prompt(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)


def job_tokenizer(model_dir: str, model: ModelSpec, max_position_embeddings: int) -> HfTokenizer:
    """The tokenizer of a job's model directory, with its turn-ending tokens and context."""
    # torch and transformers load here, at the first job, not at the service's start (a
    # rollout process that is never given a job never pays their seconds of import).
    from libra.models.hf import load_tokenizer
    from libra.models.tiny import stop_token_ids as tiny_stop_token_ids

    tokenizer = load_tokenizer(model_dir)
    if model.kind == "tiny-llama":
        return HfTokenizer(tokenizer, tiny_stop_token_ids(tokenizer), max_position_embeddings)
    limit = model.max_context_tokens or min(max_position_embeddings, DEFAULT_MAX_CONTEXT_TOKENS)
    stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return HfTokenizer(tokenizer, stops, limit)


class TorchEngineLoader:
    """Loads the job's model directory into a ``TorchEngine`` (CPU, or CUDA when visible);
    every engine it builds records its calls in ``calls`` (reported by
    ``GetInstanceStatus``)."""

    def __init__(self, num_threads: int = 1, seed: int = 0, device: str = "") -> None:
        self._num_threads = num_threads
        self._seed = seed
        self._device = device
        """The device given, or "" for the default one, resolved at the first load."""
        self.calls = EngineCallLog()
        self.context_limit_tokens = 0
        """The context length of the last job loaded (0 before any): one sequence's
        share of what the engine can hold (libra_rollout_engine_context_limit_tokens)."""

    def load(self, model_dir: str, policy: t.PolicyInfo | None, tp_degree: int = 1,
             model: ModelSpec | None = None) -> tuple[TorchEngine, HfTokenizer]:
        """Load the model (``model``: the job's ``[model]``, the tiny one when None); the
        torch backend runs one device per instance, so a bucket's ``tp_degree`` only
        matters for vLLM (logged when it is ignored here)."""
        from libra.models.hf import default_device, max_position_embeddings
        from services.rollout.torch_engine import TorchEngine

        model = model or ModelSpec()
        self._device = self._device or default_device()
        if tp_degree > 1:
            logger.warning("[engine] torch backend ignores tp_degree=%d (use engine=vllm)",
                           tp_degree)
        tokenizer = job_tokenizer(model_dir, model, max_position_embeddings(model_dir))
        self.context_limit_tokens = tokenizer.max_context_tokens
        engine = TorchEngine.from_model_dir(
            model_dir, dtype=model.dtype, device=self._device, num_threads=self._num_threads,
            seed=self._seed, policy_version=-1, call_log=self.calls, decode=tokenizer.decode)
        return engine, tokenizer
