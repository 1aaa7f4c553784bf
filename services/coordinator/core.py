"""Coordinator core: the job lifecycle and the worker registry (pure; no grpc/redis).

A job is validated completely before anything is stored, so an invalid spec leaves
nothing behind: the schema here, then the model (an injected :class:`ModelCheck`: can
this machine load and train ``model.path``?) and the dataset (an injected
:class:`DatasetCheck`: does ``task.path`` read, with the mapped fields?). When nothing
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
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Protocol

from libra import types as t
from libra.agents import check_agent_name
from libra.clock import Clock
from libra.errors import FailedPrecondition, InvalidArgument, LibraError, Unavailable
from libra.ids import new_job_id
from libra.jobspec import ElasticSpec, JobSpec, ToolSchema, job_spec_from_json, parse_job_spec
from libra.limits import check_id, check_step_record
from services.coordinator.checkpoints import CheckpointProbe, newest_checkpoint_step
from services.coordinator.elastic import ElasticExecutor, ElasticLoop, ElasticWiring
from services.coordinator.jobqueue import DEFAULT_MAX_QUEUED_JOBS, JobQueue, check_priority
from services.coordinator.reconcile import Reconciler, ReconcileWiring, Verdict
from services.coordinator.store import CoordinatorStore, StepAppend

logger = logging.getLogger(__name__)

MIN_LEASE_TTL_MS = 200
MAX_LEASE_TTL_MS = 600_000
MAX_ADDRESS_CHARS = 512  # host:port or a unix socket path

# The elastic hybrid pool's role moves: target role -> roles a lease may hold before it.
# hybrid-rollout -> hybrid-joining (lend), hybrid-joining -> hybrid-training (activate),
# and back to hybrid-rollout from either (reclaim, failed or cancelled join).
ROLE_MOVES: dict[t.WorkerRole, tuple[t.WorkerRole, ...]] = {
    t.WorkerRole.HYBRID_JOINING: (t.WorkerRole.HYBRID_ROLLOUT,),
    t.WorkerRole.HYBRID_TRAINING: (t.WorkerRole.HYBRID_JOINING,),
    t.WorkerRole.HYBRID_ROLLOUT: (t.WorkerRole.HYBRID_JOINING, t.WorkerRole.HYBRID_TRAINING),
}


class JobRunner(Protocol):
    """What the coordinator needs from the trainer and the scheduler."""

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        """Start a job; ``resume``: it ran before (newest checkpoint, counters continued)."""
        ...

    async def stop_job(self, job_id: str) -> None: ...


class ModelCheck(Protocol):
    """Checks a parsed spec's model before the job is stored (blocking: it reads files).

    Raises InvalidArgument naming the field (``model.path``, ``model.dtype``, ...) when
    the model cannot be loaded or trained here. The service wires
    ``services/coordinator/model_check.py`` (torch, transformers stay out of the core).
    """

    def __call__(self, spec: JobSpec) -> None: ...


class DatasetCheck(Protocol):
    """Checks a parsed spec's dataset before the job is stored (blocking: it reads the
    file). Raises InvalidArgument naming the field and row (``task.prompt_field: row 3
    has no field 'question'``); the service wires ``services/coordinator/dataset_check.py``.
    """

    def __call__(self, spec: JobSpec) -> None: ...


class CorpusCheck(Protocol):
    """Checks the files a job's tools will read (``tools.search_corpus``) lie inside the
    tool data roots (blocking: it resolves symlinks). Raises InvalidArgument naming
    ``tools.search_corpus[i]``; the service wires ``libra.data_roots``."""

    def __call__(self, spec: JobSpec) -> None: ...


class InitFromCheck(Protocol):
    """Checks ``algorithm.init_from`` before the job is stored (blocking: it hashes the
    checkpoint's files): it names a checkpoint under ``run_root`` (or a directory) that
    verifies and fits ``[model]``; else InvalidArgument("algorithm.init_from", ...).
    The service wires ``services/coordinator/init_from_check.py``."""

    def __call__(self, spec: JobSpec, run_root: Path) -> None: ...


class ToolCatalog(Protocol):
    """The tool gateway's ListTools (``[{"name", "description", "args_schema", ...}]``) and
    ListRewards (``[{"name", "description"}]``): its registries, the only lists of names."""

    async def list_tools(self) -> list[dict[str, Any]]: ...

    async def list_rewards(self) -> list[dict[str, Any]]: ...


def _check_rewards(spec: JobSpec, known: list[str]) -> None:
    """Every reward the job calls (a composite's parts too) is registered on the gateway."""
    fields = ["reward.name"] + [f"reward.components[{i}].name"
                                for i in range(len(spec.reward.components))]
    for path, name in zip(fields, spec.reward.names(), strict=True):
        if name not in known:
            raise InvalidArgument(path, f"the tool gateway has no reward {name!r} (it has: "
                                        f"{', '.join(known)})")


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
                 corpus_check: CorpusCheck | None = None) -> None:
        self._store = store
        self._trainer = trainer
        self._scheduler = scheduler
        self._clock = clock
        self._run_root = run_root
        self._elastic = elastic
        self._model_check = model_check
        self._dataset_check = dataset_check
        self._init_from_check = init_from_check
        self._corpus_check = corpus_check
        self._tool_catalog = tool_catalog
        # Per job: its elastic loop, or None when the job is not elastic (cached).
        self._elastic_loops: dict[str, ElasticLoop | None] = {}
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
        spec = parse_job_spec(spec_text, spec_format)
        check_agent_name(spec.task.agent)  # built-ins + libra.agents entry points
        if self._corpus_check is not None and spec.tools.search_corpus:
            await asyncio.to_thread(self._corpus_check, spec)
        if self._model_check is not None:
            # Off the event loop: it reads config/tokenizer files (about a second), and
            # leases must keep renewing meanwhile.
            await asyncio.to_thread(self._model_check, spec)
        if self._dataset_check is not None:
            await asyncio.to_thread(self._dataset_check, spec)  # a 1M-row file: seconds
        if self._init_from_check is not None and spec.algorithm.init_from:
            await asyncio.to_thread(self._init_from_check, spec, self._run_root)
        spec = await self._resolve_tools(spec)
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
        # A resumed job plans from scratch: its previous run's elastic loop was stopped.
        self._elastic_loops.pop(job.job_id, None)
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

    async def _resolve_tools(self, spec: JobSpec) -> JobSpec:
        """Check the enabled tools against the gateway and freeze their schemas into the
        spec, so the trainer's warm start and every rollout render the same prompt."""
        if self._tool_catalog is None:
            return spec
        try:
            catalog = {tool["name"]: tool for tool in await self._tool_catalog.list_tools()}
            rewards = sorted(r["name"] for r in await self._tool_catalog.list_rewards())
        except LibraError as exc:
            if spec.task.tool_call_format == "arith":
                return spec  # the tag protocol renders no schemas: the gateway may come later
            raise Unavailable(f"tool gateway unreachable ({exc}); a {spec.task.tool_call_format}"
                              " job needs its tools' schemas at submit: start the gateway "
                              "and submit again") from exc
        for index, name in enumerate(spec.tools.enabled):
            if name not in catalog:
                raise InvalidArgument(f"tools.enabled[{index}]", f"the tool gateway has no tool "
                                      f"{name!r} (it has: {', '.join(sorted(catalog))})")
        _check_rewards(spec, rewards)
        schemas = [ToolSchema(name=name, description=catalog[name].get("description", ""),
                              parameters_json=json.dumps(catalog[name].get("args_schema", {}),
                                                         sort_keys=True))
                   for name in spec.tools.enabled]
        return dataclasses.replace(spec, tools=dataclasses.replace(spec.tools, schemas=schemas))

    async def _stop_runners(self, job_id: str) -> None:
        for runner in (self._scheduler, self._trainer):
            try:
                await runner.stop_job(job_id)
            except LibraError as exc:
                logger.warning("[job] stop failed job_id=%s error=%s", job_id, exc)

    async def get_job(self, job_id: str) -> tuple[t.Job, list[dict[str, Any]], dict[str, int]]:
        """The job, its step records, and its counters with the measured backlog
        (``in_flight_*``, see ``CoordinatorStore.backlog``)."""
        job = await self._store.get_job(job_id)
        job.queue_position = await self._queue.position(job_id)
        counters = {**await self._store.counters(job_id), **await self._store.backlog(job_id)}
        return job, await self._store.steps(job_id), counters

    async def list_jobs(self) -> list[t.Job]:
        """Every job, with its place in the queue (``queue_position``, 0 = not queued)."""
        jobs, positions = await self._store.list_jobs(), await self._queue.positions()
        for job in jobs:
            job.queue_position = positions.get(job.job_id, 0)
        return jobs

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

    async def report_step(self, job_id: str, record: dict[str, Any],
                          idempotency_key: str = "") -> StepAppend:
        """Store a step record once (reports are keyed by job + step, see StepAppend).

        A repeat (the trainer retrying after a lost reply) writes no second record but
        still sets the job's step and version: the try that stored the record may have
        died before doing so. Only a new record feeds the elastic planner.
        """
        step = check_step_record(record)
        # Under the lifecycle lock: a cancel landing between the read and the write would
        # otherwise be overwritten (the job written back RUNNING). A cancel waiting here
        # stops the trainer, whose cancelled call ends this one.
        async with self._lifecycle_lock:
            job = await self._store.get_job(job_id)
            if job.state.is_terminal:  # a late or forged report must not rewrite it
                raise FailedPrecondition(f"job {job_id} is {job.state.value}; its steps "
                                         "are final")
            outcome = await self._store.append_step(job_id, record, idempotency_key)
            job.step = step
            job.policy_version = record.get("policy_version", job.policy_version)
            job.updated_at_ms = self._clock.now_ms()
            await self._store.put_job(job)
        if outcome is StepAppend.REPEAT:
            logger.info("[job] repeated step report recognised job_id=%s step=%d", job_id, step)
            return outcome
        if outcome is StepAppend.REPLACED:
            await self._store.record_event(job_id, {
                "kind": "step_redone", "ts_ms": self._clock.now_ms(), "step": step})
        await self._feed_elastic(job, record)
        return outcome

    async def job_events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's events (elastic plans, joins, releases, failures, ...), oldest first."""
        await self._store.get_job(job_id)  # NotFound for an unknown job
        return await self._store.events(job_id)

    async def _feed_elastic(self, job: t.Job, record: dict[str, Any]) -> None:
        loop = self._elastic_loop(job)
        if loop is None:
            return
        try:
            await loop.on_step(record)
        except Exception:
            # The planner is advisory: a failure there must not fail the trainer's step
            # report (the step is already stored); it is logged and the next step retries.
            logger.exception("[elastic] planning failed job_id=%s", job.job_id)

    def _elastic_loop(self, job: t.Job) -> ElasticLoop | None:
        if job.job_id in self._elastic_loops:
            return self._elastic_loops[job.job_id]
        spec = job_spec_from_json(job.spec_json).elastic
        loop = None
        if spec.enabled and self._elastic is None:
            logger.warning("[elastic] job_id=%s asks for the elastic pool but this "
                           "coordinator has no planner wired; running without", job.job_id)
        elif spec.enabled and self._elastic is not None:
            loop = self._new_elastic_loop(job.job_id, spec, self._elastic)
        self._elastic_loops[job.job_id] = loop
        return loop

    def _new_elastic_loop(self, job_id: str, spec: ElasticSpec,
                          wiring: ElasticWiring) -> ElasticLoop:
        executor = ElasticExecutor(job_id=job_id, spec=spec, rollouts=wiring.rollouts,
                                   events=self._store, clock=self._clock,
                                   trainer_address=wiring.trainer_address,
                                   rpc_deadline_s=wiring.rpc_deadline_s)
        return ElasticLoop(job_id=job_id, planner=wiring.planner_factory(spec),
                           executor=executor, events=self._store,
                           leases=self._store.live_leases, clock=self._clock)

    def elastic_loop(self, job_id: str) -> ElasticLoop | None:
        """The job's elastic loop once it saw a step (None otherwise)."""
        return self._elastic_loops.get(job_id)

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
        if (loop := self._elastic_loops.get(job.job_id)) is not None:
            loop.stop()  # lent instances go back to rollout (in the background)
        job.state = state
        job.message = message
        job.queue_position = 0
        job.updated_at_ms = self._clock.now_ms()
        await self._store.put_job(job)
        logger.info("[job] ended job_id=%s state=%s message=%s", job.job_id, state.value,
                    message)
        return job

    # -- workers ------------------------------------------------------------------------

    async def acquire_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                            address: str, ttl_ms: int) -> t.Lease:
        check_id(worker_id, "worker_id")
        if bucket:
            check_id(bucket, "bucket")
        if len(address) > MAX_ADDRESS_CHARS or not address.isprintable():
            raise InvalidArgument("address", f"a host:port, at most {MAX_ADDRESS_CHARS} "
                                  "printable characters")
        if not MIN_LEASE_TTL_MS <= ttl_ms <= MAX_LEASE_TTL_MS:
            raise InvalidArgument("ttl_ms", f"must be in [{MIN_LEASE_TTL_MS}, "
                                  f"{MAX_LEASE_TTL_MS}]")
        lease = t.Lease(t.WorkerId(worker_id), role, bucket, address, 0, 0, ttl_ms)
        granted = await self._store.acquire_lease(lease)
        logger.info("[lease] granted worker_id=%s role=%s bucket=%s epoch=%d", worker_id,
                    role.value, bucket, granted.epoch)
        return granted

    async def renew_lease(self, worker_id: str, epoch: int) -> t.Lease:
        check_id(worker_id, "worker_id")
        return await self._store.renew_lease(worker_id, epoch, self._clock.now_ms())

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        check_id(worker_id, "worker_id")
        await self._store.release_lease(worker_id, epoch)

    async def change_worker_role(self, worker_id: str, expected_epoch: int,
                                 role: t.WorkerRole) -> t.Lease:
        """Compare-and-set of the role on ``expected_epoch`` (elastic hybrid pool).

        Only the moves in ``ROLE_MOVES`` are allowed; the store checks the current role
        and the epoch atomically, and a success takes a fresh fence (the new epoch).
        """
        check_id(worker_id, "worker_id")
        allowed_from = ROLE_MOVES.get(role)
        if allowed_from is None:
            targets = ", ".join(r.value for r in ROLE_MOVES)
            raise InvalidArgument("role", f"{role.value} is not a role a lease can change "
                                  f"to (one of {targets})")
        lease = await self._store.change_role(worker_id, expected_epoch, role, allowed_from)
        logger.info("[lease] role changed worker_id=%s role=%s epoch=%d->%d", worker_id,
                    role.value, expected_epoch, lease.epoch)
        return lease

    async def list_workers(self) -> list[t.Lease]:
        return await self._store.live_leases()
