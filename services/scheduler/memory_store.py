"""``SchedulerStore`` in process memory (pure: no redis): for core unit tests and a
one-process loop.

Same methods and semantics as ``RedisSchedulerStore`` (``store.py``): a tick's writes
and the policy's changes commit together at ``commit_tick``; the policy's state is
written behind (``MemoryPolicyStore``: what was not flushed is lost when the job's
store is opened again, as a restarted scheduler loses it with Redis); finishes are
taken from the job's trajectory stream and released and acknowledged in the same step,
so a cursor of ``0`` (delivered, not acknowledged) finds nothing. Values are copied in
and out, never shared by alias, as they would not be through Redis.

What other services write (a job record, leases, finished trajectories, the rollout's
inbox reads) has methods of its own in the second half: tests and the in-process loop
call them where the coordinator and the rollout would write Redis.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from libra import redis_keys as keys
from libra import types as t
from libra.evaluation import EVAL_ROUNDS_COUNTER, eval_size_counter
from scheduling.policy.store import InMemoryPolicyStore
from services.scheduler.state import (
    FinishRecord,
    LeaseSnapshot,
    TickState,
    TickWrites,
    lease_snapshot,
)
from services.scheduler.store_protocol import FlushablePolicyStore


@dataclass
class _Job:
    """One job's keys (``keys.job``, ``counters``, ``pending``, ``tasks``, ...)."""

    spec_json: str
    state: str
    step: int = 0
    published: bool = False
    counters: collections.Counter[str] = field(default_factory=collections.Counter)
    pending: dict[str, t.Trajectory] = field(default_factory=dict)
    tasks: dict[str, t.Trajectory] = field(default_factory=dict)
    assignments: dict[str, str] = field(default_factory=dict)
    load: collections.Counter[str] = field(default_factory=collections.Counter)
    # The assignments' keys when the running sweep started (``assignments_page``).
    sweep_keys: list[str] = field(default_factory=list)
    # The trajectory stream's unread finishes: (entry id, finish) in append order.
    finishes: collections.deque[tuple[str, FinishRecord]] = field(
        default_factory=collections.deque)
    # Instance -> lease epoch its work was placed under (``keys.placement_epochs``).
    placement_epochs: dict[str, int] = field(default_factory=dict)
    # The policy's flushed state (what ``open_policy_store`` reloads).
    policy_state: dict[str, Any] = field(default_factory=dict)


class MemoryPolicyStore(InMemoryPolicyStore):
    """``FlushablePolicyStore`` in memory: changes reach the job's durable copy on
    ``flush`` (values round-trip through JSON, as with Redis)."""

    def __init__(self, durable: dict[str, Any]) -> None:
        super().__init__(copy_values=True)
        self._durable = durable
        state = copy.deepcopy(durable)
        self._trajectories = state.get("trajectories", {})
        self._records.update(state.get("records", {}))
        self._recent.extend(state.get("recent", []))
        self._tree = state.get("tree")

    async def flush(self, also: Callable[[Any], None] | None = None) -> None:
        """Make every change so far durable. ``also`` (Redis commands for the same
        batch) has no meaning here: the memory store applies a tick's writes itself."""
        if also is not None:
            raise TypeError("MemoryPolicyStore.flush takes no Redis commands")
        self._durable.clear()
        self._durable.update(copy.deepcopy({
            "trajectories": self._trajectories, "records": dict(self._records),
            "recent": list(self._recent), "tree": self._tree}))


class MemorySchedulerStore:
    """``SchedulerStore`` over dicts; one instance stands for one Redis server."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}
        self._leases: dict[str, t.LeaseSummary] = {}
        self._inboxes: dict[str, list[t.Trajectory]] = collections.defaultdict(list)
        self._entry_ids = 0

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:  # Redis answers an absent hash as empty: so does this store
            job = self._jobs[job_id] = _Job(spec_json="", state="")
        return job

    # -- SchedulerStore ----------------------------------------------------------------

    async def job_spec_json(self, job_id: str) -> str | None:
        return self._job(job_id).spec_json or None

    async def job_state(self, job_id: str) -> str | None:
        return self._job(job_id).state or None

    async def job_step(self, job_id: str) -> int:
        return self._job(job_id).step

    async def lease_snapshot(self, job_id: str) -> LeaseSnapshot:
        active = dict(self._job(job_id).load) if job_id else {}
        return lease_snapshot(list(self._leases.values()), active)

    async def lease_epoch(self, worker_id: str) -> int | None:
        lease = self._leases.get(worker_id)
        return None if lease is None else lease.epoch

    async def counters(self, job_id: str) -> dict[str, int]:
        return dict(self._job(job_id).counters)

    async def incr_counters(self, job_id: str, **deltas: int) -> None:
        self._job(job_id).counters.update(deltas)

    async def running_jobs(self) -> list[str]:
        return [job_id for job_id, job in self._jobs.items() if job.state == "running"]

    async def commit_tick(self, job_id: str, writes: TickWrites,
                          policy_store: FlushablePolicyStore) -> None:
        job = self._job(job_id)
        for traj in writes.placed_from_pending:
            job.pending.pop(traj.trajectory_id, None)
        job.pending.update((tr.trajectory_id, copy.deepcopy(tr)) for tr in writes.queued)
        self._place(job_id, job, writes.placed_from_pending + writes.placed)
        if writes.num_groups:
            job.counters["admitted_groups"] += writes.num_groups
            job.counters["admitted"] += sum(not tr.is_eval
                                            for tr in writes.queued + writes.placed)
        if writes.eval_round:
            job.counters[EVAL_ROUNDS_COUNTER] = writes.eval_round
            job.counters[eval_size_counter(writes.eval_round)] = writes.eval_size
        await policy_store.flush()

    def _place(self, job_id: str, job: _Job, trajs: list[t.Trajectory]) -> None:
        for traj in trajs:
            job.tasks[traj.trajectory_id] = copy.deepcopy(traj)
            job.assignments[traj.trajectory_id] = traj.instance_id
            self._inboxes[traj.instance_id].append(copy.deepcopy(traj))
            job.load[traj.instance_id] += 1
            job.counters[keys.placed_counter(traj.bucket)] += 1

    async def pending(self, job_id: str) -> list[t.Trajectory]:
        job = self._job(job_id)
        return [copy.deepcopy(job.pending[k]) for k in sorted(job.pending)]

    async def requeue(self, job_id: str, traj: t.Trajectory) -> bool:
        return bool(await self.requeue_many(job_id, [traj]))

    async def requeue_many(self, job_id: str, trajs: list[t.Trajectory]) -> list[str]:
        job = self._job(job_id)
        back = []
        for traj in trajs:
            instance = job.assignments.pop(traj.trajectory_id, None)
            if instance is None:
                continue  # finished meanwhile: nothing to re-queue
            job.tasks.pop(traj.trajectory_id, None)
            job.load[instance] -= 1
            job.pending[traj.trajectory_id] = copy.deepcopy(traj)
            back.append(traj.trajectory_id)
        if back:
            job.counters["requeued"] += len(back)
        return back

    async def tasks_of(self, job_id: str,
                       trajectory_ids: list[str]) -> list[t.Trajectory | None]:
        return [await self.task(job_id, traj_id) for traj_id in trajectory_ids]

    async def finish(self, job_id: str, trajectory_id: str) -> str | None:
        job = self._job(job_id)
        job.tasks.pop(trajectory_id, None)
        return job.assignments.pop(trajectory_id, None)

    async def release(self, job_id: str, trajectory_id: str) -> str | None:
        job = self._job(job_id)
        instance = job.assignments.pop(trajectory_id, None)
        if instance is None:
            return None
        job.tasks.pop(trajectory_id, None)
        job.load[instance] -= 1
        return instance

    async def ensure_finish_group(self, job_id: str) -> None:
        self._job(job_id)  # the stream and its group exist with the job here

    async def tick_state(self, job_id: str, finish_cursor: str, max_finishes: int,
                         with_leases: bool = False,
                         orphan_page: tuple[int, int] | None = None) -> TickState:
        job = self._job(job_id)
        finishes = []
        while finish_cursor == ">" and job.finishes and len(finishes) < max_finishes:
            _entry_id, finish = job.finishes.popleft()
            released = await self.release(job_id, finish.trajectory_id) \
                if finish.trajectory_id else None
            finishes.append(FinishRecord(finish.entry_id, finish.trajectory_id,
                                         finish.total_tokens, finish.status, released))
        snapshot = await self.lease_snapshot(job_id) if with_leases else None
        page = None if orphan_page is None else await self.assignments_page(job_id,
                                                                            *orphan_page)
        return TickState(job.state or None, job.step, job.published, dict(job.counters),
                         finishes, snapshot, page)

    async def assignments(self, job_id: str) -> dict[str, str]:
        return dict(self._job(job_id).assignments)

    async def assignments_page(self, job_id: str, cursor: int,
                               count: int) -> tuple[int, dict[str, str]]:
        # HSCAN's guarantee: a full sweep returns every entry present from its start to
        # its end (pages over the keys held at the start, those still there); entries
        # added meanwhile may be left out.
        job = self._job(job_id)
        if cursor == 0:
            job.sweep_keys = list(job.assignments)
        keys_now = job.sweep_keys[cursor:cursor + count]
        page = {k: job.assignments[k] for k in keys_now if k in job.assignments}
        return (0 if cursor + count >= len(job.sweep_keys) else cursor + count), page

    async def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None:
        return copy.deepcopy(self._job(job_id).tasks.get(trajectory_id))

    async def forget_instances(self, job_id: str, instance_ids: list[str]) -> None:
        for instance_id in instance_ids:
            self._inboxes.pop(instance_id, None)

    async def clear_load(self, job_id: str) -> None:
        self._job(job_id).load.clear()

    async def placement_epochs(self, job_id: str) -> dict[str, int]:
        return dict(self._job(job_id).placement_epochs)

    async def update_placement_epochs(self, job_id: str, epochs: dict[str, int],
                                      gone: list[str]) -> None:
        saved = self._job(job_id).placement_epochs
        saved.update(epochs)
        for instance_id in gone:
            saved.pop(instance_id, None)

    async def open_policy_store(self, job_id: str) -> MemoryPolicyStore:
        return MemoryPolicyStore(self._job(job_id).policy_state)

    # -- what other services write -------------------------------------------------------

    def put_job(self, job_id: str, spec_json: str, state: str = "running",
                published: bool = True) -> None:
        """The coordinator's job record (and version 0 of the weights, ``published``)."""
        job = self._job(job_id)
        job.spec_json, job.state, job.published = spec_json, state, published

    def set_job_state(self, job_id: str, state: str) -> None:
        self._job(job_id).state = state

    def set_job_step(self, job_id: str, step: int) -> None:
        """The coordinator records a training step."""
        self._job(job_id).step = step

    def grant_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                    epoch: int) -> None:
        """A live lease (the coordinator's grant or role change)."""
        self._leases[worker_id] = t.LeaseSummary(worker_id, role.value, bucket, epoch)

    def expire_lease(self, worker_id: str) -> None:
        self._leases.pop(worker_id, None)

    def put_assignment(self, job_id: str, trajectory_id: str, instance_id: str) -> None:
        """An assignment the scheduler did not write (a rollout's handoff commits one),
        its task kept beside it, as a handoff leaves it."""
        job = self._job(job_id)
        job.assignments[trajectory_id] = instance_id
        job.tasks[trajectory_id] = t.Trajectory(
            trajectory_id=t.TrajectoryId(trajectory_id), job_id=t.JobId(job_id),
            group_id=t.GroupId(f"{job_id}:handed"), prompt_id=t.PromptId("handed"),
            prompt_text="", reference="")
        job.load[instance_id] = job.load.get(instance_id, 0) + 1

    def add_finish(self, job_id: str, trajectory_id: str, total_tokens: int,
                   status: t.TrajectoryStatus = t.TrajectoryStatus.FINISHED) -> str:
        """A finished trajectory on the job's stream (the rollout publishes); its id."""
        self._entry_ids += 1
        entry_id = f"{self._entry_ids}-0"
        self._job(job_id).finishes.append((entry_id, FinishRecord(
            entry_id, trajectory_id, total_tokens, status)))
        return entry_id

    def inbox(self, instance_id: str) -> list[t.Trajectory]:
        """What was placed on an instance and not taken (copies)."""
        return copy.deepcopy(self._inboxes.get(instance_id, []))

    def take_inbox(self, instance_id: str) -> list[t.Trajectory]:
        """Take what was placed on an instance (the rollout reads its inbox)."""
        return self._inboxes.pop(instance_id, [])

    def policy_state(self, job_id: str) -> dict[str, Any]:
        """The job's flushed policy state (trajectories, records, recent, tree)."""
        return copy.deepcopy(self._job(job_id).policy_state)

    def load(self, job_id: str) -> dict[str, int]:
        """The job's load hash: instance -> trajectories assigned."""
        return dict(self._job(job_id).load)
