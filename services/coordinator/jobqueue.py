"""The job queue: which job runs next (pure; no grpc/redis).

One job trains at a time (the core training group trains one policy). A job submitted
or resumed while another is active waits PENDING in the queue, which the store keeps
(Redis: it survives a coordinator restart), ordered by priority (higher first) and then
by submit order. *Active* means not terminal and not queued: RUNNING, or PENDING while
its start is under way.

The head starts when nothing is active: after the active job ends by any path (the
trainer's job-done report, a cancel, reconciliation failing it) and on every
reconciliation pass, which covers a coordinator restart. A head whose start is refused
(trainer or scheduler error) is FAILED with the reason (a ``job_start_failed`` event)
and the next one is tried, so a job never sits queued while nothing runs. The caller
holds the core's lifecycle lock around every method here.

Crash safety: a head is taken off the queue before its start; a coordinator that dies
in between leaves it PENDING and unqueued, which reconciliation fails as "interrupted
while starting" (the same as a create interrupted today).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from libra import types as t
from libra.clock import Clock
from libra.errors import FailedPrecondition, InvalidArgument, LibraError, ResourceExhausted
from services.coordinator.store_protocol import MAX_PRIORITY, MIN_PRIORITY

if TYPE_CHECKING:
    from services.coordinator.store_protocol import CoordinatorStore

logger = logging.getLogger(__name__)

DEFAULT_MAX_QUEUED_JOBS = 100

# Starts a job on the trainer and the scheduler (PENDING -> RUNNING); raises with both
# stopped again when either refuses.
Launch = Callable[[t.Job], Awaitable[None]]
# The newest checkpoint's step under a run folder, None when none (blocking file reads).
NewestCheckpoint = Callable[[str], "int | None"]
# Ends a job (state, message) without starting the next one.
Finish = Callable[[t.Job, t.JobState, str], Awaitable[t.Job]]


def check_priority(priority: int) -> int:
    """The priority, or InvalidArgument naming the field."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
            MIN_PRIORITY <= priority <= MAX_PRIORITY):
        raise InvalidArgument("priority", f"must be an integer in [{MIN_PRIORITY}, "
                              f"{MAX_PRIORITY}], got {priority!r}")
    return priority


class JobQueue:
    """Queue operations over the store; every method runs under the lifecycle lock."""

    def __init__(self, store: CoordinatorStore, launch: Launch, finish: Finish,
                 clock: Clock, lock: asyncio.Lock,
                 max_queued_jobs: int = DEFAULT_MAX_QUEUED_JOBS) -> None:
        if max_queued_jobs < 0:
            raise ValueError(f"max_queued_jobs must be >= 0, got {max_queued_jobs}")
        self._store = store
        self._launch = launch
        self._finish = finish
        self._clock = clock
        self._lock = lock
        self.max_queued_jobs = max_queued_jobs
        # Starts of the next job, run once the lock holder that ended a job let go: never
        # inside the trainer's job-done report, which the trainer's job task awaits.
        self._kicks: set[asyncio.Task[t.Job | None]] = set()
        # Jobs queued as of the last read of the queue (every operation here reads it;
        # the reconciler's pass at least once per interval): /metrics reads this, never
        # the store.
        self.num_queued = 0

    async def _queued_ids(self) -> list[str]:
        ids = await self._store.queued_job_ids()
        self.num_queued = len(ids)
        return ids

    async def start_next_locked(self) -> t.Job | None:
        """:meth:`start_next` under the lifecycle lock."""
        async with self._lock:
            return await self.start_next()

    def kick(self) -> None:
        """Start the next job in the background once the lock is free."""
        task = asyncio.create_task(self.start_next_locked())
        self._kicks.add(task)
        task.add_done_callback(self._kick_done)

    def _kick_done(self, task: asyncio.Task[t.Job | None]) -> None:
        self._kicks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # e.g. Redis away: the reconciler's next pass starts the head instead.
            logger.error("[queue] starting the next job failed", exc_info=task.exception())

    async def settle(self) -> None:
        """Wait for the background starts (tests)."""
        while self._kicks:
            await asyncio.gather(*self._kicks, return_exceptions=True)

    async def active_job(self) -> t.Job | None:
        """The job that holds the trainer (RUNNING, or PENDING and not queued)."""
        queued = set(await self._queued_ids())
        for job in await self._store.list_jobs():
            if not job.state.is_terminal and job.job_id not in queued:
                return job
        return None

    async def must_wait(self) -> bool:
        """True when a job submitted now has to queue (something active or queued)."""
        return bool(await self._queued_ids()) or await self.active_job() is not None

    async def add(self, job: t.Job) -> t.Job:
        """Store ``job`` PENDING at its place in the queue (refused when full)."""
        queued = await self._queued_ids()
        if len(queued) >= self.max_queued_jobs:
            raise ResourceExhausted(
                f"the job queue is full ({len(queued)} jobs; coordinator max_queued_jobs = "
                f"{self.max_queued_jobs}): wait for queued jobs to start, cancel some "
                "(libra jobs; libra cancel JOB), or raise max_queued_jobs")
        job.state = t.JobState.PENDING
        job.updated_at_ms = self._clock.now_ms()
        await self._store.enqueue_job(job)
        job.queue_position = await self.position(job.job_id)
        logger.info("[queue] queued job_id=%s priority=%d position=%d", job.job_id,
                    job.priority, job.queue_position)
        return job

    async def position(self, job_id: str) -> int:
        return (await self.positions()).get(job_id, 0)

    async def positions(self) -> dict[str, int]:
        """job_id -> 1-based place in the queue (queued jobs only)."""
        return {job_id: i for i, job_id in enumerate(await self._queued_ids(), 1)}

    async def remove(self, job_id: str) -> bool:
        removed = await self._store.dequeue_job(job_id)
        self.num_queued = max(0, self.num_queued - int(removed))
        return removed

    async def start_next(self) -> t.Job | None:
        """Start the queue's head if nothing is active; a refused head fails and the
        next is tried. Returns the job started (None: busy, or nothing startable)."""
        if await self.active_job() is not None:
            return None
        for job_id in await self._queued_ids():
            if not await self._store.dequeue_job(job_id):
                continue  # taken meanwhile (cannot happen under the lock; cheap to check)
            self.num_queued = max(0, self.num_queued - 1)
            job = await self._store.get_job(job_id)
            if job.state is not t.JobState.PENDING:
                continue
            try:
                await self._launch(job)
            except LibraError as exc:
                await self._refused(job, exc)
                continue
            logger.info("[queue] started job_id=%s", job.job_id)
            return job
        return None

    async def resume(self, job_id: str, priority: int, newest: NewestCheckpoint) -> t.Job:
        """Queue a CANCELLED or FAILED job again, to continue from its newest checkpoint,
        and start it when nothing else is active. Checked before anything changes:
        NotFound (the store), FailedPrecondition (wrong state; no checkpoint). Returns the
        job as it is now: PENDING (queued), RUNNING, or FAILED (its start was refused)."""
        job = await self._store.get_job(job_id)
        if job.state not in (t.JobState.CANCELLED, t.JobState.FAILED):
            raise FailedPrecondition(f"job {job_id} is {job.state.value}; only a cancelled "
                                     "or failed job can be resumed")
        step = await asyncio.to_thread(newest, job.run_dir)
        if step is None:
            raise FailedPrecondition(
                f"job {job_id} has no checkpoint under {job.run_dir}/checkpoints, so it "
                "cannot be resumed (algorithm.checkpoint_interval writes them); submit it "
                "again instead")
        await self._store.record_event(job_id, {
            "kind": "job_resumed", "ts_ms": self._clock.now_ms(), "checkpoint_step": step,
            "previous_state": job.state.value, "previous_message": job.message})
        # num_resumes > 0 starts the trainer and the scheduler with their resume flag.
        job.num_resumes += 1
        job.priority = priority
        job.message = f"resumed from the checkpoint of step {step}"
        must_wait = await self.must_wait()
        job = await self.add(job)
        if not must_wait:
            await self.start_next()  # it is the head: starts now, or fails with the reason
        job = await self._store.get_job(job_id)
        job.queue_position = await self.position(job_id)
        return job

    async def _refused(self, job: t.Job, exc: LibraError) -> None:
        reason = f"could not start from the queue: {type(exc).__name__}: {exc}"
        logger.warning("[queue] start refused job_id=%s error=%s", job.job_id, exc)
        await self._store.record_event(job.job_id, {
            "kind": "job_start_failed", "ts_ms": self._clock.now_ms(), "reason": reason})
        await self._finish(job, t.JobState.FAILED, reason)
