"""``TrainerStore`` in memory (pure: no redis): for core unit tests and a one-process loop.

Same methods and semantics as ``RedisTrainerStore`` (store.py), checked by the contract
suite in tests/store/test_trainer_store_contract.py against both:

- the trajectory stream has one consumer group; ``read`` hands out new entries (and
  remembers them as pending for the consumer until ``consume`` acks them), or with
  ``pending=True`` every entry delivered to that consumer and not acked yet;
  ``block_ms`` waits for an entry as ``XREADGROUP BLOCK`` does (0: until one comes);
- ``consume`` acks, then - unless its first trajectory id is already consumed (a repeat)
  - remembers the ids and bumps the counters, at once (no await in between);
- the job record, running jobs (oldest first), the policy pointer, capped events and the
  weight versions live rollout instances hold.

The rest of the stack writes here through ``put_job``, ``append``, ``add_counters``,
``set_counters``, ``set_weights_in_use`` and ``set_lease_live`` (what the coordinator,
the scheduler, the rollout store and the rollout workers write to Redis).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from libra import redis_keys as keys
from libra import types as t


class NoConsumerGroup(RuntimeError):
    """A read before ``ensure_group`` (Redis answers NOGROUP)."""


@dataclass
class _Stream:
    entries: list[tuple[str, t.Trajectory]] = field(default_factory=list)
    has_group: bool = False
    delivered: int = 0  # entries handed out by reads of new entries (the group's cursor)
    pending: dict[str, dict[str, t.Trajectory]] = field(default_factory=dict)
    """Consumer -> entry id -> trajectory, delivered and not acked."""


@dataclass
class _Job:
    fields: dict[str, str]
    created_at_ms: int


class MemoryTrainerStore:
    """The trainer's state in dicts; one asyncio loop at a time."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}
        self._streams: dict[str, _Stream] = {}
        self._consumed: dict[str, set[str]] = {}
        self._counters: dict[str, dict[str, int]] = {}
        self._policies: dict[str, t.PolicyInfo] = {}
        self._events: dict[str, deque[dict[str, str]]] = {}
        self._in_use: dict[str, dict[str, str]] = {}
        self._live_leases: set[str] = set()
        self._arrived = asyncio.Condition()

    # -- TrainerStore ---------------------------------------------------------------------

    async def job_field(self, job_id: str, name: str) -> str | None:
        job = self._jobs.get(job_id)
        return (job.fields.get(name) or None) if job is not None else None

    async def job_spec_json(self, job_id: str) -> str | None:
        return await self.job_field(job_id, "spec_json")

    async def job_state(self, job_id: str) -> str | None:
        return await self.job_field(job_id, "state")

    async def job_run_dir(self, job_id: str) -> str:
        run_dir = await self.job_field(job_id, "run_dir")
        if not run_dir:
            raise RuntimeError(f"job {job_id} has no run_dir")
        return run_dir

    async def ensure_group(self, job_id: str) -> None:
        self._stream(job_id).has_group = True

    async def read(self, job_id: str, consumer: str, count: int, block_ms: int,
                   pending: bool = False) -> list[tuple[str, t.Trajectory]]:
        """New entries, or (``pending=True``) the ones delivered before a restart."""
        stream = self._stream(job_id)
        if not stream.has_group:
            raise NoConsumerGroup(f"NOGROUP no trainer group on {keys.trajectories(job_id)}")
        held = stream.pending.setdefault(consumer, {})
        if pending:
            return list(held.items())
        if stream.delivered == len(stream.entries) and block_ms is not None:
            await self._wait_for_entry(stream, block_ms)
        new = stream.entries[stream.delivered:stream.delivered + count]
        stream.delivered += len(new)
        held.update(new)
        return new

    async def already_consumed(self, job_id: str, traj_ids: list[str]) -> list[bool]:
        consumed = self._consumed.get(job_id, set())
        return [traj_id in consumed for traj_id in traj_ids]

    async def consume(self, job_id: str, entry_ids: list[str], traj_ids: list[str],
                      **counters: int) -> None:
        """Ack entries, remember their ids and bump counters, atomically.

        A repeat changes nothing when ``traj_ids`` is non-empty and its first id was
        consumed (as the Redis script: the repeat of a call whose reply was lost)."""
        for held in self._stream(job_id).pending.values():
            for entry_id in entry_ids:
                held.pop(entry_id, None)
        consumed = self._consumed.setdefault(job_id, set())
        if traj_ids and traj_ids[0] in consumed:
            return
        consumed.update(traj_ids)
        self._add(job_id, {name: delta for name, delta in counters.items() if delta})

    async def publish_policy(self, job_id: str, info: t.PolicyInfo) -> None:
        self._policies[job_id] = info

    async def counters(self, job_id: str) -> dict[str, int]:
        """The job's cumulative counters (scheduler placements and migrations included)."""
        return dict(self._counters.get(job_id, {}))

    async def running_jobs(self) -> list[str]:
        """Jobs in state ``running``, oldest first."""
        jobs = sorted(self._jobs.items(), key=lambda item: (item[1].created_at_ms, item[0]))
        return [job_id for job_id, job in jobs if job.fields.get("state") == "running"]

    async def policy_version(self, job_id: str) -> int:
        """The version the policy pointer announces (-1 when none was published)."""
        info = self._policies.get(job_id)
        return info.version if info is not None else -1

    async def record_event(self, job_id: str, kind: str, **fields: str) -> None:
        events = self._events.setdefault(job_id, deque(maxlen=keys.EVENTS_MAXLEN))
        events.append({"kind": kind, **fields})

    async def weights_in_use(self, job_id: str) -> set[int]:
        """Versions live rollout instances hold or fetch (an instance counts while its
        lease is live, see ``set_lease_live``)."""
        versions: set[int] = set()
        for instance, held in self._in_use.get(job_id, {}).items():
            if instance in self._live_leases:
                versions.update(int(v) for v in held.split())
        versions.discard(-1)
        return versions

    # -- what the rest of the stack writes (Redis: coordinator, rollout) ---------------------

    def put_job(self, job_id: str, spec_json: str, run_dir: str, state: str = "running",
                created_at_ms: int = 0) -> None:
        """The job record as the coordinator keeps it (fields of ``keys.job``)."""
        self._jobs[job_id] = _Job({"spec_json": spec_json, "run_dir": run_dir,
                                   "state": state}, created_at_ms)

    def set_job_state(self, job_id: str, state: str) -> None:
        self._jobs[job_id].fields["state"] = state

    async def append(self, job_id: str, traj: t.Trajectory) -> str:
        """Append a trajectory to the job's stream (as the rollout store publishes);
        wakes blocked reads. Returns the entry id."""
        stream = self._stream(job_id)
        entry_id = f"{len(stream.entries) + 1}-0"
        stream.entries.append((entry_id, traj))
        async with self._arrived:
            self._arrived.notify_all()
        return entry_id

    def add_counters(self, job_id: str, **deltas: int) -> None:
        """Bump counters as other services do (``produced``, ``placed:<bucket>``, ...)."""
        self._add(job_id, deltas)

    def set_counters(self, job_id: str, **values: int) -> None:
        """Set counters outright (the scheduler's ``eval_rounds`` and round sizes)."""
        self._counters.setdefault(job_id, {}).update(values)

    def set_weights_in_use(self, job_id: str, instance: str, loaded: int,
                           loading: int = -1) -> None:
        self._in_use.setdefault(job_id, {})[instance] = f"{loaded} {loading}"

    def set_lease_live(self, instance: str, live: bool = True) -> None:
        (self._live_leases.add if live else self._live_leases.discard)(instance)

    def events(self, job_id: str) -> list[dict[str, str]]:
        return list(self._events.get(job_id, ()))

    def policy(self, job_id: str) -> t.PolicyInfo | None:
        return self._policies.get(job_id)

    def num_pending(self, job_id: str) -> int:
        """Entries delivered to a consumer and not acked (``XPENDING``)."""
        return sum(len(held) for held in self._stream(job_id).pending.values())

    def num_undelivered(self, job_id: str) -> int:
        """Entries never delivered to the trainer group (``XINFO GROUPS`` lag)."""
        stream = self._stream(job_id)
        return len(stream.entries) - stream.delivered

    # -- internals ------------------------------------------------------------------------

    def _stream(self, job_id: str) -> _Stream:
        return self._streams.setdefault(job_id, _Stream())

    def _add(self, job_id: str, deltas: dict[str, int]) -> None:
        counters = self._counters.setdefault(job_id, {})
        for name, delta in deltas.items():
            counters[name] = counters.get(name, 0) + delta

    async def _wait_for_entry(self, stream: _Stream, block_ms: int) -> None:
        """Until an entry arrives or ``block_ms`` passed (0: no limit, as Redis)."""
        async with self._arrived:
            waiting = self._arrived.wait_for(lambda: stream.delivered < len(stream.entries))
            try:
                async with asyncio.timeout(block_ms / 1000 if block_ms else None):
                    await waiting
            except TimeoutError:
                pass
