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

- ``throughput_chain_bound_s`` (session 15): the step chain with the rollout's
  throughput in it (``throughput_chain_bound_s`` below has the proof); ``lower_bound_s``
  is the largest of the three.
"""

from __future__ import annotations

from libra.errors import InvalidArgument
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
    """Least device-seconds of all training steps, however the trajectories are batched.

    The simulator charges a batch's attention on its mean length (``_batch_train_s``),
    so a partition into batches costs ``sum_b total_b**2 / n_b`` of attention, which is
    at least ``total**2 / n`` (Cauchy-Schwarz): the whole trace as one batch. Charging
    each trajectory its own length (the sum of squares) could exceed what a run pays.
    """
    if not trace:
        return 0.0
    return _batch_train_s(cluster, trace) * cluster.num_gpus


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


def rollout_cost_s(cluster: ClusterSpec, traj: TraceTrajectory) -> tuple[float, float]:
    """(memory, FLOP) device-seconds one trajectory's generation needs at least.

    Memory: decode step j of a turn reads the context's KV so far (``ctx + j``, every
    KV head: a TP group's devices together hold at least that) and a 1/256 share of the
    weights (an engine step decodes at most ``MAX_BATCH_SEQS`` sequences and reads the
    weights once per device group). FLOPs: the decode, the prompt's prefill and each
    tool payload's (a prefix-cache hit; a move only adds work). A set of trajectories
    needs ``max(sum of memory, sum of FLOPs)`` device-seconds or more: each simulated
    engine step costs at least ``max(t_mem, t_flop)`` on each device of its group
    (``scheduling.planner.roofline``), and a segment's steps are timed on the chord of
    that convex function, never below it.
    """
    hw, m = cluster.hardware, cluster.model
    w_per_token = weights_read_per_gpu(m, 1, MAX_BATCH_SEQS) / MAX_BATCH_SEQS
    kvb = kv_bytes_per_token(m, 1)
    attn = 4.0 * m.num_layers * m.num_heads * m.head_dim
    ctx = traj.prompt_tokens
    mem, flops = 0.0, (2.0 * m.num_active_params + attn * ctx / 2.0) * ctx
    for turn in traj.turns:
        out = turn.output_tokens
        kv_sum = ctx * out + out * (out - 1) / 2.0
        mem += out * w_per_token + kv_sum * kvb
        flops += 2.0 * m.num_active_params * out + attn * kv_sum
        ctx += out
        if turn.tool is not None:
            p = turn.tool.payload_tokens
            flops += (2.0 * m.num_active_params + attn * (ctx + p / 2.0)) * p
            ctx += p
    return (mem / (hw.hbm_bw_bytes_per_s * hw.hbm_efficiency),
            flops / (hw.peak_flops * hw.prefill_mfu))


def _batch_train_s(
    cluster: ClusterSpec, batch: list[TraceTrajectory], *, attention: bool = True
) -> float:
    """Least time one training step on ``batch`` takes: the FLOPs the simulator charges
    (``train_step_s``: attention on the batch's *mean* length) on every device at the
    training MFU, without its all-reduce or pipeline bubble."""
    hw, m = cluster.hardware, cluster.model
    total = sum(t.total_tokens for t in batch)
    attn = 4.0 * m.num_layers * m.num_heads * m.head_dim * (total / len(batch)) / 2.0
    flops = (8.0 * m.num_active_params + (4.0 * attn if attention else 0.0)) * total
    return flops / (cluster.num_gpus * hw.peak_flops * hw.train_mfu)


def throughput_chain_bound_s(
    cluster: ClusterSpec, trace: list[TraceTrajectory], staleness: int, rollout_gpus: int,
    *, stream: bool = False, group: bool = False, paths: list[float] | None = None,
) -> float:
    """The step chain with the rollout's throughput: no schedule ends sooner.

    Per step s (barrier: training step s trains exactly step s's trajectories, after
    all have finished), with ``R_j`` the earliest release of step j (0, or the end of
    training step ``j - staleness - 1``), ``W(j..s)`` the generation work of steps j to
    s (``rollout_cost_s``, summed per set) and ``G`` = ``rollout_gpus``:

        train_start_s >= max(train_end_{s-1}, R_s + longest_s,
                             max over j <= s of R_j + W(j..s) / G)
        train_end_s = train_start_s + step s's training FLOPs / all devices

    Proof: steps are released in order, so every trajectory of steps j..s starts at or
    after ``R_j`` and finishes before training step s starts; in between at most G
    devices generate, each doing at most one device-second of work per second. By
    induction on s, every simulated run's training ends are at or after these.
    Streaming (a step trains whichever units finished first): the last training step
    starts only after every trajectory has finished and trains at least one unit, so
    the bound is ``max(longest trajectory, W(all) / G) + the cheapest unit's training``.
    """
    if paths is None:
        paths = [critical_path_s(cluster, t) for t in trace]
    costs = [rollout_cost_s(cluster, t) for t in trace]
    if stream:
        units: dict[tuple[int, str], list[TraceTrajectory]] = {}
        for t in trace:
            units.setdefault((t.step, t.group_id if group else t.trajectory_id), []).append(t)
        # The last batch's training: at least the dense FLOPs of one unit.
        last_train_s = min(_batch_train_s(cluster, u, attention=False) for u in units.values())
        work = max(sum(c[0] for c in costs), sum(c[1] for c in costs)) / rollout_gpus
        return max(max(paths), work) + last_train_s
    steps = sorted({t.step for t in trace})
    index = {s: i for i, s in enumerate(steps)}
    mem, flop, longest = ([0.0] * len(steps) for _ in range(3))
    by_step: list[list[TraceTrajectory]] = [[] for _ in steps]
    for t, (m_s, f_s), path in zip(trace, costs, paths, strict=True):
        i = index[t.step]
        mem[i], flop[i] = mem[i] + m_s, flop[i] + f_s
        longest[i] = max(longest[i], path)
        by_step[i].append(t)
    train_s = [_batch_train_s(cluster, batch) for batch in by_step]
    release: list[float] = []
    train_end: list[float] = []
    for s in range(len(steps)):
        gate = s - staleness - 1
        release.append(train_end[gate] if gate >= 0 else 0.0)
        start = max(train_end[-1] if train_end else 0.0, release[s] + longest[s])
        mem_sum = flop_sum = 0.0
        for j in range(s, -1, -1):
            mem_sum, flop_sum = mem_sum + mem[j], flop_sum + flop[j]
            start = max(start, release[j] + max(mem_sum, flop_sum) / rollout_gpus)
        train_end.append(start + train_s[s])
    return train_end[-1] if train_end else 0.0


def lower_bound_s(
    cluster: ClusterSpec, trace: list[TraceTrajectory], staleness: int = 0,
    stream: bool = False, group: bool = False, max_rollout_gpus: int | None = None,
) -> dict[str, float]:
    """The bound, its three bounds and the longest-trajectory term.

    ``staleness`` is the compared system's bound (0 for the synchronous loop); a larger
    one only loosens the chain, so each system is measured against its own constraint.
    ``stream``: a step trains on whichever units finish first, so its chain term is the
    shortest unit's critical path, not its step's longest; ``group``: the unit is a
    GRPO group, ready when its longest member is (``sim.trainer.BatchSource``).
    ``max_rollout_gpus``: the most devices that ever generate at once (default: all;
    a disaggregated loop keeps at least one node training).

    Raises:
        InvalidArgument: ``max_rollout_gpus`` outside [1, the cluster's devices].
    """
    # Generation work per set (``rollout_cost_s``): the larger of the summed memory and
    # the summed FLOP time. The larger of the two per trajectory, summed, could exceed
    # what a run pays when prefill-heavy and decode-heavy work share engine steps.
    costs = [rollout_cost_s(cluster, t) for t in trace]
    rollout_work = max(sum(c[0] for c in costs), sum(c[1] for c in costs)) if costs else 0.0
    work_s = (rollout_work + train_work_gpu_s(cluster, trace)) / cluster.num_gpus
    steps = sorted({t.step for t in trace})
    paths = [critical_path_s(cluster, t) for t in trace]
    longest_by_step = {s: 0.0 for s in steps}
    for t, path in zip(trace, paths, strict=True):
        longest_by_step[t.step] = max(longest_by_step[t.step], path)
    train_by_step = [_batch_train_s(cluster, [t for t in trace if t.step == s]) for s in steps]
    per_step = [longest_by_step[s] for s in steps]
    if stream:
        unit_s: dict[tuple[int, str], float] = {}
        for t, path in zip(trace, paths, strict=True):
            key = (t.step, t.group_id if group else t.trajectory_id)
            unit_s[key] = max(unit_s.get(key, 0.0), path)
        per_step = [min(unit_s.values())] * len(steps)
    chain_s = step_chain_bound_s(per_step, train_by_step, staleness)
    rollout_gpus = cluster.num_gpus if max_rollout_gpus is None else max_rollout_gpus
    if not isinstance(rollout_gpus, int) or not 1 <= rollout_gpus <= cluster.num_gpus:
        raise InvalidArgument(
            "max_rollout_gpus", f"must be an integer in [1, {cluster.num_gpus}], got "
            f"{max_rollout_gpus!r}"
        )
    throughput_s = throughput_chain_bound_s(
        cluster, trace, staleness, rollout_gpus, stream=stream, group=group, paths=paths
    )
    return {
        "lower_bound_s": max(work_s, chain_s, throughput_s),
        "work_bound_s": work_s,
        "step_chain_bound_s": chain_s,
        "throughput_chain_bound_s": throughput_s,
        "critical_path_s": max(longest_by_step.values()),
    }
