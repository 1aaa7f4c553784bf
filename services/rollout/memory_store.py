"""Rollout state in memory: the same interface and semantics as the Redis store.

:class:`MemoryRolloutStore` implements ``RolloutStore`` (``services/rollout/store.py``)
without Redis, for the core's unit tests and a one-process debugging loop. It keeps what
the Redis keys hold for the rollout side (inboxes with their consumer group, job records,
policy pointers, lease epochs, tasks, assignments, load, counters, the trajectory stream,
events, weights in use) and applies each store call whole, as the Lua scripts and
transactions do: publishing and handing off are fenced on the lease epoch exactly as
there (a missing lease refuses), a publish is idempotent per trajectory id, and a handoff
happens only while the trajectory is still assigned here. Trajectories are stored encoded
by the wire codec, so a reader gets its own copy, as from Redis.

The methods after the ``RolloutStore`` ones seed and read that state, as the scheduler,
coordinator and trainer do through Redis. Pure: no redis import; one event loop.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from libra import redis_keys as keys
from libra import types as t
from libra.wire.common import decode_trajectory, encode_trajectory
from services.rollout.store_protocol import InboxEntry, produced_counter


@dataclass
class _Inbox:
    """One instance's inbox stream and whether its consumer group exists."""

    has_group: bool = False
    entries: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # id -> (job, task)
    delivered: set[str] = field(default_factory=set)  # read, not yet acked (pending)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class PublishedEntry:
    """An entry of a job's trajectory stream (the fields the scheduler reads too)."""

    trajectory: t.Trajectory
    total_tokens: int
    status: str
    instance_id: str


class MemoryRolloutStore:
    """``RolloutStore`` over plain dicts (see the module docstring)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._inboxes: dict[str, _Inbox] = defaultdict(_Inbox)
        self._jobs: dict[str, dict[str, str]] = defaultdict(dict)
        self._policies: dict[str, t.PolicyInfo] = {}
        self._lease_epochs: dict[str, int] = {}
        self._tasks: dict[str, dict[str, bytes]] = defaultdict(dict)
        self._assignments: dict[str, dict[str, str]] = defaultdict(dict)
        self._load: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._counters: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._published_ids: dict[str, set[str]] = defaultdict(set)
        self._trajectories: dict[str, list[tuple[str, bytes, PublishedEntry]]] = (
            defaultdict(list))
        self._events: dict[str, list[dict[str, str]]] = defaultdict(list)
        self._weights_in_use: dict[str, dict[str, str]] = defaultdict(dict)

    # -- RolloutStore ---------------------------------------------------------------------

    async def ensure_inbox(self, instance_id: str) -> None:
        self._inboxes[instance_id].has_group = True

    async def read_inbox(self, instance_id: str, count: int,
                         block_ms: int) -> list[InboxEntry]:
        inbox = self._inboxes[instance_id]
        if not inbox.has_group:  # NOGROUP: the scheduler deleted the inbox; recreate
            inbox.has_group = True
            return []
        new = self._undelivered(inbox, count)
        if not new and block_ms > 0:
            inbox.arrived.clear()
            try:
                async with asyncio.timeout(block_ms / 1000.0):
                    await inbox.arrived.wait()
            except TimeoutError:
                return []
            new = self._undelivered(inbox, count)
        inbox.delivered.update(new)
        return [InboxEntry(entry_id, inbox.entries[entry_id][0],
                           decode_trajectory(inbox.entries[entry_id][1])) for entry_id in new]

    async def job_spec_json(self, job_id: str) -> str | None:
        return self._jobs.get(job_id, {}).get("spec_json")

    async def job_state(self, job_id: str) -> str | None:
        return self._jobs.get(job_id, {}).get("state")

    async def policy(self, job_id: str) -> t.PolicyInfo | None:
        return self._policies.get(job_id)

    async def publish(self, traj: t.Trajectory, instance_id: str, entry_id: str,
                      lease_epoch: int) -> bool:
        """Fenced on the lease epoch, idempotent per trajectory id (see the Redis store)."""
        if self._lease_epochs.get(instance_id) != lease_epoch:
            return False
        job_id = traj.job_id
        is_new = traj.trajectory_id not in self._published_ids[job_id]
        self._published_ids[job_id].add(traj.trajectory_id)
        if is_new:
            entry = PublishedEntry(traj, traj.num_generated_tokens, traj.status.value,
                                   instance_id)
            self._trajectories[job_id].append(
                (self._next_id(), encode_trajectory(traj), entry))
        self._remove(instance_id, entry_id)
        if not is_new:
            self._counters[job_id]["duplicate_publishes"] += 1
            return True
        self._counters[job_id][produced_counter(traj)] += 1
        return True

    async def handoff(self, traj: t.Trajectory, instance_id: str, entry_id: str,
                      target_instance: str, target_bucket: str, lease_epoch: int) -> bool:
        """Fenced on the lease epoch and on the assignment (see the Redis store)."""
        job_id, traj_id = traj.job_id, traj.trajectory_id
        if self._lease_epochs.get(instance_id) != lease_epoch:
            return False
        if self._assignments[job_id].get(traj_id) != instance_id:
            return False
        data = encode_trajectory(traj)
        self._tasks[job_id][traj_id] = data
        self._add_to_inbox(target_instance, job_id, data)
        self._remove(instance_id, entry_id)
        self._assignments[job_id][traj_id] = target_instance
        self._load[job_id][instance_id] -= 1
        self._load[job_id][target_instance] += 1
        self._counters[job_id]["migrations"] += 1
        self._counters[job_id][keys.placed_counter(target_bucket)] += 1
        return True

    async def ack(self, instance_id: str, entry_id: str) -> None:
        self._remove(instance_id, entry_id)

    async def hand_back(self, traj: t.Trajectory, instance_id: str, entry_id: str) -> None:
        self._tasks[traj.job_id][traj.trajectory_id] = encode_trajectory(traj)
        self._remove(instance_id, entry_id)

    async def clear_inbox(self, instance_id: str) -> None:
        inbox = self._inboxes[instance_id]
        inbox.entries.clear()
        inbox.delivered.clear()

    async def count(self, job_id: str, name: str) -> None:
        self._counters[job_id][name] += 1

    async def record_event(self, job_id: str, kind: str, **fields: str) -> None:
        events = self._events[job_id]
        events.append({"kind": kind, **fields})
        del events[:-keys.EVENTS_MAXLEN]

    async def report_weights(self, job_id: str, instance_id: str, loaded: int,
                             loading: int) -> None:
        self._weights_in_use[job_id][instance_id] = f"{loaded} {loading}"

    async def leave_weights(self, job_id: str, instance_id: str) -> None:
        self._weights_in_use[job_id].pop(instance_id, None)

    # -- what other services write and read ----------------------------------------------

    def put_job(self, job_id: str, spec_json: str, state: str = "running") -> None:
        self._jobs[job_id].update(spec_json=spec_json, state=state)

    def set_job_state(self, job_id: str, state: str) -> None:
        self._jobs[job_id]["state"] = state

    def set_policy(self, job_id: str, policy: t.PolicyInfo) -> None:
        self._policies[job_id] = policy

    def set_lease(self, worker_id: str, lease: t.Lease | None) -> None:
        """Mirror the coordinator's lease record (None: the lease is gone)."""
        if lease is None:
            self._lease_epochs.pop(worker_id, None)
        else:
            self._lease_epochs[worker_id] = lease.epoch

    def set_lease_epoch(self, worker_id: str, epoch: int) -> None:
        """The lease granted anew at ``epoch`` (a fence test's zombie instance)."""
        self._lease_epochs[worker_id] = epoch

    def place(self, traj: t.Trajectory, instance_id: str, assign: bool = True) -> None:
        """As the scheduler places: inbox entry, task, and (``assign``) the assignment
        and load a handoff checks and moves."""
        data = encode_trajectory(traj)
        self._add_to_inbox(instance_id, traj.job_id, data)
        self._tasks[traj.job_id][traj.trajectory_id] = data
        if assign:
            self._assignments[traj.job_id][traj.trajectory_id] = instance_id
            self._load[traj.job_id][instance_id] += 1

    def drop_inbox(self, instance_id: str) -> None:
        """The scheduler deleted this inbox (its stream and consumer group)."""
        self._inboxes.pop(instance_id, None)

    def inbox_size(self, instance_id: str) -> int:
        return len(self._inboxes[instance_id].entries)

    def inbox_pending(self, instance_id: str) -> int:
        return len(self._inboxes[instance_id].delivered)

    def inbox_tasks(self, instance_id: str) -> list[tuple[str, t.Trajectory]]:
        return [(job_id, decode_trajectory(data))
                for job_id, data in self._inboxes[instance_id].entries.values()]

    def published(self, job_id: str) -> list[PublishedEntry]:
        return [PublishedEntry(decode_trajectory(data), e.total_tokens, e.status,
                               e.instance_id) for _, data, e in self._trajectories[job_id]]

    def counters(self, job_id: str) -> dict[str, int]:
        return {k: v for k, v in self._counters[job_id].items() if v}

    def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None:
        data = self._tasks[job_id].get(trajectory_id)
        return decode_trajectory(data) if data is not None else None

    def assignment(self, job_id: str, trajectory_id: str) -> str | None:
        return self._assignments[job_id].get(trajectory_id)

    def load(self, job_id: str) -> dict[str, int]:
        return dict(self._load[job_id])

    def events(self, job_id: str, kind: str) -> list[dict[str, str]]:
        return [e for e in self._events[job_id] if e["kind"] == kind]

    def weights_in_use(self, job_id: str) -> dict[str, str]:
        return dict(self._weights_in_use[job_id])

    # -- internals ------------------------------------------------------------------------

    def _next_id(self) -> str:
        return f"0-{next(self._ids)}"

    def _add_to_inbox(self, instance_id: str, job_id: str, data: bytes) -> None:
        inbox = self._inboxes[instance_id]
        inbox.entries[self._next_id()] = (job_id, data)
        inbox.arrived.set()

    def _undelivered(self, inbox: _Inbox, count: int) -> list[str]:
        return [i for i in inbox.entries if i not in inbox.delivered][:count]

    def _remove(self, instance_id: str, entry_id: str) -> None:
        inbox = self._inboxes[instance_id]
        inbox.entries.pop(entry_id, None)
        inbox.delivered.discard(entry_id)
