"""What the scheduler holds per running job, and the policy built from its spec (pure)."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from libra import types as t
from libra.data import DatasetRow, DatasetSplit
from libra.jobspec import JobSpec
from libra.types import ToolReturnReport as ToolReturnReport  # re-exported (its home moved)
from scheduling.policy.base import PlacementPolicy
from scheduling.policy.cmlfq import CmlfqConfig
from scheduling.policy.layout import BucketLayout
from scheduling.policy.load_index import LoadIndex
from scheduling.policy.registry import PolicyConfig

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from services.scheduler.store_protocol import FlushablePolicyStore


@dataclass
class JobRun:
    """What the scheduler holds for one running job."""

    job_id: str
    spec: JobSpec
    policy: PlacementPolicy
    policy_store: FlushablePolicyStore
    # The job's training prompts (libra/data): rows by draw, in the seeded epoch order.
    prompts: DatasetSplit
    last_step: int = 0
    # Draws taken from ``prompts`` (admitted groups plus rows skipped as unrenderable).
    next_group: int = 0
    num_skipped_rows: int = 0
    decisions: collections.Counter[str] = field(default_factory=collections.Counter)
    migrations: int = 0
    # Live instances and loads as of the last tick: decisions at tool returns route
    # from this snapshot instead of reading Redis on the request path. A ``LoadIndex``
    # once ``set_instances`` ran: a snapshot lives for 5 ticks and takes a load change
    # per placement, finish and move, and routing by scan cost ~0.5 ms per placement at
    # 1,000 instances; the index makes each a lookup (scheduling/policy/load_index.py).
    instances: LoadIndex | list[t.InstanceLoad] = field(default_factory=list)
    instances_at_s: float = -1.0
    last_live: set[str] | frozenset[str] = field(default_factory=set)
    last_orphan_scan_s: float = float("-inf")
    orphan_cursor: int = 0  # where the sweep for orphans goes on (0: none under way)
    # Instances that left the live set, until the sweep after it ended (requeue.py):
    # their assignments are orphans, and they get no placement, even when back.
    departed: set[str] = field(default_factory=set)
    # Lease epoch of each rollout-role instance in the last snapshot: one seen under
    # another epoch is a new incarnation (``set_instances``).
    epochs: dict[str, int] = field(default_factory=dict)
    # The store's copy (``placement_epochs``): the epoch each instance's assignments were
    # made under, read at start. A restarted scheduler has no ``epochs`` of its own, so
    # an instance that restarted (or lapsed) while it was down shows only here.
    saved_epochs: dict[str, int] = field(default_factory=dict)
    epochs_dirty: bool = False  # ``epochs`` or ``departed`` changed since the last save
    # The job's pending queue as Redis holds it, None until read: only this process
    # writes the queue, so after one read it is kept here and not read again (a failed
    # write makes it unknown).
    pending: dict[str, t.Trajectory] | None = None
    # "0": re-read finishes delivered but not acknowledged (a restart); then ">".
    finish_cursor: str = "0"
    # Held-out eval (libra/evaluation.py): the steps rounds run after, and the prompts.
    eval_steps: list[int] = field(default_factory=list)
    eval_rows: list[DatasetRow] = field(default_factory=list)
    # Live instances holding nothing while work waited after the last placement pass.
    idle_while_queued: tuple[str, ...] = ()
    # Held while reports re-read a stale snapshot of leases (one read for all of them).
    refresh_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def set_instances(self, instances: list[t.InstanceLoad], at_s: float,
                      epochs: dict[str, int] | None = None) -> None:
        """A new snapshot of the live instances' loads, taken at ``at_s``; departed
        ones (back before their work was swept) are left out until the sweep ends.
        ``epochs``: the snapshot's lease epochs; an instance seen under a new epoch
        departed too (see ``note_epochs``)."""
        if epochs is not None:
            self.note_epochs(instances, epochs)
        if self.departed:
            instances = [i for i in instances if i.instance_id not in self.departed]
        self.instances_at_s = at_s
        index = self.instances
        if isinstance(index, LoadIndex) and _same_members(index, instances):
            # The same instances (the usual case: a snapshot every 0.25 s, leases that
            # live for seconds): the loads that differ are moved in the index, O(changes),
            # instead of building an index of 1,000 again (a third of a snapshot's cost).
            for inst in instances:
                held = index.get(inst.instance_id)
                if held is not None and held.active_trajectories != inst.active_trajectories:
                    index.add_load(inst.instance_id,
                                   inst.active_trajectories - held.active_trajectories)
            return
        self.instances = LoadIndex(build_layout(self.spec), instances)

    def note_epochs(self, instances: list[t.InstanceLoad], epochs: dict[str, int]) -> None:
        """An instance live in both snapshots under another lease epoch is departed, and
        so is one whose saved epoch (``saved_epochs``) is not its epoch now.

        A new epoch means a new incarnation: restarted under the same id within its
        lease TTL (it never left the live set), or lent to training and back between
        two snapshots (its work handed back). Either way what the old one held is
        dropped: the new process reads only new inbox entries, and the old epoch's
        reports and publishes are fenced off. Made departed, it is left out of this
        snapshot, so the orphan sweep sees it leave the live set and handles it as a
        lapse (requeue.py): a sweep from the start re-queues everything assigned to it,
        once, and it gets no placement until that sweep ended. The saved epochs catch
        what happened while this process was not running (restarted, or gone, while
        the scheduler was down): its own ``epochs`` start empty."""
        now = {inst.instance_id: epochs[inst.instance_id] for inst in instances
               if inst.instance_id in epochs}
        self.departed |= {iid for iid, epoch in now.items()
                          if self.epochs.get(iid, epoch) != epoch}
        self.departed |= {iid for iid, epoch in self.saved_epochs.items()
                          if now.get(iid) != epoch}
        if now != self.epochs:
            self.epochs_dirty = True
        self.epochs = now

    def epochs_seen_first(self, instances: list[t.InstanceLoad],
                          epochs: dict[str, int]) -> dict[str, int]:
        """The epochs of the snapshot's instances that the store's placement epochs lack
        and that ``note_epochs`` will not depart: instances seen for the first time (or
        first since a sweep ended). They are saved before the snapshot is taken in: a
        move decided on the report path may send work to them before the next tick
        saves, and a scheduler restarted then would not know the epoch that work went
        to them under."""
        saved, departed = self.saved_epochs, self.departed
        if not epochs.keys() - saved.keys():  # the usual snapshot: nothing new, O(1) check
            return {}
        return {inst.instance_id: epochs[inst.instance_id] for inst in instances
                if inst.instance_id in epochs and inst.instance_id not in saved
                and inst.instance_id not in departed
                and self.epochs.get(inst.instance_id, epochs[inst.instance_id])
                == epochs[inst.instance_id]}

    def epochs_to_save(self) -> dict[str, int]:
        """What the store's placement epochs should hold now: the epoch of every instance
        in the snapshot that is not departed (placements go to it under that epoch),
        and, for a departed one, the epoch its old work was placed under, kept until a
        sweep ended (a scheduler that dies mid-sweep leaves the next one to finish)."""
        want = {iid: epoch for iid, epoch in self.epochs.items()
                if iid not in self.departed}
        want.update((iid, epoch) for iid, epoch in self.saved_epochs.items()
                    if iid in self.departed)
        return want


def _same_members(index: LoadIndex, instances: list[t.InstanceLoad]) -> bool:
    """Whether ``instances`` are the index's instances (ids, buckets, liveness)."""
    if len(instances) != len(index):
        return False
    for inst in instances:
        held = index.get(inst.instance_id)
        if held is None or held.bucket != inst.bucket or held.is_live != inst.is_live:
            return False
    return True


@dataclass(frozen=True, slots=True)
class JobGauges:
    """One job's placement figures as of the last tick (what /metrics exports)."""

    job_id: str
    queued: int
    """Trajectories waiting for an instance (the pending queue; 0 before it was read)."""
    groups_drawn: int
    """Prompt groups drawn from the dataset (admitted plus rows skipped)."""
    migrations: int
    idle_while_queued: int
    """Live instances holding nothing while work waited after the last placement."""
    bucket_trajectories: dict[str, int]
    """Bucket -> trajectories its live instances hold."""


def gauges_of(run: JobRun) -> JobGauges:
    """The run's figures for /metrics (cheap: no store read)."""
    buckets: dict[str, int] = {}
    for load in run.instances:
        if load.is_live:
            buckets[load.bucket] = buckets.get(load.bucket, 0) + load.active_trajectories
    return JobGauges(run.job_id, len(run.pending or {}), run.next_group, run.migrations,
                     len(run.idle_while_queued), buckets)


def build_policy_config(spec: JobSpec) -> PolicyConfig | None:
    """The policy's config from the spec (``[layout.cmlfq]``); ``None`` for defaults."""
    if spec.layout.policy != "cmlfq":
        return None
    c = spec.layout.cmlfq
    return CmlfqConfig(
        rebuild_interval_steps=c.rebuild_interval_steps,
        recent_window_trajectories=c.recent_window_trajectories,
        p90_window_samples=c.p90_window_samples,
        tree_persist_interval_finishes=c.tree_persist_interval_finishes,
        min_node_visits=c.min_node_visits,
        bucket_thresholds_tokens=tuple(c.bucket_thresholds_tokens) or None,
        live_thresholds=c.live_thresholds,
        entry=c.entry,
        disagree_rule=c.disagree_rule,
        max_queue_length=c.max_queue_length,
        enable_fallback=c.enable_fallback,
    )


def build_layout(spec: JobSpec) -> BucketLayout:
    """The bucket layout of the spec (``[[layout.buckets]]``)."""
    return BucketLayout(list(spec.layout.buckets))


def apply_local_load(run: JobRun, deltas: tuple[tuple[str, int], ...]) -> None:
    """Apply load changes to this process's snapshot of loads (reservations between
    lease snapshots: caps hold without re-reading Redis). Through the index, so that
    routing sees them; an instance the snapshot does not hold is skipped."""
    if isinstance(run.instances, LoadIndex):
        for instance_id, delta in deltas:
            run.instances.add_load(instance_id, delta)
