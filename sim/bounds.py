"""Lower bounds on the makespan of a trace on a cluster (no schedule can beat them).

``lower_bound_s = max(work_bound_s, step_chain_bound_s)``, both reported:

- ``work_bound_s``: total device work / devices (below);
- ``step_chain_bound_s``: the RL loop's dependency chain. Step s's rollout cannot end
  before its longest trajectory has run alone on its fastest instance; its training
  cannot start before that nor before training step s-1 ended (one trainer); and step s
  cannot be released before training step s - staleness - 1 ended (the staleness bound;
  ``staleness = 0`` is the synchronous loop). The chain's last training end is the bound.
  It contains the old "longest trajectory" term (``critical_path_s``), so it is never lower.

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

from scheduling.planner.costmodel import (
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


def step_chain_bound_s(
    longest_s_by_step: list[float], train_s_by_step: list[float], staleness: int
) -> float:
    """End of the last training step of the fastest possible RL loop.

    Args:
        longest_s_by_step: Per step (in order), its longest trajectory alone on its
            fastest instance.
        train_s_by_step: Per step, its training time on every device of the cluster.
        staleness: Step s is released once training step s - staleness - 1 has ended.

    Raises:
        ValueError: If the lists differ in length or ``staleness`` is negative.
    """
    if len(longest_s_by_step) != len(train_s_by_step):
        raise ValueError("longest_s_by_step and train_s_by_step must have one entry per step")
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    train_end_s: list[float] = []
    for s, (longest, train) in enumerate(zip(longest_s_by_step, train_s_by_step, strict=True)):
        gate = s - staleness - 1
        released = train_end_s[gate] if gate >= 0 else 0.0
        start = max(released + longest, train_end_s[-1] if train_end_s else 0.0)
        train_end_s.append(start + train)
    return train_end_s[-1] if train_end_s else 0.0


def lower_bound_s(
    cluster: ClusterSpec, trace: list[TraceTrajectory], staleness: int = 0,
    stream: bool = False, group: bool = False,
) -> dict[str, float]:
    """The bound, its two bounds and the longest-trajectory term.

    ``staleness`` is the compared system's bound (0 for the synchronous loop); a larger
    one only loosens the chain, so each system is measured against its own constraint.
    ``stream``: a step trains on whichever units finish first, so its chain term is the
    shortest unit's critical path, not its step's longest; ``group``: the unit is a
    GRPO group, ready when its longest member is (``sim.trainer.BatchSource``).
    """
    work = sum(rollout_work_gpu_s(cluster, t) for t in trace) + train_work_gpu_s(cluster, trace)
    work_s = work / cluster.num_gpus
    steps = sorted({t.step for t in trace})
    paths = [critical_path_s(cluster, t) for t in trace]
    longest_by_step = {s: 0.0 for s in steps}
    for t, path in zip(trace, paths, strict=True):
        longest_by_step[t.step] = max(longest_by_step[t.step], path)
    train_by_step = [
        train_work_gpu_s(cluster, [t for t in trace if t.step == s]) / cluster.num_gpus
        for s in steps
    ]
    per_step = [longest_by_step[s] for s in steps]
    if stream:
        unit_s: dict[tuple[int, str], float] = {}
        for t, path in zip(trace, paths, strict=True):
            key = (t.step, t.group_id if group else t.trajectory_id)
            unit_s[key] = max(unit_s.get(key, 0.0), path)
        per_step = [min(unit_s.values())] * len(steps)
    chain_s = step_chain_bound_s(per_step, train_by_step, staleness)
    return {
        "lower_bound_s": max(work_s, chain_s),
        "work_bound_s": work_s,
        "step_chain_bound_s": chain_s,
        "critical_path_s": max(longest_by_step.values()),
    }
