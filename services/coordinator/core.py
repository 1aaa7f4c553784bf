"""Coordinator core: the job lifecycle and the worker registry (pure; no grpc/redis).

The core composes narrow collaborators: ``spec_checks.SpecChecks`` (everything a spec
must pass before it is stored), ``jobqueue.JobQueue``, ``reconcile.Reconciler``,
``elastic_jobs.ElasticJobs`` (each job's elastic loop) and
``worker_registry.WorkerRegistry`` (leases and role changes).

A job is validated completely before anything is stored, so an invalid spec leaves
nothing behind (``spec_checks.py``): the schema, then the model (an injected
:class:`ModelCheck`: can this machine load and train ``model.path``?) and the dataset
(an injected :class:`DatasetCheck`: does ``task.path`` read, with the mapped fields?),
and the rest there. When nothing
runs, a valid job is stored PENDING, then the trainer and the scheduler are told to
start it; if either refuses, whatever started is stopped, the job is deleted and the
caller gets the error. While another job is active it waits PENDING in the job queue
(``jobqueue.py``), which starts the next job whenever the active one ends.

A CANCELLED or FAILED job with a checkpoint can be resumed under its id
(:meth:`CoordinatorCore.resume_job`): queued like a new job, then started with the
trainer's and the scheduler's ``resume`` flag (newest checkpoint, counters continued).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from libra import types as t
from libra.clock import Clock
from libra.errors import FailedPrecondition, InvalidArgument, LibraError
from libra.ids import new_job_id
from libra.limits import check_step_record
from libra.wire.step_record import step_record_to_dict
from services.coordinator.checkpoints import CheckpointProbe, newest_checkpoint_step
from services.coordinator.elastic import ElasticLoop, ElasticWiring
from services.coordinator.elastic_jobs import ElasticJobs
from services.coordinator.job_pages import check_page_request, page_of, summary_of
from services.coordinator.jobqueue import DEFAULT_MAX_QUEUED_JOBS, JobQueue, check_priority
from services.coordinator.reconcile import Reconciler, ReconcileWiring, Verdict
from services.coordinator.spec_checks import (
    CorpusCheck,
    DatasetCheck,
    InitFromCheck,
    ModelCheck,
    SpecChecks,
    ToolCatalog,
)
from services.coordinator.store_protocol import CoordinatorStore, StepAppend
from services.coordinator.worker_registry import (
    MAX_ADDRESS_CHARS,
    MAX_LEASE_TTL_MS,
    MIN_LEASE_TTL_MS,
    ROLE_MOVES,
    WorkerRegistry,
)

# Re-exported: the service, its tests and the docs name them here.
__all__ = ["MAX_ADDRESS_CHARS", "MAX_LEASE_TTL_MS", "MIN_LEASE_TTL_MS", "ROLE_MOVES",
           "CoordinatorCore", "CorpusCheck", "DatasetCheck", "InitFromCheck", "JobRunner",
           "ModelCheck", "ToolCatalog"]

logger = logging.getLogger(__name__)

class JobRunner(Protocol):
    """What the coordinator needs from the trainer and the scheduler."""

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        """Start a job; ``resume``: it ran before (newest checkpoint, counters continued)."""
        ...

    async def stop_job(self, job_id: str) -> None:
        """Stop the job's work on this service (the job was cancelled, failed or ended)."""
        ...


class CoordinatorCore:
    """Public job API and worker registry.

    ``model_check`` / ``dataset_check`` None skip that check: unit tests that exercise
    the lifecycle build the core that way; ``__main__`` always passes both.
    ``reconcile`` None turns reconciliation off (``reconcile.py``; ``__main__`` wires it).
    ``max_queued_jobs`` bounds the job queue; ``checkpoint_probe`` finds a resumed job's
    checkpoint.
    """

    def __init__(self, store: CoordinatorStore, trainer: JobRunner, scheduler: JobRunner,
                 clock: Clock, run_root: Path, elastic: ElasticWiring | None = None,
                 *, model_check: ModelCheck | None = None,
                 tool_catalog: ToolCatalog | None = None,
                 dataset_check: DatasetCheck | None = None,
                 reconcile: ReconcileWiring | None = None,
                 max_queued_jobs: int = DEFAULT_MAX_QUEUED_JOBS,
                 checkpoint_probe: CheckpointProbe = newest_checkpoint_step,
                 init_from_check: InitFromCheck | None = None,
                 corpus_check: CorpusCheck | None = None,
                 lease_renewals_per_s: float = 0.0) -> None:
        self._store = store
        self._trainer = trainer
        self._scheduler = scheduler
        self._clock = clock
        self._run_root = run_root
        self._checks = SpecChecks(run_root, model_check=model_check,
                                  dataset_check=dataset_check,
                                  init_from_check=init_from_check, corpus_check=corpus_check,
                                  tool_catalog=tool_catalog)
        self._elastic_jobs = ElasticJobs(elastic, store, clock)
        self._workers = WorkerRegistry(store, clock, lease_renewals_per_s)
        # Serialises job lifecycle changes (a whole create, a cancel, a reconciliation of
        # one job): without it concurrent creates all see "no job" across the store's
        # awaits and all start, a cancel could end a job half created, and a
        # reconciliation could take a job being created for an orphan (one coordinator).
        self._lifecycle_lock = asyncio.Lock()
        self._queue = JobQueue(store, self._launch, self._finish, clock,
                               self._lifecycle_lock, max_queued_jobs)
        self._checkpoint_probe = checkpoint_probe
        self._reconciler = (None if reconcile is None else Reconciler(
            store, reconcile, scheduler, self._end_job, self._lifecycle_lock, clock,
            after_pass=self.start_next_job))

    # -- jobs ---------------------------------------------------------------------------

    async def create_job(self, spec_text: str, spec_format: str, priority: int = 0) -> t.Job:
        """Validate, store and start a job - or queue it while another is active (a full
        queue refuses it: ResourceExhausted). Atomic from the caller's point of view."""
        check_priority(priority)
        spec = await self._checks.checked_spec(spec_text, spec_format)
        async with self._lifecycle_lock:
            now_ms = self._clock.now_ms()
            job_id = new_job_id(spec.name)
            job = t.Job(job_id=job_id, name=spec.name, state=t.JobState.PENDING,
                        spec_json=spec.to_json(), created_at_ms=now_ms, updated_at_ms=now_ms,
                        run_dir=str(self._run_root / job_id), priority=priority)
            if await self._queue.must_wait():
                job = await self._queue.add(job)
                self._kick()  # the queue may be waiting on nothing (a restart)
            else:
                await self._store.put_job(job)
                await self._start(job)
        logger.info("[job] created job_id=%s name=%s state=%s", job_id, spec.name,
                    job.state.value)
        return job

    async def _start(self, job: t.Job) -> None:
        """Start a new job; a refusal deletes it (it never existed for the caller)."""
        try:
            await self._launch(job)
        except BaseException:
            # Not only LibraError: a cancelled request or an unexpected error must not
            # leave a PENDING job behind, which would refuse every later job.
            await self._store.delete_job(job.job_id)
            raise

    async def _launch(self, job: t.Job) -> None:
        """PENDING -> RUNNING once the trainer and the scheduler took the job; on a
        refusal both are stopped again and the error is raised."""
        resume = job.num_resumes > 0
        self._elastic_jobs.forget(job.job_id)  # a resumed job plans from scratch
        try:
            await self._trainer.start_job(job.job_id, resume=resume)
            await self._scheduler.start_job(job.job_id, resume=resume)
        except BaseException:
            await self._stop_runners(job.job_id)
            raise
        job.state = t.JobState.RUNNING
        job.queue_position = 0
        job.updated_at_ms = self._clock.now_ms()
        await self._store.put_job(job)

    async def _stop_runners(self, job_id: str) -> None:
        for runner in (self._scheduler, self._trainer):
            try:
                await runner.stop_job(job_id)
            except LibraError as exc:
                logger.warning("[job] stop failed job_id=%s error=%s", job_id, exc)

    async def get_job(self, job_id: str) -> tuple[t.Job, list[dict[str, Any]], dict[str, int]]:
        """The job, its step records, and its counters with the measured backlog
        (``in_flight_*``, see ``CoordinatorStore.accounting``: one snapshot)."""
        # Independent reads, sent together: GetJob and the live view (/ui) poll this, and
        # on a busy machine each round trip waits for a CPU.
        job, position, counters, steps = await asyncio.gather(
            self._store.get_job(job_id), self._queue.position(job_id),
            self._store.accounting(job_id), self._store.steps(job_id))
        job.queue_position = position
        return job, steps, counters

    async def list_jobs(self) -> list[t.Job]:
        """Every job, with its place in the queue (``queue_position``, 0 = not queued)."""
        jobs, positions = await self._store.list_jobs(), await self._queue.positions()
        for job in jobs:
            job.queue_position = positions.get(job.job_id, 0)
        return jobs

    async def list_jobs_page(self, page_size: int = 0,
                             page_token: str = "") -> tuple[list[t.Job], str]:
        """ListJobs: one page of job summaries (no spec) and the next page's token
        (services/coordinator/job_pages.py). InvalidArgument names ``page_size`` or
        ``page_token`` before anything is read."""
        check_page_request(page_size, page_token)
        jobs, positions = await self._store.list_job_summaries(), await self._queue.positions()
        for job in jobs:
            job.queue_position = positions.get(job.job_id, 0)
        return page_of([summary_of(job) for job in jobs], page_size, page_token)

    async def cancel_job(self, job_id: str, reason: str = "") -> t.Job:
        """End a job CANCELLED; a queued one leaves the queue without the trainer or the
        scheduler being called."""
        async with self._lifecycle_lock:  # after a create of it, never in the middle
            job = await self._store.get_job(job_id)
            if job.state.is_terminal:
                return job
            if not await self._queue.remove(job_id):
                await self._stop_runners(job_id)
            job = await self._finish(job, t.JobState.CANCELLED, reason or "cancelled by user")
            self._kick()
            return job

    async def resume_job(self, job_id: str, priority: int = 0) -> t.Job:
        """Restart a CANCELLED or FAILED job from its newest checkpoint, under its id.

        Checked before anything changes: NotFound (unknown id), FailedPrecondition (not
        cancelled or failed; no checkpoint). Then it is queued like a new job, or started
        at once when nothing is active (a refused start leaves it FAILED and raises).
        """
        check_priority(priority)
        async with self._lifecycle_lock:
            job = await self._queue.resume(job_id, priority, self._checkpoint_probe)
        if job.state is t.JobState.FAILED:
            raise FailedPrecondition(f"job {job_id} could not be resumed: {job.message}")
        logger.info("[job] resumed job_id=%s state=%s", job_id, job.state.value)
        return job

    async def start_next_job(self) -> t.Job | None:
        """Start the queue's head if nothing is active (see jobqueue.py)."""
        return await self._queue.start_next_locked()

    def _kick(self) -> None:
        self._queue.kick()

    async def settle(self) -> None:
        """Wait for the background starts of queued jobs (tests)."""
        await self._queue.settle()

    # -- reconciliation ---------------------------------------------------------------

    async def reconcile(self) -> dict[str, Verdict]:
        """One reconciliation pass (see reconcile.py); {} when it is not wired."""
        return {} if self._reconciler is None else await self._reconciler.reconcile_once()

    async def run_reconciler(self) -> None:
        """Reconcile at start-up and then periodically, until cancelled."""
        if self._reconciler is not None:
            await self._reconciler.run()

    async def report_step(self, job_id: str, record: t.StepRecord,
                          idempotency_key: str = "") -> StepAppend:
        """Store a step record once (reports are keyed by job + step, see StepAppend).

        A repeat (the trainer retrying after a lost reply) writes no second record but
        still sets the job's step and version: the try that stored the record may have
        died before doing so. Only a new record feeds the elastic planner.
        """
        stored = step_record_to_dict(record)  # the store keeps the wire's JSON shape
        step = check_step_record(stored)  # a typed record built in process is checked too
        # Under the lifecycle lock: a cancel landing between the read and the write would
        # otherwise be overwritten (the job written back RUNNING). A cancel waiting here
        # stops the trainer, whose cancelled call ends this one.
        async with self._lifecycle_lock:
            job = await self._store.get_job(job_id)
            if job.state.is_terminal:  # a late or forged report must not rewrite it
                raise FailedPrecondition(f"job {job_id} is {job.state.value}; its steps "
                                         "are final")
            outcome = await self._store.append_step(job_id, stored, idempotency_key)
            job.step = step
            if record.policy_version is not None:
                job.policy_version = record.policy_version
            job.updated_at_ms = self._clock.now_ms()
            await self._store.put_job(job)
        if outcome is StepAppend.REPEAT:
            logger.info("[job] repeated step report recognised job_id=%s step=%d", job_id, step)
            return outcome
        if outcome is StepAppend.REPLACED:
            await self._store.record_event(job_id, {
                "kind": "step_redone", "ts_ms": self._clock.now_ms(), "step": step})
        await self._elastic_jobs.feed(job, record)
        return outcome

    async def job_events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's events (elastic plans, joins, releases, failures, ...), oldest first."""
        await self._store.get_job(job_id)  # NotFound for an unknown job
        return await self._store.events(job_id)

    @property
    def num_queued_jobs(self) -> int:
        """Jobs waiting in the queue as of its last read (for /metrics: no store read)."""
        return self._queue.num_queued

    def elastic_loop(self, job_id: str) -> ElasticLoop | None:
        """The job's elastic loop once it saw a step (None otherwise)."""
        return self._elastic_jobs.loop(job_id)

    async def report_job_done(self, job_id: str, state: t.JobState, message: str) -> None:
        """End the job; keyed by job + outcome: once the job is terminal, a repeat (the
        trainer retrying after a lost reply) and any later outcome change nothing.
        Serialised with reconciliation, which may be ending the same job."""
        if not state.is_terminal:
            raise InvalidArgument("state", "must be succeeded, failed or cancelled")
        async with self._lifecycle_lock:
            await self._end_job(job_id, state, message)

    async def _end_job(self, job_id: str, state: t.JobState, message: str) -> None:
        """report_job_done under the lifecycle lock (the reconciler holds it already)."""
        job = await self._store.get_job(job_id)
        if job.state.is_terminal or await self._queue.position(job_id):
            if job.state is not state:
                logger.warning("[job] end report ignored job_id=%s state=%s: already %s",
                               job_id, state.value, job.state.value)
            return
        if state is not t.JobState.SUCCEEDED:
            # Best effort, as in cancel_job: an unreachable scheduler must not leave the
            # job RUNNING forever (that would refuse every later job).
            try:
                await self._scheduler.stop_job(job_id)
            except LibraError as exc:
                logger.warning("[job] stop failed job_id=%s error=%s", job_id, exc)
        await self._finish(job, state, message)
        self._kick()

    async def _finish(self, job: t.Job, state: t.JobState, message: str) -> t.Job:
        self._elastic_jobs.stop(job.job_id)  # lent instances go back to rollout
        job.state = state
        job.message = message
        job.queue_position = 0
        job.updated_at_ms = self._clock.now_ms()
        await self._store.put_job(job)
        logger.info("[job] ended job_id=%s state=%s message=%s", job.job_id, state.value,
                    message)
        return job

    # -- workers (see worker_registry.py) ----------------------------------------------

    async def acquire_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                            address: str, ttl_ms: int) -> t.Lease:
        """Grant a worker its lease; a new epoch fences out older holders (worker_registry.py)."""
        return await self._workers.acquire_lease(worker_id, role, bucket, address, ttl_ms)

    async def renew_lease(self, worker_id: str, epoch: int) -> t.Lease:
        """Extend the lease held at ``epoch``; fails once it expired or was granted anew."""
        return await self._workers.renew_lease(worker_id, epoch)

    async def renew_leases(self, refs: Sequence[t.LeaseRef]) -> list[t.LeaseRenewal]:
        """Renew a process's leases at once: one answer per lease, in order."""
        return await self._workers.renew_leases(refs)

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        """Give the lease up on a clean exit, so peers need not wait for its TTL."""
        await self._workers.release_lease(worker_id, epoch)

    async def change_worker_role(self, worker_id: str, expected_epoch: int,
                                 role: t.WorkerRole) -> t.Lease:
        """Compare-and-set of the role on ``expected_epoch`` (``ROLE_MOVES`` only)."""
        return await self._workers.change_worker_role(worker_id, expected_epoch, role)

    async def list_workers(self) -> list[t.Lease]:
        """The leases held now: the live workers, their roles and buckets."""
        return await self._workers.list_workers()
