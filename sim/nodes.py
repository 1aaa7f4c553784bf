"""The simulator's rollout nodes: their instances, load records and retired totals."""

from __future__ import annotations

from collections.abc import Callable

from libra.types import InstanceId, InstanceLoad
from scheduling.planner import HardwareSpec, ModelSpec
from sim.instance import Instance


class NodeRegistry:
    """Instances by id and node, the scheduler's load records, busy time of torn-down ones.

    Args:
        hw: Device.
        model: Model.
        bucket_for_tp: Bucket name of an instance of a TP degree.
    """

    def __init__(
        self, hw: HardwareSpec, model: ModelSpec, bucket_for_tp: Callable[[int], str]
    ) -> None:
        self._hw, self._model, self._bucket_for_tp = hw, model, bucket_for_tp
        self.instances: dict[str, Instance] = {}
        self.loads: dict[str, InstanceLoad] = {}
        self.load_list: list[InstanceLoad] = []
        self.node_patterns: dict[int, tuple[int, ...]] = {}
        self.created_s: dict[str, float] = {}
        self.retired_by_bucket: dict[str, list[float]] = {}
        """Per bucket: [busy GPU-s, held GPU-s] of instances already torn down."""
        self.retired_busy_gpu_s = 0.0

    def build(self, node: int, pattern: tuple[int, ...], alive: bool, now: float) -> None:
        """Create a node's instances (``alive`` False until its weights are loaded)."""
        self.node_patterns[node] = pattern
        for j, tp in enumerate(pattern):
            iid = f"n{node:04d}-i{j}-tp{tp}"
            bucket = self._bucket_for_tp(tp)
            inst = Instance.create(iid, tp, bucket, node, self._hw, self._model)
            inst.alive = alive
            self.instances[iid] = inst
            self.created_s[iid] = now
            load = InstanceLoad(InstanceId(iid), bucket, 0, is_live=alive)
            self.loads[iid] = load
            self.load_list.append(load)

    def teardown(self, node: int, now: float) -> list[str]:
        """Remove a node's instances, account their time; return their ids."""
        removed = [i for i, inst in self.instances.items() if inst.node == node]
        for iid in removed:
            inst = self.instances.pop(iid)
            self.retired_busy_gpu_s += inst.busy_s * inst.tp
            pair = self.retired_by_bucket.setdefault(inst.bucket, [0.0, 0.0])
            pair[0] += inst.busy_s * inst.tp
            pair[1] += (now - self.created_s.pop(iid)) * inst.tp
            self.load_list.remove(self.loads.pop(iid))
            inst.evict_all()
        self.node_patterns.pop(node, None)
        return removed

    def mark_up(self, node: int) -> None:
        """A re-created node finished loading its weights: its instances go live."""
        for inst in self.instances.values():
            if inst.node == node:
                inst.alive = True
                self.loads[inst.iid].is_live = True
