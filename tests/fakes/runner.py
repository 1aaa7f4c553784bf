"""Fake trainer/scheduler job runner (``services.coordinator.core.JobRunner``).

Replaces: the trainer's and the scheduler's StartJob/StopJob behind gRPC (and, in
``FakeTrainer``, the trainer's GetTrainerStatus). Records the calls, yields to the event
loop like a real RPC, and refuses when told to.
"""

from __future__ import annotations

import asyncio

from libra import types as t
from libra.errors import LibraError


class FakeRunner:
    """Records started/stopped job ids; ``start_error``/``stop_error`` make it refuse."""

    def __init__(self, start_error: Exception | None = None,
                 stop_error: LibraError | None = None) -> None:
        self.started: list[str] = []
        self.resumed: list[str] = []  # started with resume=True
        self.stopped: list[str] = []
        self.start_error = start_error
        self.stop_error = stop_error

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        await asyncio.sleep(0)
        if self.start_error is not None:
            raise self.start_error
        self.started.append(job_id)
        if resume:
            self.resumed.append(job_id)

    async def stop_job(self, job_id: str) -> None:
        await asyncio.sleep(0)
        self.stopped.append(job_id)
        if self.stop_error is not None:
            raise self.stop_error


class FakeTrainer(FakeRunner):
    """A ``FakeRunner`` that also answers the trainer's status, as reconciliation asks.

    ``current`` is what ``status()`` returns: a start makes it "warmup" on the job, a
    stop of that job "idle"; tests set it to model a restarted (idle), finished (done)
    or failed trainer. ``status_error`` makes ``status()`` raise (trainer unreachable).
    ``resumed`` lists the jobs started with ``resume=True``.
    """

    def __init__(self, start_error: Exception | None = None,
                 stop_error: LibraError | None = None) -> None:
        super().__init__(start_error, stop_error)
        self.current = t.TrainerStatus(job_id="", phase="idle")
        self.status_error: LibraError | None = None

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        await super().start_job(job_id, resume)
        self.current = t.TrainerStatus(job_id=job_id, phase="warmup")

    async def stop_job(self, job_id: str) -> None:
        if self.current.job_id == job_id:
            self.current = t.TrainerStatus(job_id=job_id, phase="idle")
        await super().stop_job(job_id)

    async def status(self) -> t.TrainerStatus:
        await asyncio.sleep(0)
        if self.status_error is not None:
            raise self.status_error
        return self.current
