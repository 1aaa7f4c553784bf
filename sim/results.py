"""The raw counters of one simulated run (``sim.run`` summarises them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.instance import Instance
from sim.state import TrajState

if TYPE_CHECKING:
    from sim.engine import Simulator


def simulator_result(sim: Simulator) -> dict[str, Any]:
    """The raw result of a finished run: ``raw_result`` over the loop's tallies."""
    return raw_result(
        sim.instances, sim.nodes.created_s, sim.nodes.retired_by_bucket, sim.trainer.log,
        sim.trajs, counters={
            "idle_while_queued": dict(sim.idle_while_queued),
            "retired_busy_gpu_s": sim.nodes.retired_busy_gpu_s,
            "train_busy_gpu_s": sim.trainer.busy_gpu_s,
            "migrations": sim.migrations,
            "planner_moves": sim.planner_moves + sim.pool.moves,
            "consumed_staleness": sim.batches.staleness,
            "partial_rollouts": sim.partial_rollouts,
            "drain_s": sim.drain_s,
            "rejected": sim.rejected,
            "plan_events": sim.plan_events,
            "move_log": sim.move_log,
            "policy_stats": sim.policy.stats(),
        },
    )


def raw_result(
    instances: dict[str, Instance],
    created_s: dict[str, float],
    retired_by_bucket: dict[str, list[float]],
    train_log: list[dict[str, Any]],
    trajs: list[TrajState],
    counters: dict[str, Any],
) -> dict[str, Any]:
    """Makespan, busy GPU-seconds (torn-down instances included), latencies, counters.

    ``counters`` carries the loop's own tallies through (``retired_busy_gpu_s`` is
    folded into ``rollout_busy_gpu_s``).
    """
    end = train_log[-1]["start_s"] + train_log[-1]["train_s"] if train_log else 0.0
    rollout_gpu_s = sum(inst.busy_s * inst.tp for inst in instances.values())
    # Busy over held GPU-seconds per bucket, torn-down instances included.
    bucket_busy = {b: list(pair) for b, pair in retired_by_bucket.items()}
    for iid, inst in instances.items():
        pair = bucket_busy.setdefault(inst.bucket, [0.0, 0.0])
        pair[0] += inst.busy_s * inst.tp
        pair[1] += max(0.0, end - created_s[iid]) * inst.tp
    out = dict(counters)
    retired = out.pop("retired_busy_gpu_s")
    return {
        **out,
        "bucket_busy_fraction": {
            b: busy / held if held else 0.0 for b, (busy, held) in sorted(bucket_busy.items())
        },
        "makespan_s": end,
        "rollout_busy_gpu_s": rollout_gpu_s + retired,
        "latencies_s": [t.finished_s - t.released_s for t in trajs],
        "train_log": train_log,
        "max_kv_fraction": max(
            (i.max_kv_reserved / max(1, i.kv_capacity) for i in instances.values()),
            default=0.0,
        ),
    }
