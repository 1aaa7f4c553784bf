"""Typed client of the coordinator (job API and worker registry)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from libra import types as t
from libra.clients.api import CoordinatorApi as CoordinatorApi
from libra.clients.api import CoordinatorJobApi as CoordinatorJobApi
from libra.clients.base import GrpcClientBase
from libra.grpc_auth import ClientAuth
from libra.limits import MAX_LEASES_PER_RENEWAL
from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.proto.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from libra.wire.common import lease_from_proto, role_to_proto
from libra.wire.coordinator import (
    job_from_proto,
    job_state_to_proto,
    lease_refs_to_proto,
    renewals_from_proto,
)
from libra.wire.step_record import step_record_to_json

# CreateJob validates before storing: the model's config and tokenizer (loading
# transformers the first time), the dataset's first rows, the tools' schemas, init_from's
# checkpoint hashes. Seconds on a quiet machine, tens of seconds on a loaded one.
SUBMIT_TIMEOUT_S = 120.0


class GrpcCoordinatorClient(GrpcClientBase):
    """Coordinator over gRPC."""

    def __init__(self, address: str, timeout_s: float = 10.0, *,
                 auth: ClientAuth | None = None) -> None:
        super().__init__(address, timeout_s, auth=auth)
        self._stub = pb_grpc.CoordinatorServiceStub(self._channel)

    async def create_job(self, spec: str, spec_format: str = "toml",
                         priority: int = 0) -> t.Job:
        """Create a job; PENDING with a ``queue_position`` while another job runs."""
        resp = await self._call(self._stub.CreateJob, pb.CreateJobRequest(
            spec=spec, spec_format=spec_format, priority=priority),
            timeout_s=max(self._timeout_s, SUBMIT_TIMEOUT_S))
        return job_from_proto(resp.job)

    async def resume_job(self, job_id: str, priority: int = 0) -> t.Job:
        """Restart a cancelled or failed job from its newest checkpoint (same id)."""
        resp = await self._call(self._stub.ResumeJob,
                                pb.ResumeJobRequest(job_id=job_id, priority=priority))
        return job_from_proto(resp.job)

    async def get_job(self, job_id: str) -> tuple[t.Job, list[dict], dict]:
        """The job, its step records (oldest first) and its counters; NotFound for an unknown id."""
        resp = await self._call(self._stub.GetJob, pb.GetJobRequest(job_id=job_id),
                                idempotent=True)
        steps = [json.loads(s) for s in resp.steps_json]
        return job_from_proto(resp.job), steps, json.loads(resp.counters_json or "{}")

    async def get_job_events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's events (plans, joins, releases, failures), oldest first."""
        resp = await self._call(self._stub.GetJob, pb.GetJobRequest(job_id=job_id),
                                idempotent=True)
        return [json.loads(e) for e in resp.events_json]

    async def list_jobs(self) -> list[t.Job]:
        """Every job as a summary (``spec_json`` empty; ``get_job`` has the spec), oldest
        first, page after page."""
        jobs: list[t.Job] = []
        page, token = await self.list_jobs_page()
        jobs.extend(page)
        while token:
            page, next_token = await self.list_jobs_page(page_token=token)
            jobs.extend(page)
            token = next_token if next_token != token else ""  # a server bug must not loop
        return jobs

    async def list_jobs_page(self, page_size: int = 0,
                             page_token: str = "") -> tuple[list[t.Job], str]:
        """One page of job summaries and the next page's token ("" after the last);
        ``page_size`` 0 = the server's default (100), at most 500."""
        resp = await self._call(self._stub.ListJobs, pb.ListJobsRequest(
            page_size=page_size, page_token=page_token), idempotent=True)
        return [job_from_proto(j) for j in resp.jobs], resp.next_page_token

    async def cancel_job(self, job_id: str, reason: str = "") -> t.Job:
        """Cancel a job; ``reason`` becomes its message (default "cancelled by user")."""
        resp = await self._call(self._stub.CancelJob,
                                pb.CancelJobRequest(job_id=job_id, reason=reason),
                                idempotent=True)
        return job_from_proto(resp.job)

    async def acquire_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                            address: str, ttl_ms: int) -> t.Lease:
        """Register a worker: a lease for ``ttl_ms`` whose new epoch fences out any older holder
        of the same worker id."""
        resp = await self._call(self._stub.AcquireLease, pb.AcquireLeaseRequest(
            worker_id=worker_id, role=role_to_proto(role), bucket=bucket, address=address,
            ttl_ms=ttl_ms), idempotent=True)
        return lease_from_proto(resp.lease)

    async def renew_lease(self, worker_id: str, epoch: int, *,
                          timeout_s: float | None = None) -> t.Lease:
        """Extend the lease held at ``epoch``; LeaseLost once it expired or was granted anew
        (which tells a zombie worker to stop). ``timeout_s``: this call's deadline (the
        client's default if None); a holder bounds it by the time its lease has left."""
        resp = await self._call(self._stub.RenewLease,
                                pb.RenewLeaseRequest(worker_id=worker_id, epoch=epoch),
                                idempotent=True, timeout_s=timeout_s)
        return lease_from_proto(resp.lease)

    async def renew_leases(self, refs: Sequence[t.LeaseRef]) -> list[t.LeaseRenewal]:
        """Renew every lease a process holds: one RenewLeases call per
        ``MAX_LEASES_PER_RENEWAL`` leases (none for none); one answer per lease, in order.
        A lost lease is an answer (``lease_or_raise`` raises LeaseLost), not an error."""
        out: list[t.LeaseRenewal] = []
        for lo in range(0, len(refs), MAX_LEASES_PER_RENEWAL):
            resp = await self._call(
                self._stub.RenewLeases,
                lease_refs_to_proto(refs[lo:lo + MAX_LEASES_PER_RENEWAL]), idempotent=True)
            out.extend(renewals_from_proto(resp))
        return out

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        """Give the lease up on a clean exit, so peers need not wait for its TTL."""
        await self._call(self._stub.ReleaseLease,
                         pb.ReleaseLeaseRequest(worker_id=worker_id, epoch=epoch),
                         idempotent=True)

    async def change_worker_role(self, worker_id: str, expected_epoch: int,
                                 role: t.WorkerRole) -> t.Lease:
        """Compare-and-set the lease's role on ``expected_epoch``; returns the lease at its
        fresh epoch. Safe to retry: a repeat after a lost reply is refused with LeaseLost
        (the epoch moved on), never applied twice."""
        resp = await self._call(self._stub.ChangeWorkerRole, pb.ChangeWorkerRoleRequest(
            worker_id=worker_id, expected_epoch=expected_epoch, role=role_to_proto(role)))
        return lease_from_proto(resp.lease)

    async def list_workers(self) -> list[t.Lease]:
        """The leases held now: which workers are alive, in which role and bucket."""
        resp = await self._call(self._stub.ListWorkers, pb.ListWorkersRequest(),
                                idempotent=True)
        return [lease_from_proto(lease) for lease in resp.leases]

    async def report_step(self, job_id: str, record: t.StepRecord | dict[str, Any],
                          idempotency_key: str = "") -> None:
        """Append one training step to the job's history; ``idempotency_key`` makes a retried
        report (its reply lost) a no-op."""
        # A raw dict (tests, tools) goes as it is; the coordinator checks either.
        step_json = (json.dumps(record) if isinstance(record, dict)
                     else step_record_to_json(record))
        await self._call(self._stub.ReportStep, pb.ReportStepRequest(
            job_id=job_id, step_json=step_json, idempotency_key=idempotency_key),
            idempotent=True)

    async def report_job_done(self, job_id: str, state: t.JobState, message: str) -> None:
        """The trainer's word that the job ended (succeeded or failed, and why)."""
        await self._call(self._stub.ReportJobDone, pb.ReportJobDoneRequest(
            job_id=job_id, state=job_state_to_proto(state), message=message), idempotent=True)
