"""Fake trainer/scheduler job runner (``services.coordinator.core.JobRunner``).

Replaces: the trainer's and the scheduler's StartJob/StopJob behind gRPC. Records the
calls, yields to the event loop like a real RPC, and refuses when told to.
"""

from __future__ import annotations

import asyncio

from libra.errors import LibraError


class FakeRunner:
    """Records started/stopped job ids; ``start_error``/``stop_error`` make it refuse."""

    def __init__(self, start_error: Exception | None = None,
                 stop_error: LibraError | None = None) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.start_error = start_error
        self.stop_error = stop_error

    async def start_job(self, job_id: str) -> None:
        await asyncio.sleep(0)
        if self.start_error is not None:
            raise self.start_error
        self.started.append(job_id)

    async def stop_job(self, job_id: str) -> None:
        await asyncio.sleep(0)
        self.stopped.append(job_id)
        if self.stop_error is not None:
            raise self.stop_error
