"""The planner twin on a slice of a large fleet (issue 20 item 5, session 19).

A twin run costs CPU in proportion to the work it simulates: at 1,000 GPUs one run of
r2e took ~3.1 s (1,280 trajectories a step on 111 rollout nodes), so a decision of
three runs missed the 2 s the issue allows off the step path. A fleet that large is
many copies of the same few node patterns serving a load spread across them, so a 1/k
slice keeps what sets the step interval: the same layout in the same proportions, the
same trajectories per instance, the same length distribution, the same training time.
The twin then simulates ``k`` times less work:

- **Work:** every k-th GRPO group of each replayed step, the step's groups ordered by
  their longest member (longest first, so the slice keeps the step's longest group and
  a systematic sample of the rest of the distribution).
- **Rollout:** each node pattern's count divided by ``k`` (rounded, at least one).
- **Training:** the full plan's training group, training each batch as the whole step
  (``SimTrainer``'s ``token_scale``: trajectories replayed / trajectories in the slice),
  so its step time is the full plan's.

What a slice cannot keep: the tail of a step of ``k`` times more trajectories is
longer (its longest member is the maximum of more draws), and rounding a pattern's
count changes capacity by up to half a node in the slice. Both are measured against the
full twin and the simulated runs in ``benchmarks/bench_twin_splits.py --gpus 1000``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from libra.errors import InvalidArgument
from scheduling.planner import Plan
from sim.presets import ClusterSpec
from sim.trace import TraceTrajectory

TWIN_SLICE_NODES = 25
"""Fewest nodes a slice keeps: a cluster of ``k`` times this many nodes is simulated as a
1/k slice (``num_nodes // TWIN_SLICE_NODES``; the 48-GPU cluster, 6 nodes, is never
sliced). At 1,000 GPUs (125 nodes) that is a fifth, about 200 GPUs: the smallest slice
measured whose decisions all took under the 2 s the issue allows, in one process
(session 19: 1.75 s max against 10.4 s for the whole fleet). Against the simulated runs
it agreed within +-15% on 15 of 27 candidates against the whole fleet's 17, and its
picks were 1.022x the best against 1.014x (``bench_twin_splits.py --gpus 1000``)."""
MIN_SLICE_GROUPS = 16
"""Fewest GRPO groups a sliced step keeps: the 48-GPU twin's 16 prompts a step, the
scale at which the twin's agreement with the simulator was measured."""


def check_slice_nodes(slice_nodes: object) -> int | None:
    """``slice_nodes`` if it is ``None`` or an integer >= 1, else ``InvalidArgument``."""
    if slice_nodes is None:
        return None
    if isinstance(slice_nodes, bool) or not isinstance(slice_nodes, int) or slice_nodes < 1:
        raise InvalidArgument(
            "slice_nodes", f"must be None or an integer >= 1, got {slice_nodes!r}"
        )
    return slice_nodes


def slice_factor(
    num_nodes: int, steps: Sequence[Sequence[TraceTrajectory]], slice_nodes: int | None
) -> int:
    """How many times smaller the twin's slice is (1: the whole fleet): bounded by the
    nodes (``slice_nodes`` per slice) and by the groups of the smallest replayed step
    (``MIN_SLICE_GROUPS`` per sliced step)."""
    if slice_nodes is None or not steps:
        return 1
    groups = min(len({t.group_id for t in step}) for step in steps)
    return max(1, min(num_nodes // slice_nodes, groups // MIN_SLICE_GROUPS))


def sample_step(step: Sequence[TraceTrajectory], k: int) -> tuple[TraceTrajectory, ...]:
    """Every ``k``-th group of one step, its groups ordered longest first (by their
    longest member's total tokens; ties by group id), members in their trace order."""
    if k == 1:
        return tuple(step)
    groups: dict[str, list[TraceTrajectory]] = {}
    for traj in step:
        groups.setdefault(traj.group_id, []).append(traj)
    order = sorted(groups, key=lambda g: (-max(t.total_tokens for t in groups[g]), g))
    kept = set(order[::k])
    return tuple(t for t in step if t.group_id in kept)


def sliced_run(cluster: ClusterSpec, plan: Plan, k: int) -> tuple[ClusterSpec, Plan]:
    """The cluster and plan a 1/k slice runs: the full training group, each rollout
    node pattern's count divided by ``k`` (rounded, at least one, in the plan's order)."""
    if k == 1:
        return cluster, plan
    counts: dict[tuple[int, ...], int] = {}
    for pattern in plan.rollout_nodes:
        counts[pattern] = counts.get(pattern, 0) + 1
    nodes = tuple(p for p, n in counts.items() for _ in range(max(1, round(n / k))))
    train_nodes = plan.train_gpus // cluster.gpus_per_node
    return replace(cluster, num_nodes=train_nodes + len(nodes)), Plan(plan.train, nodes)
