"""Fake inference engine and engine loader for the rollout core.

Replaces: the model runtime (``services.rollout.torch_engine.TorchEngine`` / vLLM) and
the loader that builds it from a model directory. Everything else is real: the rollout
core, the agent loop, the tokenizer (the tiny model's real character tokenizer via
``HfTokenizer``), the Redis store on a real redis-server, and the wire codecs.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from libra import types as t
from libra.models.tiny import build_tokenizer, stop_token_ids
from services.rollout.backend import HfTokenizer
from services.rollout.engine_types import GenerationRequest, GenerationResult

_TOKENIZER: Any = None


def make_tokenizer(max_context_tokens: int = 384) -> HfTokenizer:
    """The real tiny-model tokenizer (built once per process: it takes ~1 s)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = build_tokenizer()
    return HfTokenizer(_TOKENIZER, stop_token_ids(_TOKENIZER), max_context_tokens)

# A hang guard for a row blocked until aborted, never reached in a passing test: an abort
# a loaded machine delivers late must still find the row blocked (it was 5 s).
BLOCK_GUARD_S = 60.0


@dataclass(frozen=True)
class BlockUntilAbort:
    """Script item: ``generate`` blocks until ``abort()`` or ``abort_rows`` names its row
    (or ``BLOCK_GUARD_S``), then returns the first ``keep`` tokens of ``text`` with finish
    reason ``aborted``."""

    text: str
    keep: int


@dataclass(frozen=True)
class HoldUntil:
    """Script item: ``generate`` blocks until ``release`` is set (or 30 s), then returns
    ``text`` as a finished turn (a generation still running while a test acts)."""

    text: str
    release: threading.Event


@dataclass(frozen=True)
class StreamUntil:
    """Script item: the tokens of ``before`` go to the engine's ``token_sink`` one step
    at a time, then ``generate`` blocks until ``release`` is set (or 30 s), then
    ``after``'s tokens go out and the whole turn is returned (a turn seen mid-way)."""

    before: str
    release: threading.Event
    after: str


@dataclass
class FakeEngine:
    """Returns scripted turn texts, one per request, in order; records every call.

    ``script`` holds turn texts (tokenized with the real tokenizer) or ready-made
    ``GenerationResult``s. Each produced token gets ``logprob`` and the engine's current
    ``policy_version``, like a real engine. ``load_weights`` switches the version.
    """

    tokenizer: HfTokenizer
    script: deque = field(default_factory=deque)
    policy_version: int = -1
    logprob: float = -0.5
    requests: list[GenerationRequest] = field(default_factory=list)
    calls: list[tuple[str, int]] = field(default_factory=list)  # ("generate"|"load", version)
    loaded: list[tuple[str, int]] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    num_aborts: int = 0
    aborted_rows: list[int] = field(default_factory=list)
    token_sink: Any = None
    """Called with each step's [(row, token id)] as TorchEngine.token_sink is."""
    _abort: threading.Event = field(default_factory=threading.Event)
    _rows: set[int] = field(default_factory=set)

    def abort(self) -> None:
        self.num_aborts += 1
        self._abort.set()

    def abort_rows(self, rows: Iterable[int]) -> None:
        rows = list(rows)
        self.aborted_rows.extend(rows)
        self._rows.update(rows)

    def queue(self, *turns: str | GenerationResult) -> None:
        self.script.extend(turns)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        out = []
        self.batch_sizes.append(len(requests))
        self._rows.clear()
        for row, request in enumerate(requests):
            self.requests.append(request)
            self.calls.append(("generate", self.policy_version))
            item = self.script.popleft() if self.script else "<ans>0</ans>"
            if isinstance(item, GenerationResult):
                out.append(item)
                continue
            if isinstance(item, HoldUntil):
                item.release.wait(30.0)
                item = item.text
            elif isinstance(item, StreamUntil):
                self._emit(row, self.tokenizer.encode(item.before))
                item.release.wait(30.0)
                self._emit(row, self.tokenizer.encode(item.after))
                item = item.before + item.after
            elif isinstance(item, BlockUntilAbort):
                self._block_until_aborted(row)
                ids = self.tokenizer.encode(item.text)[: item.keep]
                out.append(GenerationResult(token_ids=ids, logprobs=[self.logprob] * len(ids),
                                            finish_reason="aborted",
                                            policy_version=self.policy_version))
                continue
            ids = self.tokenizer.encode(item)[: request.max_new_tokens]
            out.append(GenerationResult(token_ids=ids, logprobs=[self.logprob] * len(ids),
                                        finish_reason="stop", policy_version=self.policy_version))
        return out

    def _emit(self, row: int, token_ids: list[int]) -> None:
        for token_id in token_ids:
            if self.token_sink is not None:
                self.token_sink([(row, token_id)])

    def _block_until_aborted(self, row: int) -> None:
        deadline_s = time.monotonic() + BLOCK_GUARD_S
        while time.monotonic() < deadline_s and row not in self._rows:
            if self._abort.wait(0.01):
                self._abort.clear()
                return

    def load_weights(self, path: str, version: int) -> None:
        self.calls.append(("load", version))
        self.loaded.append((path, version))
        self.policy_version = version

    def load_weights_bytes(self, data: bytes, version: int) -> None:
        self.calls.append(("load", version))
        self.loaded.append((data.decode(errors="replace"), version))
        self.policy_version = version


@dataclass
class FakeEngineLoader:
    """Hands out one prepared engine (and the real tokenizer); records model dirs."""

    engine: FakeEngine
    loads: list[tuple[str, t.PolicyInfo]] = field(default_factory=list)
    tp_degrees: list[int] = field(default_factory=list)

    def load(self, model_dir: str, policy: t.PolicyInfo, tp_degree: int = 1,
             model: Any = None) -> tuple[FakeEngine, HfTokenizer]:
        self.loads.append((model_dir, policy))
        self.tp_degrees.append(tp_degree)
        return self.engine, self.engine.tokenizer
