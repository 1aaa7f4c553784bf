"""Roofline of one engine step per device (design digest 5.2, issue 20 item 1).

A decode step reads the weights shard and the batch's KV cache from HBM, a prefill
chunk is FLOP-bound; a step takes the larger of the two, plus the part a mixed batch
fails to overlap, two TP all-reduces per layer and the engine's fixed per-step
overhead. Every coefficient is a ``HardwareSpec`` field whose value and source sit in
``sim/presets.py``. One difference from the reference code: it divides the weight
bytes by TP twice (``(W/TP + KV) / (TP * bw)``); here every quantity is per device, so
weights are divided once.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from scheduling.planner.specs import HardwareSpec, ModelSpec

PREFILL_CHUNK_TOKENS = 1024
"""Chunked-prefill budget per step (reference cost model)."""
MAX_BATCH_SEQS = 256
"""Sequences per engine step (vLLM ``max_num_seqs`` default, reference cap on b-bar)."""
KV_FRAGMENTATION = 0.04
"""KV capacity lost to block fragmentation (reference cost model 4%)."""
WORKSPACE_BYTES = 2 * 1024**3
"""Activation workspace per device kept out of the KV pool (our assumption: the vLLM
profile run of a 1,024-token chunk on 4B-30B models peaks at ~1-2 GiB)."""


def kv_bytes_per_token(model: ModelSpec, tp: int) -> float:
    """KV bytes one token occupies on each device of a TP group (heads replicate past TP)."""
    heads_per_gpu = max(1.0, model.num_kv_heads / tp)
    return 2.0 * model.num_layers * heads_per_gpu * model.head_dim * model.dtype_bytes


def weight_bytes_per_gpu(model: ModelSpec, tp: int) -> float:
    """Resident weight bytes per device."""
    return model.num_params * model.dtype_bytes / tp


def weights_read_per_gpu(model: ModelSpec, tp: int, num_tokens: int) -> float:
    """Weight bytes one engine step reads per device.

    Dense: all weights. MoE: non-expert weights plus the experts the step's tokens
    touch, in expectation ``1 - (1 - k/E)^n`` of them (uniform routing).
    """
    if not model.is_moe:
        return weight_bytes_per_gpu(model, tp)
    touched = 1.0 - (1.0 - model.num_active_experts / model.num_experts) ** max(1, num_tokens)
    dense = model.num_params - model.expert_params
    return (dense + model.expert_params * touched) * model.dtype_bytes / tp


def kv_capacity_tokens(hw: HardwareSpec, model: ModelSpec, tp: int) -> int:
    """Tokens of KV cache an instance of ``tp`` devices can hold (0 if weights do not fit)."""
    free = hw.hbm_bytes * hw.memory_utilization - weight_bytes_per_gpu(model, tp) - WORKSPACE_BYTES
    if free <= 0:
        return 0
    return int(free / kv_bytes_per_token(model, tp) * (1.0 - KV_FRAGMENTATION))


def tp_comm_s(hw: HardwareSpec, model: ModelSpec, tp: int, num_tokens: int) -> float:
    """Two all-reduces of the activations per layer (attention and MLP outputs).

    Each costs a fixed latency plus the ring volume ``2 (tp-1)/tp x payload`` over the
    bus bandwidth an engine's all-reduce achieves on messages of this size
    (``HardwareSpec.allreduce_bus_bw_bytes_per_s``: far below the NVLink peak for the
    tens of KB to ~1 MB a decode step sends; sources in ``sim/presets.py``).
    """
    if tp <= 1:
        return 0.0
    payload = num_tokens * model.hidden_size * model.dtype_bytes
    bus_bw = hw.allreduce_bus_bw_bytes_per_s or hw.intra_node_bw_bytes_per_s
    per_allreduce = hw.allreduce_latency_s + 2.0 * (tp - 1) / tp * payload / bus_bw
    return 2.0 * model.num_layers * per_allreduce


def step_s(
    hw: HardwareSpec,
    model: ModelSpec,
    tp: int,
    num_decode: int,
    kv_tokens: float,
    prefill_tokens: int = 0,
    prefill_ctx_tokens: float = 0.0,
) -> float:
    """Time of one engine step: ``num_decode`` decode tokens plus one prefill chunk.

    Args:
        hw: Device.
        model: Model.
        tp: Tensor-parallel degree of the instance.
        num_decode: Sequences decoding one token each.
        kv_tokens: Context tokens of those sequences (KV read this step).
        prefill_tokens: Prompt tokens prefilled in this step (a chunk, 0 for none).
        prefill_ctx_tokens: Context already cached before the chunk (attention span).
    """
    num_tokens = num_decode + prefill_tokens
    if num_tokens <= 0:
        return 0.0
    bytes_read = weights_read_per_gpu(model, tp, num_tokens) + kv_tokens * kv_bytes_per_token(
        model, tp
    )
    attn_unit = 4.0 * model.num_layers * model.num_heads * model.head_dim
    flops = 2.0 * model.num_active_params * num_tokens + attn_unit * kv_tokens
    if prefill_tokens:
        flops += attn_unit * prefill_tokens * (prefill_ctx_tokens + prefill_tokens / 2.0)
    t_mem = bytes_read / (hw.hbm_bw_bytes_per_s * hw.hbm_efficiency)
    t_flop = flops / tp / (hw.peak_flops * hw.prefill_mfu)
    # A mixed step overlaps its memory- and FLOP-bound parts only partly
    # (``mixed_batch_interference``); the engine's per-step CPU work is not hidden.
    overlap_loss = hw.mixed_batch_interference * min(t_mem, t_flop)
    return (
        max(t_mem, t_flop)
        + overlap_loss
        + tp_comm_s(hw, model, tp, num_tokens)
        + hw.engine_step_overhead_s
    )


def prefill_s(
    hw: HardwareSpec, model: ModelSpec, tp: int, tokens: int, ctx_tokens: float = 0.0
) -> float:
    """Time to prefill ``tokens`` alone, in ``PREFILL_CHUNK_TOKENS`` chunks."""
    total, done = 0.0, 0
    while done < tokens:
        chunk = min(PREFILL_CHUNK_TOKENS, tokens - done)
        total += step_s(hw, model, tp, 0, 0.0, chunk, ctx_tokens + done)
        done += chunk
    return total


def step_timer(hw: HardwareSpec, model: ModelSpec, tp: int) -> Callable[..., float]:
    """``step_s`` for one device, model and TP degree, with its per-call constants
    computed once. The arithmetic is ``step_s``'s, in the same order, so the results
    are identical to the last bit (the simulator calls it on every segment)."""
    if model.is_moe:  # the weights read depend on the step's tokens
        return partial(step_s, hw, model, tp)
    weights = weights_read_per_gpu(model, tp, 1)
    kv_bytes = kv_bytes_per_token(model, tp)
    attn_unit = 4.0 * model.num_layers * model.num_heads * model.head_dim
    flops_per_token = 2.0 * model.num_active_params
    mem_rate = hw.hbm_bw_bytes_per_s * hw.hbm_efficiency
    flop_rate = hw.peak_flops * hw.prefill_mfu
    interference, overhead = hw.mixed_batch_interference, hw.engine_step_overhead_s
    ring = 2.0 * (tp - 1) / tp
    bus_bw = hw.allreduce_bus_bw_bytes_per_s or hw.intra_node_bw_bytes_per_s
    latency, layers2 = hw.allreduce_latency_s, 2.0 * model.num_layers
    hidden, dtype = model.hidden_size, model.dtype_bytes

    def timer(
        num_decode: int, kv_tokens: float, prefill_tokens: int = 0,
        prefill_ctx_tokens: float = 0.0,
    ) -> float:
        num_tokens = num_decode + prefill_tokens
        if num_tokens <= 0:
            return 0.0
        bytes_read = weights + kv_tokens * kv_bytes
        flops = flops_per_token * num_tokens + attn_unit * kv_tokens
        if prefill_tokens:
            flops += attn_unit * prefill_tokens * (prefill_ctx_tokens + prefill_tokens / 2.0)
        t_mem = bytes_read / mem_rate
        t_flop = flops / tp / flop_rate
        comm = 0.0
        if tp > 1:
            comm = layers2 * (latency + ring * (num_tokens * hidden * dtype) / bus_bw)
        # ``max`` / ``min`` written out (same values): this runs twice per segment.
        if t_mem >= t_flop:
            return t_mem + interference * t_flop + comm + overhead
        return t_flop + interference * t_mem + comm + overhead

    return timer
