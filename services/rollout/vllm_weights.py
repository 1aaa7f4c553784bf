"""Weight reload of the vLLM engine without a restart (see :mod:`services.rollout.vllm_engine`).

:class:`LibraWorkerExtension` is mixed into every vLLM worker (``worker_extension_cls``,
by its dotted path): ``collective_rpc`` makes each worker read the published safetensors
and reload them in place, then re-process a tied output layer. On the host, the file is
checked first (readable, the same tensor names and shapes as the served model) by reading
only its safetensors header: a bad file is refused and the old weights keep serving.

Kept free of module-level vLLM and torch imports, like the engine module.
"""

from __future__ import annotations

import json
import struct


class WeightsRejectedError(ValueError):
    """A published weights file does not fit the model; the old weights keep serving."""


class LibraWorkerExtension:
    """Mixed into every vLLM worker (``worker_extension_cls``); runs in the worker process.

    Kept free of module-level vLLM imports: vLLM imports it by its dotted path.
    """

    def libra_load_weights(self, path: str | None, data: bytes | None) -> int:
        """Load a safetensors state dict (HF tensor names) into the served model."""
        from safetensors.torch import load, load_file  # noqa: PLC0415

        state = load_file(path, device="cpu") if path is not None else load(data)
        # vLLM's in-place reload (Worker.reload_weights): re-materialises each layer, runs
        # the model's own load_weights (HF names -> fused/sharded params) and re-applies
        # post-load processing (e.g. the CPU GEMM weight repacking, which empties the plain
        # parameters, so a bare model.load_weights fails after the first load).
        self.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=iter(state.items()), is_checkpoint_format=True)
        self._libra_refresh_tied_head()
        return len(state)

    def _libra_refresh_tied_head(self) -> None:
        """Re-process the output layer of a model with tied embeddings after a reload.

        Such a model (SmolLM2, Qwen3-0.6B, ...) shares one tensor between
        ``embed_tokens`` and ``lm_head`` and its checkpoints hold it once, so the reload
        updates the tensor through the embedding and never visits ``lm_head``. But the
        head's own post-load processing (on CPU: the GEMM repacking of its weight) made
        a copy at start-up, which kept sampling from the first policy's output layer
        (measured: log-probs 0.29 off the trainer's; exact once re-processed).
        """
        text_config = self.vllm_config.model_config.hf_text_config  # type: ignore[attr-defined]
        if not getattr(text_config, "tie_word_embeddings", False):
            return
        head = getattr(self.model_runner.get_model(), "lm_head", None)  # type: ignore[attr-defined]
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)


def check_fits(shapes: dict[str, tuple[int, ...]], served: dict[str, tuple[int, ...]],
               version: int) -> None:
    """Refuse weights whose tensor names or shapes differ from the served model's
    (``version``: the policy version that keeps serving)."""
    if shapes == served:
        return
    missing = sorted(set(served) - set(shapes))[:3]
    extra = sorted(set(shapes) - set(served))[:3]
    wrong = sorted(k for k in set(shapes) & set(served) if shapes[k] != served[k])[:3]
    raise WeightsRejectedError(
        f"weights do not fit the served model (missing={missing} unexpected={extra} "
        f"wrong_shape={wrong}); keeping policy_version={version}")


def file_shapes(path: str) -> dict[str, tuple[int, ...]]:
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise ValueError("file shorter than a safetensors header")
        (size,) = struct.unpack("<Q", head)
        if size > 100 * 2**20:
            raise ValueError(f"implausible safetensors header size {size}")
        header = handle.read(size)
        handle.seek(0, 2)
        total = handle.tell()
    return _parse_header(header, total - 8 - size)


def bytes_shapes(data: bytes) -> dict[str, tuple[int, ...]]:
    if len(data) < 8:
        raise ValueError("shorter than a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ValueError("truncated safetensors header")
    return _parse_header(data[8:8 + size], len(data) - 8 - size)


def _parse_header(header: bytes, body_size: int) -> dict[str, tuple[int, ...]]:
    meta = json.loads(header)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if not 0 <= start <= end <= body_size:
            raise ValueError(f"tensor {name} lies outside the file (truncated?)")
        shapes[name] = tuple(int(d) for d in info["shape"])
    return shapes
