"""What each service offers its callers, as typed Protocols and the values they return.

The gRPC clients beside this module (``coordinator.py``, ``rollout.py``, ``scheduler.py``,
``toolgateway.py``) implement these, and so do the in-process clients of each service
(``services/<name>/inprocess.py``). Cores and their parts type their collaborators with
this module, which imports no grpc and no generated protobuf code: that keeps the cores
pure (the import contract in pyproject.toml), not just free of those imports at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from libra import types as t


class CoordinatorApi(Protocol):
    async def acquire_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                            address: str, ttl_ms: int) -> t.Lease: ...

    async def renew_lease(self, worker_id: str, epoch: int) -> t.Lease: ...

    async def release_lease(self, worker_id: str, epoch: int) -> None: ...

    async def change_worker_role(self, worker_id: str, expected_epoch: int,
                                 role: t.WorkerRole) -> t.Lease: ...

    async def report_step(self, job_id: str, record: t.StepRecord | dict[str, Any],
                          idempotency_key: str = "") -> None:
        """Store a step record (a raw dict is sent as it is); a repeat with the same
        key is recognised, not stored twice (so it is safe to retry)."""
        ...

    async def report_job_done(self, job_id: str, state: t.JobState, message: str) -> None: ...


class CoordinatorJobApi(Protocol):
    """The public job API (``libra`` CLI, REST's twin): gRPC or in process
    (``services/coordinator/inprocess.py``)."""

    async def create_job(self, spec: str, spec_format: str = "toml",
                         priority: int = 0) -> t.Job: ...

    async def resume_job(self, job_id: str, priority: int = 0) -> t.Job: ...

    async def get_job(self, job_id: str) -> tuple[t.Job, list[dict], dict]: ...

    async def get_job_events(self, job_id: str) -> list[dict[str, Any]]: ...

    async def list_jobs(self) -> list[t.Job]: ...

    async def cancel_job(self, job_id: str, reason: str = "") -> t.Job: ...

    async def list_workers(self) -> list[t.Lease]: ...


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """What a rollout instance reports about itself."""

    instance_id: str
    bucket: str
    num_active_trajectories: int
    policy_version: int
    num_tokens_generated: int
    job_id: str
    role: str
    hybrid_phase: str


@dataclass(frozen=True, slots=True)
class LendResult:
    """The lease after the role change to hybrid-joining, and what was handed back."""

    lease: t.Lease
    num_handed_back: int


class RolloutApi(Protocol):
    """What callers need from a rollout instance."""

    async def lend(self, job_id: str, expected_epoch: int, generation: int,
                   trainer_address: str, *, timeout_s: float | None = None) -> LendResult: ...

    async def reclaim(self, generation: int, reason: str, *,
                      timeout_s: float | None = None) -> t.Lease: ...

    async def get_instance_status(self) -> InstanceStatus: ...


class SchedulerClientApi(Protocol):
    """The scheduler as its callers see it: ``GrpcSchedulerClient`` over gRPC, and
    ``services.scheduler.inprocess.InProcessSchedulerClient`` in one process."""

    async def start_job(self, job_id: str, resume: bool = False) -> None: ...

    async def stop_job(self, job_id: str) -> None: ...

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str, lease_epoch: int,
                                 needs_answer: bool = True) -> t.PlacementDecision: ...

    async def report_finished(self, job_id: str, trajectory_id: str, total_tokens: int,
                              status: t.TrajectoryStatus, instance_id: str,
                              lease_epoch: int) -> None: ...

    async def stats(self, job_id: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class ToolGatewayApi(Protocol):
    async def execute(self, trajectory_id: str, call_id: str, tool: str, args: dict[str, Any],
                      deadline_ms: int, options: dict[str, Any] | None = None
                      ) -> t.ToolResult: ...

    async def score(self, request: t.ScoreInput, timeout_s: float | None = None
                    ) -> t.ScoreOutput: ...
