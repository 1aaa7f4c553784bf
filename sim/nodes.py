"""The simulator's rollout nodes: their instances, load records and retired totals.

The load records are also kept in a ``LoadIndex`` (the live scheduler's per-bucket
least-load index), so that a placement or a move looks loads up instead of scanning
every instance: at 1,000 GPUs the scans were ~15% of a run. The index is rebuilt after a
node is built, torn down or comes up (liveness and membership are fixed within one
index), and every load change goes through ``add_load`` while it is current.
"""

from __future__ import annotations

from collections.abc import Callable

from libra.types import InstanceId, InstanceLoad
from scheduling.planner import HardwareSpec, ModelSpec
from scheduling.policy import BucketLayout
from scheduling.policy.load_index import LoadIndex
from sim.instance import Instance


class NodeRegistry:
    """Instances by id and node, the scheduler's load records, busy time of torn-down ones.

    Args:
        hw: Device.
        model: Model.
        bucket_for_tp: Bucket name of an instance of a TP degree.
        layout: The policy's bucket layout (the index's per-instance caps).
    """

    def __init__(
        self, hw: HardwareSpec, model: ModelSpec, bucket_for_tp: Callable[[int], str],
        layout: BucketLayout,
    ) -> None:
        self._hw, self._model, self._bucket_for_tp = hw, model, bucket_for_tp
        self._layout = layout
        self._index: LoadIndex | None = None
        """The load records indexed; ``None`` after a membership or liveness change."""
        self.instances: dict[str, Instance] = {}
        self.loads: dict[str, InstanceLoad] = {}
        self.load_list: list[InstanceLoad] = []
        self.node_patterns: dict[int, tuple[int, ...]] = {}
        self.created_s: dict[str, float] = {}
        self.retired_by_bucket: dict[str, list[float]] = {}
        """Per bucket: [busy GPU-s, held GPU-s] of instances already torn down."""
        self.retired_busy_gpu_s = 0.0
        self.builds: dict[int, int] = {}
        """Times each node was built: a weight load finishing for an earlier build of a
        node (torn down and re-created meanwhile) does not bring up the new one."""
        self._last_version: dict[str, int] = {}
        """Segment version of each torn-down instance id: a node re-created with the same
        id continues past it, so a wake-up left from the old instance stays stale."""

    def build(self, node: int, pattern: tuple[int, ...], alive: bool, now: float) -> None:
        """Create a node's instances (``alive`` False until its weights are loaded)."""
        self.node_patterns[node] = pattern
        self.builds[node] = self.builds.get(node, 0) + 1
        for j, tp in enumerate(pattern):
            iid = f"n{node:04d}-i{j}-tp{tp}"
            bucket = self._bucket_for_tp(tp)
            inst = Instance.create(iid, tp, bucket, node, self._hw, self._model)
            inst.alive = alive
            inst.version = self._last_version.pop(iid, -1) + 1
            self.instances[iid] = inst
            self.created_s[iid] = now
            load = InstanceLoad(InstanceId(iid), bucket, 0, is_live=alive)
            self.loads[iid] = load
            self.load_list.append(load)
        self._index = None

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
            self._last_version[iid] = inst.version
        self.node_patterns.pop(node, None)
        self._index = None
        return removed

    def mark_up(self, node: int) -> None:
        """A re-created node finished loading its weights: its instances go live."""
        for inst in self.instances.values():
            if inst.node == node:
                inst.alive = True
                self.loads[inst.iid].is_live = True
        self._index = None

    def stop_admitting(self, node: int) -> None:
        """A draining node: its instances serve what they hold but routing skips them."""
        for inst in self.instances.values():
            if inst.node == node:
                self.loads[inst.iid].is_live = False
        self._index = None

    def index(self) -> LoadIndex:
        """The load records as routing reads them (built on first use after a change)."""
        if self._index is None:
            self._index = LoadIndex(self._layout, self.load_list)
        return self._index

    def add_load(self, iid: str, delta: int) -> None:
        """Change an instance's pinned count (``KeyError`` if it is not live here)."""
        load = self.loads[iid]
        if self._index is None:
            load.active_trajectories += delta
        else:
            self._index.add_load(iid, delta)
