"""A plan: the train/rollout split, training parallelism and rollout node layout.

Plans are node-granular: training takes whole nodes; every rollout node runs one
``NodePattern`` (the TP degrees of its instances, summing to the node's devices), as
the reference's per-node pattern ``[1, 1, 2, 4]``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from scheduling.planner.costmodel import TrainParallelism

NodePattern = tuple[int, ...]


class PlanError(ValueError):
    """A plan the cluster cannot run; the message names the offending field."""


def pipeline_depth(max_staleness: int) -> int:
    """Rollout steps in flight at once: the one being consumed plus ``max_staleness``
    ahead of it (a synchronous loop, staleness 0, has depth 1).

    The one place both the live planner (``live_planner``: the job's
    ``algorithm.max_staleness``) and the simulator (``SystemConfig.staleness``) read it.

    Raises:
        PlanError: Negative staleness.
    """
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise PlanError(f"max_staleness: must be an integer >= 0, got {max_staleness!r}")
    return max_staleness + 1


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """Devices the planner divides."""

    num_nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.num_nodes <= 0 or self.gpus_per_node <= 0:
            raise PlanError(
                f"cluster: needs at least one node of at least one device, got "
                f"num_nodes={self.num_nodes} gpus_per_node={self.gpus_per_node}"
            )

    @property
    def num_gpus(self) -> int:
        """All devices."""
        return self.num_nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class Plan:
    """Train group plus rollout node patterns.

    Attributes:
        train: Parallelism of the core training group.
        rollout_nodes: One pattern per rollout node.
    """

    train: TrainParallelism
    rollout_nodes: tuple[NodePattern, ...]

    @property
    def train_gpus(self) -> int:
        """Devices of the core training group."""
        return self.train.num_gpus

    @property
    def rollout_tps(self) -> tuple[int, ...]:
        """TP degree of every rollout instance."""
        return tuple(tp for node in self.rollout_nodes for tp in node)

    @property
    def rollout_gpus(self) -> int:
        """Devices serving rollout."""
        return sum(self.rollout_tps)

    def key(self) -> tuple:
        """Identity for "is this a different plan": parallelism plus the TP multiset."""
        t = self.train
        return (t.tp, t.pp, t.dp, t.micro_batch, tuple(sorted(Counter(self.rollout_tps).items())))

    def rollout_share_recreated(self, new: Plan, gpus_per_node: int) -> float:
        """Share of this plan's rollout devices whose node changes pattern (or turns to
        training) when ``new`` replaces it: what a move tears down. Nodes are numbered
        training first, then ``rollout_nodes`` in order (``sim.replan.apply_plan``)."""
        old_first, new_first = self.train_gpus // gpus_per_node, new.train_gpus // gpus_per_node
        wanted = {new_first + i: p for i, p in enumerate(new.rollout_nodes)}
        torn = sum(sum(p) for i, p in enumerate(self.rollout_nodes)
                   if wanted.get(old_first + i) != p)
        return torn / max(1, self.rollout_gpus)

    def validate(self, cluster: ClusterShape) -> None:
        """Raise ``PlanError`` for plans the cluster cannot run.

        Rules: both stages keep at least one device; the replica size (``tp * pp``)
        divides the training devices and the node; every node pattern fills its node;
        the plan uses exactly the cluster's devices.
        """
        replica = self.train.tp * self.train.pp
        if self.train_gpus <= 0 or self.train.dp <= 0:
            raise PlanError(
                f"train: a plan must keep at least one training device, got {self.train}"
            )
        if not self.rollout_nodes:
            raise PlanError("rollout_nodes: a plan must keep at least one rollout node")
        if cluster.gpus_per_node % replica and replica % cluster.gpus_per_node:
            raise PlanError(
                f"train: replica size tp*pp={replica} does not divide the node "
                f"({cluster.gpus_per_node} devices) nor is a multiple of it"
            )
        if self.train_gpus % cluster.gpus_per_node:
            raise PlanError(
                f"train: {self.train_gpus} training devices is not a whole number of "
                f"{cluster.gpus_per_node}-device nodes"
            )
        for i, node in enumerate(self.rollout_nodes):
            if sum(node) != cluster.gpus_per_node or any(tp <= 0 for tp in node):
                raise PlanError(
                    f"rollout_nodes[{i}]: pattern {list(node)} must fill a "
                    f"{cluster.gpus_per_node}-device node with positive TP degrees"
                )
        if self.train_gpus + self.rollout_gpus != cluster.num_gpus:
            raise PlanError(
                f"plan uses {self.train_gpus} + {self.rollout_gpus} devices, cluster has "
                f"{cluster.num_gpus}"
            )

    def to_dict(self) -> dict:
        """JSON-able form (events, reports)."""
        t = self.train
        return {
            "train": {"tp": t.tp, "pp": t.pp, "dp": t.dp, "micro_batch": t.micro_batch},
            "train_gpus": self.train_gpus,
            "rollout_gpus": self.rollout_gpus,
            "rollout_tps": dict(sorted(Counter(self.rollout_tps).items())),
        }
