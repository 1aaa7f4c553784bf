"""Each static peer's own best split and layout: an oracle sweep (issue 20 item 4).

A peer at the reference's split may lose only because that split suits Libra's design,
so the comparison also runs every static peer at the split and node pattern that
maximise *its* throughput on the tuning traces. No real user has this oracle: it is
chosen with the trace in hand. The choice is made once, on the tuning seeds, and
applied to every seed, so the split never depends on the seed under test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from libra.errors import InvalidArgument
from scheduling.planner import kv_capacity_tokens
from sim.presets import ClusterSpec
from sim.run import run
from sim.systems import STATIC_PEERS, SystemConfig, system
from sim.trace import TraceTrajectory

HOMOGENEOUS_LAYOUTS = ((1,) * 8, (2, 2, 2, 2), (4, 4), (8,))
HETEROGENEOUS_LAYOUTS = ((1, 1, 2, 4), (1, 1, 1, 1, 4), (1, 1, 2, 2, 2), (2, 2, 4))
LAYOUTS_BY_POLICY = {
    # Length-blind routing gains nothing from mixed TP degrees; bucket policies need them.
    "least_loaded": HOMOGENEOUS_LAYOUTS,
    "length_aware": HETEROGENEOUS_LAYOUTS,
    "la_mlfq": HETEROGENEOUS_LAYOUTS,
}
SPLIT_FRACTIONS = (1 / 6, 1 / 3, 1 / 2, 2 / 3, 5 / 6)
"""Training shares swept (at 6 nodes: 8, 16, 24, 32, 40 training GPUs)."""


def split_choices(cluster: ClusterSpec) -> tuple[int, ...]:
    """Training GPU counts swept: whole nodes, both stages kept."""
    nodes = cluster.num_nodes
    picked = sorted({min(nodes - 1, max(1, round(nodes * f))) for f in SPLIT_FRACTIONS})
    return tuple(n * cluster.gpus_per_node for n in picked)


def check_split(cluster: ClusterSpec, train_gpus: int) -> None:
    """Raise ``InvalidArgument("split")`` unless ``train_gpus`` is whole nodes, both stages kept."""
    gpn = cluster.gpus_per_node
    if train_gpus % gpn or not 0 < train_gpus < cluster.num_gpus:
        raise InvalidArgument(
            "split",
            f"{train_gpus} training GPUs is not a split of {cluster.name}: whole {gpn}-GPU "
            f"nodes, at least one node each for training and rollout",
        )


def check_layout(
    cluster: ClusterSpec, pattern: Sequence[int], trace: list[TraceTrajectory]
) -> None:
    """Raise ``InvalidArgument("layout")`` unless the node pattern fills a node and each of
    its instances holds the trace's longest trajectory in its KV cache."""
    if sum(pattern) != cluster.gpus_per_node or any(tp <= 0 for tp in pattern):
        raise InvalidArgument(
            "layout", f"{list(pattern)} does not fill a {cluster.gpus_per_node}-GPU node"
        )
    longest = max(trace, key=lambda t: t.total_tokens)
    for tp in sorted(set(pattern)):
        cap = kv_capacity_tokens(cluster.hardware, cluster.model, tp)
        if cap < longest.total_tokens:
            raise InvalidArgument(
                "layout",
                f"{list(pattern)} is infeasible: a TP{tp} instance holds {cap} KV tokens, "
                f"trajectory {longest.trajectory_id} needs {longest.total_tokens}",
            )


def peer(name: str) -> SystemConfig:
    """A static peer by name; ``InvalidArgument("system")`` for anything else."""
    if name not in STATIC_PEERS:
        raise InvalidArgument(
            "system",
            f"{name!r} is not a static peer that can be swept; valid: {', '.join(STATIC_PEERS)}",
        )
    return system(name)


def best_static(
    cluster: ClusterSpec,
    tuning_traces: list[list[TraceTrajectory]],
    name: str,
    splits: Sequence[int] | None = None,
    layouts: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The split and node pattern with the highest mean throughput on ``tuning_traces``.

    Returns:
        ``{"system", "train_gpus", "pattern", "throughput_traj_per_s", "grid"}``; ``grid``
        lists every (train_gpus, pattern, mean throughput or None if infeasible).

    Raises:
        InvalidArgument: Naming ``system``, ``split`` or ``layout`` for an unknown peer,
            a split that is not whole nodes with both stages kept, or a layout that does
            not fill a node or cannot hold the traces' longest trajectory.
    """
    base = peer(name)
    splits = tuple(splits) if splits is not None else split_choices(cluster)
    layouts = tuple(layouts) if layouts is not None else _family(cluster, base)
    everything = [t for trace in tuning_traces for t in trace]
    for train_gpus in splits:
        check_split(cluster, train_gpus)
    for pattern in layouts:
        check_layout(cluster, pattern, everything)
    grid: list[dict[str, Any]] = []
    for train_gpus in splits:
        for pattern in layouts:
            arm = base.with_split(train_gpus, tuple(pattern), "oracle")
            results = [run(cluster, trace, arm) for trace in tuning_traces]
            ok = [r["throughput_traj_per_s"] for r in results if r.get("feasible")]
            mean = float(np.mean(ok)) if len(ok) == len(results) else None
            grid.append({"train_gpus": train_gpus, "pattern": list(pattern), "throughput": mean})
    feasible = [g for g in grid if g["throughput"] is not None]
    if not feasible:
        raise InvalidArgument("layout", f"no swept split and layout of {name} is feasible")
    best = max(feasible, key=lambda g: g["throughput"])
    return {
        "system": name,
        "train_gpus": best["train_gpus"],
        "pattern": best["pattern"],
        "throughput_traj_per_s": best["throughput"],
        "grid": grid,
    }


def _family(cluster: ClusterSpec, base: SystemConfig) -> tuple[tuple[int, ...], ...]:
    """The peer's layout family, kept to patterns that fill a node of this cluster."""
    family = LAYOUTS_BY_POLICY.get(base.policy, base.node_patterns)
    fits = tuple(p for p in family if sum(p) == cluster.gpus_per_node)
    return fits or base.node_patterns
