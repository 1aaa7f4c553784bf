"""Torch adapter of the rollout service: builds the engine and tokenizer from a model dir.

The only place the rollout service touches transformers; the core sees the ``Engine`` and
``Tokenizer`` protocols.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from libra import types as t
from libra.models.tiny import load_model_dir, stop_token_ids
from services.rollout.engine_types import EngineCallLog
from services.rollout.torch_engine import TorchEngine

logger = logging.getLogger(__name__)


@dataclass
class HfTokenizer:
    """The agent loop's view of a Hugging Face tokenizer."""

    tokenizer: object
    stop_token_ids: list[int]
    max_context_tokens: int

    def encode_prompt(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)


class TorchEngineLoader:
    """Loads the job's model directory into a ``TorchEngine`` (CPU or CUDA); every
    engine it builds records its calls in ``calls`` (reported by ``GetInstanceStatus``)."""

    def __init__(self, num_threads: int = 1, seed: int = 0) -> None:
        self._num_threads = num_threads
        self._seed = seed
        self.calls = EngineCallLog()

    def load(self, model_dir: str, policy: t.PolicyInfo,
             tp_degree: int = 1) -> tuple[TorchEngine, HfTokenizer]:
        """Load the model; the torch backend runs one device per instance, so a bucket's
        ``tp_degree`` only matters for vLLM (logged when it is ignored here)."""
        if tp_degree > 1:
            logger.warning("[engine] torch backend ignores tp_degree=%d (use engine=vllm)",
                           tp_degree)
        model, tokenizer = load_model_dir(model_dir)
        engine = TorchEngine(model, pad_token_id=tokenizer.pad_token_id,
                             num_threads=self._num_threads, seed=self._seed,
                             policy_version=-1, call_log=self.calls)
        max_ctx = int(model.config.max_position_embeddings)
        return engine, HfTokenizer(tokenizer, stop_token_ids(tokenizer), max_ctx)
