"""Hardware and model descriptions the planner's cost model reads (pure data).

The coordinator fills these from the job spec; the cluster simulator fills them from
its presets (``sim/presets.py``, where every constant carries its source).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareSpec:
    """One accelerator type and the node it sits in."""

    name: str
    hbm_bytes: float
    """HBM capacity per device."""
    hbm_bw_bytes_per_s: float
    """Peak HBM bandwidth per device."""
    peak_flops: float
    """Dense BF16 peak per device."""
    intra_node_bw_bytes_per_s: float
    """Per-device bidirectional-peak / 2 link bandwidth used by TP all-reduce inside a node."""
    inter_node_bw_bytes_per_s: float
    """Per-device network bandwidth used by DP all-reduce and weight sync across nodes."""
    gpus_per_node: int = 8
    allreduce_latency_s: float = 10e-6
    """Fixed cost of one small all-reduce inside a node."""
    allreduce_bus_bw_bytes_per_s: float = 0.0
    """Bus bandwidth an engine's TP all-reduce achieves on decode-sized messages (tens
    of KB to ~1 MB), far below the link peak; 0 falls back to
    ``intra_node_bw_bytes_per_s`` (the link peak)."""
    engine_step_overhead_s: float = 0.0
    """Fixed time of every engine step the GPU does not hide (scheduling, sampling,
    launches, output processing)."""
    mixed_batch_interference: float = 0.0
    """Fraction of the shorter of a step's memory and FLOP times added to the longer
    (0: a mixed prefill/decode step costs ``max`` of the two; 1: their sum)."""
    hbm_efficiency: float = 0.85
    """Achieved fraction of peak HBM bandwidth in decode (reference cost model 0.85)."""
    prefill_mfu: float = 0.55
    """Achieved fraction of peak FLOPs in prefill (reference cost model 0.55)."""
    train_mfu: float = 0.40
    """Achieved fraction of peak FLOPs in training (Megatron-class, long sequences)."""
    memory_utilization: float = 0.90
    """Fraction of HBM the inference engine may use (vLLM ``gpu_memory_utilization``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A decoder-only transformer (dense or MoE), from its ``config.json``."""

    name: str
    num_params: float
    """Total parameters (weights read from HBM scale with this for dense models)."""
    num_active_params: float
    """Parameters used per token (= ``num_params`` for dense models)."""
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_experts: int = 0
    num_active_experts: int = 0
    expert_params: float = 0.0
    """Parameters inside routed experts (all layers); 0 for dense models."""
    dtype_bytes: int = 2

    @property
    def is_moe(self) -> bool:
        """Whether the model routes tokens to experts."""
        return self.num_experts > 0
