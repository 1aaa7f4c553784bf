"""vLLM adapter of the rollout service: the same ``Engine`` contract as ``TorchEngine``.

The only module of the project that imports vLLM, and only lazily (inside functions), so the
rest of the runtime and ``make test`` never need it. Install the optional extra with
``pip install -r requirements-vllm.txt`` (or ``make test-vllm``, which builds ``.venv-vllm``);
see docs/vllm.md.

Design:

* vLLM's in-process async engine (``AsyncLLM``) runs on a private asyncio loop in a
  background thread. :meth:`VllmEngine.generate` is blocking (the rollout core calls it in a
  worker thread, like the torch engine) and submits one streaming request per
  ``GenerationRequest`` (token ids in via ``TokensPrompt``, token ids out, no detokenising).
* Log-probs: ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob, and the
  engine is built with ``logprobs_mode="raw_logprobs"``: the log-softmax of the raw logits,
  before temperature / top-p, i.e. the policy at temperature 1 (the quantity the trainer
  recomputes), exactly as ``GenerationResult.logprobs`` defines it.
* :meth:`VllmEngine.abort` cancels the streams in flight; vLLM aborts those requests and the
  tokens streamed so far are kept (``finish_reason="aborted"``), so an abort lands on a
  token boundary just as with the torch engine; :meth:`VllmEngine.abort_rows` does the
  same for chosen requests only (a trajectory the scheduler moves away mid-turn).
* Weight reload without a restart (:mod:`services.rollout.vllm_weights`): a worker
  extension is mixed into every vLLM worker; ``collective_rpc`` makes each worker read the
  published safetensors and reload them in place (vLLM's layerwise ``reload_weights``: the
  model's own ``load_weights``, sharded for tensor parallelism, then post-load processing);
  the prefix cache is then reset so no KV computed by the old weights is reused. The file
  is validated on the host first (readable, same tensor names and shapes as the model
  dir): a bad file raises and the old weights keep serving with the old
  ``policy_version``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.rollout.engine_types import FinishReason, GenerationRequest, GenerationResult
from services.rollout.vllm_options import (  # noqa: F401 - re-exported (tests, __main__)
    INSTALL_HINT,
    VllmEngineOptions,
    VllmModelLoadError,
    VllmNotInstalledError,
    build_async_llm,
    import_vllm,
    vllm_available,
)
from services.rollout.vllm_weights import (  # noqa: F401 - WeightsRejectedError: re-exported
    WeightsRejectedError,
    bytes_shapes,
    check_fits,
    file_shapes,
)

logger = logging.getLogger(__name__)

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "aborted"}


@dataclass(slots=True)
class _Stream:
    """Per-request accumulation of the streamed deltas."""

    request: GenerationRequest
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None


class VllmEngine:
    """Blocking, batched sampler over vLLM's async engine.

    Build it with :meth:`start` (or :class:`VllmEngineLoader`); call :meth:`shutdown` when
    done (it stops the engine process). ``generate``/``load_weights`` must not run
    concurrently with each other (abort and wait first), as with ``TorchEngine``.
    """

    def __init__(self, llm: Any, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 *, tensor_shapes: dict[str, tuple[int, ...]], model_dir: str,
                 policy_version: int = -1) -> None:
        self._llm = llm
        self._loop = loop
        self._thread = thread
        self._tensor_shapes = tensor_shapes
        self.model_dir = model_dir
        self._policy_version = policy_version
        self._abort_event = threading.Event()
        self._inflight: set[asyncio.Task] = set()
        # Per-row stops of the call in flight (``abort_rows``): row index -> its task.
        self._aborted_rows: frozenset[int] = frozenset()
        self._row_tasks: dict[int, asyncio.Task] = {}
        self.start_s = 0.0
        self.last_reload_s = 0.0

    # -- construction -------------------------------------------------------------------
    @classmethod
    def start(cls, model_dir: str, options: VllmEngineOptions | None = None,
              *, policy_version: int = -1) -> VllmEngine:
        """Start vLLM on ``model_dir`` (a HF dir: config.json + safetensors + tokenizer)."""
        options = options or VllmEngineOptions()
        import_vllm()
        path = Path(model_dir)
        if not (path / "config.json").is_file():
            raise VllmModelLoadError(
                f"vLLM cannot load model dir {model_dir!r}: no config.json there (expected a "
                "Hugging Face model dir with config.json, *.safetensors and tokenizer files)")
        try:
            shapes = _checkpoint_shapes(path)
        except VllmModelLoadError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreadable weights
            raise VllmModelLoadError(f"vLLM cannot load model dir {model_dir!r}: its "
                                     f"safetensors weights are unreadable: {exc}") from exc
        max_len = options.max_model_len or _max_position_embeddings(path)
        started = time.perf_counter()
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="vllm-engine-loop",
                                  daemon=True)
        thread.start()
        try:
            llm = asyncio.run_coroutine_threadsafe(
                build_async_llm(model_dir, options, max_len), loop).result()
        except Exception as exc:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            raise VllmModelLoadError(
                f"vLLM cannot load model dir {model_dir!r}: {type(exc).__name__}: {exc}") from exc
        engine = cls(llm, loop, thread, tensor_shapes=shapes, model_dir=model_dir,
                     policy_version=policy_version)
        engine.start_s = time.perf_counter() - started
        logger.info("[vllm] engine started in %.1fs model_dir=%s tp=%d dtype=%s",
                    engine.start_s, model_dir, options.tensor_parallel_size, options.dtype)
        return engine

    def shutdown(self) -> None:
        """Stop the engine process and the loop thread (idempotent)."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        try:
            # Stop vLLM's output handler task first (it lives on our loop), so the engine
            # process going away is not logged as "EngineDeadError".
            asyncio.run_coroutine_threadsafe(_cancel_output_handler(llm), self._loop).result(10)
            llm.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    # -- Engine protocol ----------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        """Version of the weights currently loaded."""
        return self._policy_version

    def abort(self) -> None:
        """Interrupt the ``generate`` call in flight; its tokens so far are kept.

        Safe to call from another thread; affects only the call in flight (each
        ``generate`` clears the flag when it starts), like ``TorchEngine.abort``.
        """
        self._abort_event.set()
        self._loop.call_soon_threadsafe(self._cancel_inflight)

    def abort_rows(self, rows: Iterable[int]) -> None:
        """Interrupt only these requests of the call in flight (indices into its list);
        vLLM aborts them, their tokens so far are kept and the other rows carry on."""
        self._aborted_rows = self._aborted_rows | frozenset(rows)
        self._loop.call_soon_threadsafe(self._cancel_rows)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Sample continuations for all requests (vLLM batches them); request order kept."""
        self._abort_event.clear()
        self._aborted_rows = frozenset()
        if not requests:
            return []
        version = self._policy_version
        streams = asyncio.run_coroutine_threadsafe(
            self._generate_async(requests), self._loop).result()
        return [GenerationResult(token_ids=s.token_ids, logprobs=s.logprobs,
                                 finish_reason=s.finish_reason or "aborted",
                                 policy_version=version) for s in streams]

    def load_weights(self, path: str, version: int) -> None:
        """Swap in the weights of a safetensors file without restarting vLLM."""
        try:
            shapes = file_shapes(path)
        except Exception as exc:  # noqa: BLE001 - unreadable / corrupt / not safetensors
            raise WeightsRejectedError(f"weights file {path!r} is unreadable: {exc}") from exc
        self._reload(shapes, path, None, version)

    def load_weights_bytes(self, data: bytes, version: int) -> None:
        """Like :meth:`load_weights`, from verified safetensors bytes (no second read)."""
        try:
            shapes = bytes_shapes(data)
        except Exception as exc:  # noqa: BLE001
            raise WeightsRejectedError(f"weights bytes are not safetensors: {exc}") from exc
        self._reload(shapes, None, data, version)

    # -- internals ------------------------------------------------------------------------
    def _reload(self, shapes: dict[str, tuple[int, ...]], path: str | None,
                data: bytes | None, version: int) -> None:
        check_fits(shapes, self._tensor_shapes, self._policy_version)
        started = time.perf_counter()
        asyncio.run_coroutine_threadsafe(self._reload_async(path, data), self._loop).result()
        self.last_reload_s = time.perf_counter() - started
        self._policy_version = version
        logger.info("[weights] vllm loaded policy_version=%d in %.3fs", version,
                    self.last_reload_s)

    async def _reload_async(self, path: str | None, data: bytes | None) -> None:
        await self._llm.collective_rpc("libra_load_weights", args=(path, data))
        # KV blocks cached for shared prefixes were computed by the old weights.
        await self._llm.reset_prefix_cache()

    def _cancel_inflight(self) -> None:
        for task in list(self._inflight):
            task.cancel()

    def _cancel_rows(self) -> None:
        for index in self._aborted_rows:
            task = self._row_tasks.get(index)
            if task is not None:
                task.cancel()

    async def _generate_async(self, requests: list[GenerationRequest]) -> list[_Stream]:
        streams = [_Stream(request) for request in requests]
        tasks = []
        self._row_tasks = {}
        for index, stream in enumerate(streams):
            if stream.request.max_new_tokens == 0:  # vLLM needs max_tokens >= 1
                stream.finish_reason = "length"
                continue
            task = asyncio.ensure_future(self._run_one(stream))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            self._row_tasks[index] = task
            tasks.append(task)
        # abort() / abort_rows() may have run before the tasks existed.
        if self._abort_event.is_set():
            self._cancel_inflight()
        self._cancel_rows()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [o for o in outcomes
                  if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError)]
        if errors:
            raise errors[0]
        return streams

    async def _run_one(self, stream: _Stream) -> None:
        from vllm import SamplingParams, TokensPrompt  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

        request = stream.request
        params = SamplingParams(
            n=1, temperature=request.temperature, top_p=request.top_p,
            max_tokens=request.max_new_tokens, seed=request.seed,
            stop_token_ids=list(request.stop_token_ids), ignore_eos=True,
            # Stop strings need the text: detokenize only then (it costs per token), and
            # keep the tokens that completed the string, as the torch engine does.
            stop=list(request.stop_strings) or None, include_stop_str_in_output=True,
            logprobs=0, detokenize=bool(request.stop_strings), skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA)
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        outputs = self._llm.generate(prompt, params, request_id=f"libra-{uuid.uuid4().hex}")
        try:
            async for output in outputs:
                completion = output.outputs[0]
                new_ids = list(completion.token_ids)
                stream.token_ids.extend(new_ids)
                stream.logprobs.extend(_sampled_logprobs(completion.logprobs, new_ids))
                if completion.finish_reason is not None:
                    stream.finish_reason = _FINISH.get(completion.finish_reason, "aborted")
                if output.finished:
                    break
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being cancelled, not only the request: stop
            stream.finish_reason = "aborted"  # vLLM aborted the request; keep its tokens
        finally:
            await outputs.aclose()


async def _cancel_output_handler(llm: Any) -> None:
    handler = getattr(llm, "output_handler", None)
    if handler is not None and not handler.done():
        handler.cancel()
        with contextlib.suppress(BaseException):
            await handler


def _sampled_logprobs(logprobs: Any, token_ids: list[int]) -> list[float]:
    """The sampled token's log-prob per position (``logprobs=0`` returns only that one)."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no logprobs (SamplingParams.logprobs=0 expected)")
    values = []
    for position, token_id in enumerate(token_ids):
        entry = logprobs[position]
        values.append(float(entry[token_id].logprob))
    return values


def _checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise VllmModelLoadError(f"vLLM cannot load model dir {str(model_dir)!r}: "
                                 "no *.safetensors weights there")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update(file_shapes(str(file)))
    return shapes


def _max_position_embeddings(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    return int(config.get("max_position_embeddings") or 2048)


class VllmEngineLoader:
    """Loads the job's model directory into a ``VllmEngine`` (like ``TorchEngineLoader``).

    One engine per process: a later job on the same model dir reuses the running engine
    (its initial weights are reloaded, version -1) instead of paying the engine start again;
    a different model dir shuts the old engine down first.
    """

    def __init__(self, options: VllmEngineOptions | None = None) -> None:
        self._options = options or VllmEngineOptions()
        self._engine: VllmEngine | None = None

    def load(self, model_dir: str, policy: Any, tp_degree: int = 1,
             model: Any = None) -> tuple[VllmEngine, Any]:
        """Start (or reuse) the engine; ``tensor_parallel_size`` is the bucket's
        ``tp_degree`` unless the instance config pins it (``vllm_tensor_parallel_size``)."""
        from libra.jobspec import ModelSpec  # noqa: PLC0415
        from services.rollout.backend import job_tokenizer  # noqa: PLC0415

        engine = self._engine
        files = sorted(Path(model_dir).glob("*.safetensors"))
        if engine is not None and engine.model_dir == model_dir and len(files) == 1:
            engine.load_weights(str(files[0]), -1)
        else:
            if engine is not None:
                engine.shutdown()
                self._engine = None
            options = self._options
            if options.tensor_parallel_size <= 0:
                options = dataclasses.replace(options, tensor_parallel_size=tp_degree)
            engine = VllmEngine.start(model_dir, options)
            self._engine = engine
        return engine, job_tokenizer(model_dir, model or ModelSpec(),
                                     _max_position_embeddings(Path(model_dir)))

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
