"""Lower bound on the makespan of a trace on a cluster (no schedule can beat it).

``lower_bound_s = max(work / devices, longest trajectory on its fastest instance)``:

- work: every decoded token reads at least its own context's KV (full heads, TP1 layout)
  plus 1/256 of the weights (the largest batch), or costs its FLOPs at prefill MFU,
  whichever is larger; prefill of prompts and payloads costs its FLOPs; a training step
  costs its FLOPs at training MFU. Summed in device-seconds over all devices.
- longest: each trajectory alone on an instance of the TP degree that runs it fastest
  (batch 1), plus its tool latency; the maximum over trajectories.

Both terms use the same roofline as the simulated instances, without communication,
queueing or weight-sync time, so ``lower_bound_s <= makespan_s`` for every system.
"""

from __future__ import annotations

from services.coordinator.planner.costmodel import (
    MAX_BATCH_SEQS,
    kv_bytes_per_token,
    kv_capacity_tokens,
    prefill_s,
    step_s,
    weights_read_per_gpu,
)
from sim.presets import ClusterSpec
from sim.trace import TraceTrajectory

TPS = (1, 2, 4, 8)


def rollout_work_gpu_s(cluster: ClusterSpec, traj: TraceTrajectory) -> float:
    """Minimum device-seconds of decode and prefill for one trajectory."""
    hw, m = cluster.hardware, cluster.model
    bw = hw.hbm_bw_bytes_per_s * hw.hbm_efficiency
    flops_rate = hw.peak_flops * hw.prefill_mfu
    w_per_token = weights_read_per_gpu(m, 1, MAX_BATCH_SEQS) / MAX_BATCH_SEQS
    kvb = kv_bytes_per_token(m, 1)
    attn = 4.0 * m.num_layers * m.num_heads * m.head_dim
    mem = flops = 0.0
    ctx = traj.prompt_tokens
    flops += (2.0 * m.num_active_params + attn * ctx / 2.0) * ctx
    for turn in traj.turns:
        out = turn.output_tokens
        kv_sum = ctx * out + out * out / 2.0
        mem += out * w_per_token + kv_sum * kvb
        flops += 2.0 * m.num_active_params * out + attn * kv_sum
        ctx += out
        if turn.tool is not None:
            p = turn.tool.payload_tokens
            flops += (2.0 * m.num_active_params + attn * (ctx + p / 2.0)) * p
            ctx += p
    return max(mem / bw, flops / flops_rate)


def critical_path_s(cluster: ClusterSpec, traj: TraceTrajectory) -> float:
    """Fastest time for one trajectory alone: min over TP degrees that hold it."""
    hw, m = cluster.hardware, cluster.model
    best = float("inf")
    for tp in TPS:
        if tp > cluster.gpus_per_node or kv_capacity_tokens(hw, m, tp) < traj.total_tokens:
            continue
        t, ctx = 0.0, traj.prompt_tokens
        t += prefill_s(hw, m, tp, ctx)
        for turn in traj.turns:
            out = turn.output_tokens
            t += out * step_s(hw, m, tp, 1, ctx + out / 2.0)
            ctx += out
            if turn.tool is not None:
                t += turn.tool.latency_s + prefill_s(hw, m, tp, turn.tool.payload_tokens, ctx)
                ctx += turn.tool.payload_tokens
        best = min(best, t)
    return best


def train_work_gpu_s(cluster: ClusterSpec, trace: list[TraceTrajectory]) -> float:
    """Minimum device-seconds of all training steps (FLOPs at training MFU)."""
    hw, m = cluster.hardware, cluster.model
    attn = 4.0 * m.num_layers * m.num_heads * m.head_dim
    total = 0.0
    for traj in trace:
        seq = traj.total_tokens
        total += (8.0 * m.num_active_params + 4.0 * attn * seq / 2.0) * seq
    return total / (hw.peak_flops * hw.train_mfu)


def lower_bound_s(cluster: ClusterSpec, trace: list[TraceTrajectory]) -> dict[str, float]:
    """The bound and its two terms."""
    work = sum(rollout_work_gpu_s(cluster, t) for t in trace) + train_work_gpu_s(cluster, trace)
    longest = max(critical_path_s(cluster, t) for t in trace)
    work_s = work / cluster.num_gpus
    return {
        "lower_bound_s": max(work_s, longest),
        "work_bound_s": work_s,
        "critical_path_s": longest,
    }
