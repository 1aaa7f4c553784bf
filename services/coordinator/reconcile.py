"""Reconciliation: every PENDING or RUNNING job has a trainer working on it (pure).

A job can be left RUNNING with nobody working on it: the coordinator restarted while
the trainer's job-done report was in flight, the trainer gave up reporting, a stack
came up over a Redis that kept a job from before, or the trainer died for good. Such
a job would refuse every later submit (one job at a time). The coordinator therefore
asks the trainer (GetTrainerStatus) about each non-terminal job, once at start-up and
then every ``interval_s``, and acts on what it hears (:func:`decide`):

=========  ===============================  ==========================================
job        trainer                          action
=========  ===============================  ==========================================
PENDING    (any; a queued job is skipped)      fail: only an earlier coordinator process
                                            can leave one (this one holds the lifecycle
                                            lock across a create and a queue start)
RUNNING    working on it                    nothing
RUNNING    done with it                     succeed with the trainer's message
RUNNING    failed with it                   fail with the trainer's message
RUNNING    idle or on another job           resume from the newest checkpoint (trainer
                                            StartJob(resume), scheduler StartJob), at
                                            most ``max_resumes`` times, then fail
(any)      unreachable < trainer_lost_s     wait: the supervisor restarts it, and a
                                            restarted trainer resumes RUNNING jobs
(any)      unreachable >= trainer_lost_s    fail
=========  ===============================  ==========================================

After each pass ``after_pass`` runs (the core starts the job queue's head when nothing is
active: that covers jobs queued before a coordinator restart).

Every action is recorded as a ``job_reconciled`` event (action, reason). Each job is
handled under the core's lifecycle lock, so a pass never interleaves with a create or
a cancel of the same job (the status is read under the lock too).

Bounds: an orphaned job is resumed or ended within ``interval_s`` (+ one status call)
of the coordinator being up and the trainer reachable; with the trainer unreachable it
is failed within ``trainer_lost_s + interval_s``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from libra import types as t
from libra.cancellation import raise_if_cancelled
from libra.clock import Clock
from libra.errors import LibraError
from libra.retry import Sleep
from services.coordinator.store_protocol import CoordinatorStore

logger = logging.getLogger(__name__)


class TrainerControl(Protocol):
    """What reconciliation needs from the trainer (``GrpcTrainerClient`` has it)."""

    async def status(self) -> t.TrainerStatus: ...

    async def start_job(self, job_id: str, resume: bool = False) -> None: ...

    async def stop_job(self, job_id: str) -> None: ...


class StepRunner(Protocol):
    """The scheduler's side of a job (a resumed job is scheduled again)."""

    async def start_job(self, job_id: str, resume: bool = False) -> None: ...

    async def stop_job(self, job_id: str) -> None: ...


# Ends a job, called under the lifecycle lock: the core's report_job_done without taking
# the lock (it stops the scheduler unless the job succeeded).
EndJob = Callable[[str, t.JobState, str], Awaitable[None]]


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileSettings:
    interval_s: float = 5.0
    """Time between passes (the first runs at start-up)."""
    trainer_lost_s: float = 60.0
    """A trainer unreachable this long no longer works on anything: its jobs fail."""
    max_resumes: int = 3
    """Resumes of one job by this coordinator process before it fails instead."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.trainer_lost_s < 0 or self.max_resumes < 0:
            raise ValueError(f"need interval_s > 0, trainer_lost_s >= 0, max_resumes >= 0; "
                             f"got {self.interval_s}, {self.trainer_lost_s}, "
                             f"{self.max_resumes}")


@dataclass(frozen=True, slots=True)
class ReconcileWiring:
    """What the core needs to reconcile (``None`` in the core: reconciliation off)."""

    trainer: TrainerControl
    settings: ReconcileSettings = ReconcileSettings()
    sleep: Sleep = asyncio.sleep


class Action(enum.Enum):
    NONE = "none"
    WAIT = "wait"
    RESUME = "resume"
    SUCCEED = "succeed"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    reason: str = ""


def decide(job: t.Job, status: t.TrainerStatus | None, unreachable_for_s: float,
           num_resumes: int, settings: ReconcileSettings) -> Verdict:
    """What to do about a non-terminal job, given the trainer's status (None: the
    trainer did not answer, for ``unreachable_for_s`` so far)."""
    if job.state is t.JobState.PENDING:
        return Verdict(Action.FAIL, "interrupted while starting (the coordinator "
                       "restarted); submit it again")
    if status is None:
        if unreachable_for_s >= settings.trainer_lost_s:
            return Verdict(Action.FAIL, f"trainer unreachable for {unreachable_for_s:.0f}s")
        return Verdict(Action.WAIT, "trainer unreachable")
    if status.is_working_on(job.job_id):
        return Verdict(Action.NONE)
    if status.job_id == job.job_id and status.phase == "done":
        return Verdict(Action.SUCCEED, status.message or "trainer finished the job")
    if status.job_id == job.job_id and status.phase == "failed":
        return Verdict(Action.FAIL, status.message or "trainer failed the job")
    if num_resumes >= settings.max_resumes:
        return Verdict(Action.FAIL, f"no trainer works on the job after {num_resumes} "
                       f"resumes (trainer phase {status.phase})")
    return Verdict(Action.RESUME, f"no trainer works on the job (trainer phase "
                   f"{status.phase}, job {status.job_id or '-'})")


class Reconciler:
    """Runs :func:`decide` for every non-terminal job and applies the verdict."""

    def __init__(self, store: CoordinatorStore, wiring: ReconcileWiring,
                 scheduler: StepRunner, end_job: EndJob, lock: asyncio.Lock,
                 clock: Clock,
                 after_pass: Callable[[], Awaitable[object]] | None = None) -> None:
        self._store = store
        self._trainer = wiring.trainer
        self._settings = wiring.settings
        self._sleep = wiring.sleep
        self._scheduler = scheduler
        self._end_job = end_job
        self._lock = lock
        self._clock = clock
        self._after_pass = after_pass
        self._unreachable_since_s: float | None = None
        self._num_resumes: dict[str, int] = {}

    async def run(self) -> None:
        """A pass now, then one every ``interval_s``, until cancelled."""
        while True:
            raise_if_cancelled()
            try:
                await self.reconcile_once()
            except Exception:  # noqa: BLE001 - e.g. Redis away: the next pass retries
                logger.exception("[reconcile] pass failed; retrying in %.1fs",
                                 self._settings.interval_s)
            await self._sleep(self._settings.interval_s)

    async def reconcile_once(self) -> dict[str, Verdict]:
        """One pass over the non-terminal jobs; returns each job's verdict."""
        verdicts: dict[str, Verdict] = {}
        for listed in await self._store.list_jobs():
            if listed.state.is_terminal:
                continue
            async with self._lock:
                job = await self._store.get_job(listed.job_id)  # as of now, under the lock
                # A queued job waits for its turn: nobody is meant to work on it yet.
                queued = job.job_id in await self._store.queued_job_ids()
                if not job.state.is_terminal and not queued:
                    verdicts[job.job_id] = await self._reconcile(job)
        if self._after_pass is not None:
            await self._after_pass()
        return verdicts

    async def _reconcile(self, job: t.Job) -> Verdict:
        status = await self._status()
        unreachable_for_s = (0.0 if self._unreachable_since_s is None
                             else self._clock.now_s() - self._unreachable_since_s)
        verdict = decide(job, status, unreachable_for_s,
                         self._num_resumes.get(job.job_id, 0), self._settings)
        if verdict.action is Action.RESUME:
            verdict = await self._resume(job.job_id, verdict)
        if verdict.action in (Action.NONE, Action.WAIT):
            return verdict
        logger.warning("[reconcile] job_id=%s state=%s action=%s reason=%s", job.job_id,
                       job.state.value, verdict.action.value, verdict.reason)
        await self._store.record_event(job.job_id, {
            "kind": "job_reconciled", "ts_ms": self._clock.now_ms(),
            "action": verdict.action.value, "reason": verdict.reason,
            "trainer_phase": status.phase if status else "unreachable"})
        if verdict.action is Action.SUCCEED:
            await self._end_job(job.job_id, t.JobState.SUCCEEDED, verdict.reason)
        elif verdict.action is Action.FAIL:
            await self._stop_trainer(job.job_id)
            await self._end_job(job.job_id, t.JobState.FAILED, verdict.reason)
        return verdict

    async def _status(self) -> t.TrainerStatus | None:
        try:
            status = await self._trainer.status()
        except LibraError as exc:
            if self._unreachable_since_s is None:
                self._unreachable_since_s = self._clock.now_s()
                logger.warning("[reconcile] trainer unreachable error=%s", exc)
            return None
        self._unreachable_since_s = None
        return status

    async def _resume(self, job_id: str, verdict: Verdict) -> Verdict:
        """Hand the job to the trainer (from its checkpoint) and the scheduler again."""
        self._num_resumes[job_id] = self._num_resumes.get(job_id, 0) + 1
        try:
            await self._trainer.start_job(job_id, resume=True)
            await self._scheduler.start_job(job_id)  # a no-op if it still schedules it
        except LibraError as exc:
            return Verdict(Action.FAIL, f"{verdict.reason}; resume failed: {exc}")
        return verdict

    async def _stop_trainer(self, job_id: str) -> None:
        # Best effort: it may hold the job (failed there, or started for a PENDING job).
        try:
            await self._trainer.stop_job(job_id)
        except LibraError as exc:
            logger.warning("[reconcile] trainer stop failed job_id=%s error=%s", job_id, exc)
