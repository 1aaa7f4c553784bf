"""``InProcessCoordinatorClient``: the coordinator client's surface (the methods of
``libra.clients.coordinator.GrpcCoordinatorClient``, hence ``CoordinatorApi`` and
``CoordinatorJobApi``) served by a ``CoordinatorCore`` in this process, without sockets:
for a one-process debugging loop.

It does what the servicer does between the wire and the core - an empty spec format is
TOML, a step record goes through the ``step_json`` codec (the same checks and field
names as over gRPC) - and answers by value, as the wire does (a caller changing a job it
got back changes no stored state). Errors are those the gRPC client raises: a domain
error (``libra.errors``) as it is, any other failure as ``Internal`` (the gRPC client
sees INTERNAL).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from libra import types as t
from libra.errors import Internal
from libra.wire.step_record import step_record_from_json, step_record_to_json
from services.coordinator.core import CoordinatorCore

T = TypeVar("T")


class InProcessCoordinatorClient:
    """The coordinator client over a core in this process."""

    def __init__(self, core: CoordinatorCore) -> None:
        self._core = core

    # -- job API -------------------------------------------------------------------------

    async def create_job(self, spec: str, spec_format: str = "toml",
                         priority: int = 0) -> t.Job:
        """Create a job; PENDING with a ``queue_position`` while another job runs."""
        return await _by_value(self._core.create_job(spec, spec_format or "toml", priority))

    async def resume_job(self, job_id: str, priority: int = 0) -> t.Job:
        """Restart a cancelled or failed job from its newest checkpoint (same id)."""
        return await _by_value(self._core.resume_job(job_id, priority))

    async def get_job(self, job_id: str) -> tuple[t.Job, list[dict], dict]:
        """The job, its step records (JSON shape) and its counters."""
        return await _by_value(self._core.get_job(job_id))

    async def get_job_events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's events (plans, joins, releases, failures), oldest first."""
        return await _by_value(self._core.job_events(job_id))

    async def list_jobs(self) -> list[t.Job]:
        """Every job as a summary (``spec_json`` empty), oldest first, page after page."""
        jobs, token = await self.list_jobs_page()
        while token:
            page, token = await self.list_jobs_page(page_token=token)
            jobs.extend(page)
        return jobs

    async def list_jobs_page(self, page_size: int = 0,
                             page_token: str = "") -> tuple[list[t.Job], str]:
        """One page of job summaries and the next page's token ("" after the last)."""
        return await _by_value(self._core.list_jobs_page(page_size, page_token))

    async def cancel_job(self, job_id: str, reason: str = "") -> t.Job:
        """Cancel a job; ``reason`` becomes its message (default "cancelled by user")."""
        return await _by_value(self._core.cancel_job(job_id, reason))

    # -- workers -------------------------------------------------------------------------

    async def acquire_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                            address: str, ttl_ms: int) -> t.Lease:
        return await _by_value(self._core.acquire_lease(worker_id, role, bucket, address,
                                                        ttl_ms))

    async def renew_lease(self, worker_id: str, epoch: int, *,
                          timeout_s: float | None = None) -> t.Lease:
        # ``timeout_s`` bounds a wire call; in process there is none to hang on (the
        # store's own Redis timeouts bound the core's call).
        del timeout_s
        return await _by_value(self._core.renew_lease(worker_id, epoch))

    async def renew_leases(self, refs: Sequence[t.LeaseRef]) -> list[t.LeaseRenewal]:
        return await _by_value(self._core.renew_leases(list(refs)))

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        await _by_value(self._core.release_lease(worker_id, epoch))

    async def change_worker_role(self, worker_id: str, expected_epoch: int,
                                 role: t.WorkerRole) -> t.Lease:
        """Compare-and-set the lease's role on ``expected_epoch`` (fresh epoch back)."""
        return await _by_value(self._core.change_worker_role(worker_id, expected_epoch,
                                                             role))

    async def list_workers(self) -> list[t.Lease]:
        return await _by_value(self._core.list_workers())

    # -- trainer reports -----------------------------------------------------------------

    async def report_step(self, job_id: str, record: dict[str, Any] | t.StepRecord,
                          idempotency_key: str = "") -> None:
        """Store a step record; a repeat with the same key is recognised, not stored
        twice. Either shape goes through the ``step_json`` codec, as over the wire."""
        text = (step_record_to_json(record) if isinstance(record, t.StepRecord)
                else json.dumps(record))
        typed = step_record_from_json(text)  # InvalidArgument("step_json...") as on gRPC
        await _by_value(self._core.report_step(job_id, typed, idempotency_key))

    async def report_job_done(self, job_id: str, state: t.JobState, message: str) -> None:
        await _by_value(self._core.report_job_done(job_id, state, message))

    async def close(self) -> None:
        """Nothing to close: no channel."""


async def _by_value(call: Awaitable[T]) -> T:
    """``call``'s result as a copy (the wire answers by value), its failure raised as the
    gRPC client would raise it."""
    try:
        result = await call
    except Exception as exc:
        if getattr(exc, "grpc_status_name", None) is not None:
            raise
        raise Internal(f"{type(exc).__name__}: {exc}") from exc
    return copy.deepcopy(result)
