"""gRPC shell of the coordinator: convert, delegate, convert."""

from __future__ import annotations

import json

from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.proto.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from libra.wire.common import lease_to_proto, role_from_proto
from libra.wire.coordinator import (
    job_state_from_proto,
    job_to_proto,
    lease_refs_from_proto,
    renewals_to_proto,
)
from libra.wire.step_record import step_record_from_json
from services.coordinator.core import CoordinatorCore
from services.coordinator.step_metrics import export_step
from services.coordinator.store_protocol import StepAppend


class CoordinatorServicer(pb_grpc.CoordinatorServiceServicer):
    def __init__(self, core: CoordinatorCore) -> None:
        self._core = core

    async def CreateJob(self, request, context):  # noqa: N802, ANN001
        job = await self._core.create_job(request.spec, request.spec_format or "toml",
                                          request.priority)
        return pb.CreateJobResponse(job=job_to_proto(job))

    async def GetJob(self, request, context):  # noqa: N802, ANN001
        job, steps, counters = await self._core.get_job(request.job_id)
        events = await self._core.job_events(request.job_id)
        return pb.GetJobResponse(job=job_to_proto(job),
                                 steps_json=[json.dumps(s) for s in steps],
                                 counters_json=json.dumps(counters),
                                 events_json=[json.dumps(e) for e in events])

    async def ListJobs(self, request, context):  # noqa: N802, ANN001
        jobs, next_token = await self._core.list_jobs_page(request.page_size, request.page_token)
        return pb.ListJobsResponse(jobs=[job_to_proto(j) for j in jobs],
                                   next_page_token=next_token)

    async def CancelJob(self, request, context):  # noqa: N802, ANN001
        job = await self._core.cancel_job(request.job_id, request.reason)
        return pb.CancelJobResponse(job=job_to_proto(job))

    async def ResumeJob(self, request, context):  # noqa: N802, ANN001
        job = await self._core.resume_job(request.job_id, request.priority)
        return pb.ResumeJobResponse(job=job_to_proto(job))

    async def AcquireLease(self, request, context):  # noqa: N802, ANN001
        lease = await self._core.acquire_lease(request.worker_id, role_from_proto(request.role),
                                               request.bucket, request.address, request.ttl_ms)
        return pb.AcquireLeaseResponse(lease=lease_to_proto(lease))

    async def RenewLease(self, request, context):  # noqa: N802, ANN001
        lease = await self._core.renew_lease(request.worker_id, request.epoch)
        return pb.RenewLeaseResponse(lease=lease_to_proto(lease))

    async def RenewLeases(self, request, context):  # noqa: N802, ANN001
        renewals = await self._core.renew_leases(lease_refs_from_proto(request))
        return renewals_to_proto(renewals)

    async def ReleaseLease(self, request, context):  # noqa: N802, ANN001
        await self._core.release_lease(request.worker_id, request.epoch)
        return pb.ReleaseLeaseResponse()

    async def ChangeWorkerRole(self, request, context):  # noqa: N802, ANN001
        lease = await self._core.change_worker_role(
            request.worker_id, request.expected_epoch, role_from_proto(request.role))
        return pb.ChangeWorkerRoleResponse(lease=lease_to_proto(lease))

    async def ListWorkers(self, request, context):  # noqa: N802, ANN001
        leases = await self._core.list_workers()
        return pb.ListWorkersResponse(leases=[lease_to_proto(lease) for lease in leases])

    async def ReportStep(self, request, context):  # noqa: N802, ANN001
        record = step_record_from_json(request.step_json)
        outcome = await self._core.report_step(request.job_id, record,
                                               request.idempotency_key)
        if outcome is not StepAppend.REPEAT:
            export_step(request.job_id, record)
        return pb.ReportStepResponse()

    async def ReportJobDone(self, request, context):  # noqa: N802, ANN001
        await self._core.report_job_done(request.job_id, job_state_from_proto(request.state),
                                         request.message)
        return pb.ReportJobDoneResponse()
