"""A snapshot of instance loads indexed per bucket, kept up to date on every load change.

Routing picks the least-loaded live instance under its bucket's cap, ties round-robin by
id. Over a plain list that is a scan of every instance per placement and per move: at
1,000 instances ~0.5 ms, most of a scheduler tick. ``LoadIndex`` is a drop-in
``Sequence[InstanceLoad]`` (code that iterates the loads sees the same list) that also
keeps, per bucket of the layout, the ids of the *eligible* instances (live, under the
cap) grouped by load, each group sorted by id. ``routing`` and ``live_gpu_shares`` use it
when they are given one:

- the least load of a bucket is a lookup; the round-robin pick among the tied is a
  bisect (``RoundRobinCursor.pick``);
- a load change (``add_load``) moves one id between two groups: a bisect and a list
  insert/remove, plus, when the least group empties, a scan of the bucket's distinct
  loads (at most the cap plus one, independent of the number of instances).

Loads must change through ``add_load`` only: an ``InstanceLoad`` changed in place behind
the index's back leaves it stale (the scheduler's ``apply_local_load`` is the one writer).
Liveness and buckets do not change within a snapshot; a new snapshot is a new index.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import overload

from libra.types import InstanceId, InstanceLoad
from scheduling.policy.layout import BucketLayout


class _BucketLevels:
    """Eligible instance ids of one bucket by load; the least load is kept at hand."""

    __slots__ = ("by_load", "least")

    def __init__(self) -> None:
        self.by_load: dict[int, list[InstanceId]] = {}
        self.least: int | None = None

    def add(self, load: int, instance_id: InstanceId) -> None:
        bisect.insort(self.by_load.setdefault(load, []), instance_id)
        if self.least is None or load < self.least:
            self.least = load

    def remove(self, load: int, instance_id: InstanceId) -> None:
        ids = self.by_load[load]
        del ids[bisect.bisect_left(ids, instance_id)]
        if ids:
            return
        del self.by_load[load]
        if load == self.least:
            # Loads move by one: the next group up is the usual new least.
            if load + 1 in self.by_load:
                self.least = load + 1
            else:
                self.least = min(self.by_load) if self.by_load else None


class LoadIndex(Sequence[InstanceLoad]):
    """The instances of one snapshot, with per-bucket least-load lookups.

    Args:
        layout: The bucket layout routing uses (its per-instance caps decide eligibility;
            routing falls back to a scan when given an index built for other caps).
        instances: The snapshot; its ``InstanceLoad`` objects are shared, not copied.
    """

    def __init__(self, layout: BucketLayout, instances: Sequence[InstanceLoad]) -> None:
        self.caps = {b.name: b.max_trajectories_per_instance for b in layout.buckets}
        self._items = list(instances)
        self._by_id = {inst.instance_id: inst for inst in self._items}
        # The snapshot's instance ids (fixed): a tick compares them with the last set
        # instead of rebuilding it from 1,000 entries.
        self.ids = frozenset(self._by_id)
        # Live instances routing cannot reach (a bucket the layout lacks): they are never
        # in a bucket's groups, but count as idle when they hold nothing.
        self._unrouted = [inst for inst in self._items
                          if inst.is_live and inst.bucket not in self.caps]
        self._levels = {name: _BucketLevels() for name in self.caps}
        # Live instances per bucket, any bucket (``live_gpu_shares``): fixed per snapshot.
        self.live_by_bucket: dict[str, int] = {}
        for inst in sorted(self._items, key=lambda i: i.instance_id):
            if inst.is_live:
                self.live_by_bucket[inst.bucket] = self.live_by_bucket.get(inst.bucket, 0) + 1
            self._enter(inst)

    # -- Sequence ---------------------------------------------------------------------------

    @overload
    def __getitem__(self, index: int) -> InstanceLoad: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[InstanceLoad]: ...

    def __getitem__(self, index: int | slice) -> InstanceLoad | Sequence[InstanceLoad]:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[InstanceLoad]:
        return iter(self._items)

    # -- lookups ----------------------------------------------------------------------------

    def get(self, instance_id: str) -> InstanceLoad | None:
        """The instance's entry, or ``None`` if the snapshot does not hold it."""
        return self._by_id.get(InstanceId(instance_id))

    def least_load(self, bucket: str) -> int | None:
        """The least load of an eligible instance of ``bucket``; ``None`` if none is
        eligible (all full, dead, or the bucket is not in the layout)."""
        levels = self._levels.get(bucket)
        return None if levels is None else levels.least

    def ids_at(self, bucket: str, load: int) -> Sequence[InstanceId]:
        """Eligible instance ids of ``bucket`` holding ``load``, sorted (do not mutate)."""
        levels = self._levels.get(bucket)
        return () if levels is None else levels.by_load.get(load, ())

    def idle_ids(self) -> list[InstanceId]:
        """Live instances holding nothing, by id (``thresholds.idle_while_queued``):
        the load-0 groups plus unroutable ones, not a scan of every instance."""
        idle = [iid for levels in self._levels.values() for iid in levels.by_load.get(0, ())]
        idle += [inst.instance_id for inst in self._unrouted if inst.active_trajectories == 0]
        return sorted(idle)

    # -- changes ----------------------------------------------------------------------------

    def add_load(self, instance_id: str, delta: int) -> bool:
        """Change one instance's load by ``delta`` (the entry is updated in place);
        ``False`` if the snapshot does not hold the instance."""
        inst = self._by_id.get(InstanceId(instance_id))
        if inst is None:
            return False
        self._leave(inst)
        inst.active_trajectories += delta
        self._enter(inst)
        return True

    def _eligible(self, inst: InstanceLoad) -> bool:
        cap = self.caps.get(inst.bucket)
        return cap is not None and inst.is_live and inst.active_trajectories < cap

    def _enter(self, inst: InstanceLoad) -> None:
        if self._eligible(inst):
            self._levels[inst.bucket].add(inst.active_trajectories, inst.instance_id)

    def _leave(self, inst: InstanceLoad) -> None:
        if self._eligible(inst):
            self._levels[inst.bucket].remove(inst.active_trajectories, inst.instance_id)
