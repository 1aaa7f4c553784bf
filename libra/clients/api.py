"""What each service offers its callers, as typed Protocols and the values they return.

The gRPC clients beside this module (``coordinator.py``, ``rollout.py``, ``scheduler.py``,
``toolgateway.py``) implement these, and so do the in-process clients of each service
(``services/<name>/inprocess.py``). Cores and their parts type their collaborators with
this module, which imports no grpc and no generated protobuf code: that keeps the cores
pure (the import contract in pyproject.toml), not just free of those imports at run time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from libra import types as t
from libra.types import InstanceStatus as InstanceStatus  # re-exported
from libra.types import LendResult as LendResult  # re-exported
from libra.weight_sync import ModelFile, WeightChunk


class CoordinatorApi(Protocol):
    """The coordinator as workers see it: leases with fencing epochs, role changes,
    step and job-end reports (rollout instances and the trainer call these)."""

    async def acquire_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                            address: str, ttl_ms: int) -> t.Lease:
        """Register a worker: a lease for ``ttl_ms`` whose new epoch fences out any
        older holder of the same worker id."""
        ...

    async def renew_lease(self, worker_id: str, epoch: int, *,
                          timeout_s: float | None = None) -> t.Lease:
        """Extend the lease held at ``epoch``; fails once it expired or was granted anew,
        which tells a zombie worker to stop. ``timeout_s``: the call's deadline (None:
        the client's default); DeadlineExceeded past it."""
        ...

    async def renew_leases(self, refs: Sequence[t.LeaseRef]) -> list[t.LeaseRenewal]:
        """Renew every lease a process holds at once: one answer per lease, in order; a
        lost lease is an answer (GONE or FENCED; ``lease_or_raise`` raises LeaseLost),
        so each holder learns its own fate and the others are still renewed."""
        ...

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        """Give the lease up on a clean exit, so peers need not wait for its TTL."""
        ...

    async def change_worker_role(self, worker_id: str, expected_epoch: int,
                                 role: t.WorkerRole) -> t.Lease:
        """Compare-and-set the worker's role (elastic lending): applied only while the
        lease is still at ``expected_epoch``."""
        ...

    async def report_step(self, job_id: str, record: t.StepRecord | dict[str, Any],
                          idempotency_key: str = "") -> None:
        """Store a step record (a raw dict is sent as it is); a repeat with the same
        key is recognised, not stored twice (so it is safe to retry)."""
        ...

    async def report_job_done(self, job_id: str, state: t.JobState, message: str) -> None:
        """The trainer's word that the job ended (succeeded or failed, and why)."""
        ...


class CoordinatorJobApi(Protocol):
    """The public job API (``libra`` CLI, REST's twin): gRPC or in process
    (``services/coordinator/inprocess.py``)."""

    async def create_job(self, spec: str, spec_format: str = "toml",
                         priority: int = 0) -> t.Job:
        """Validate a job spec completely and start the job, or queue it behind the
        active one."""
        ...

    async def resume_job(self, job_id: str, priority: int = 0) -> t.Job:
        """Start an ended job again from its last checkpoint."""
        ...

    async def get_job(self, job_id: str) -> tuple[t.Job, list[dict], dict]:
        """The job, its step records (oldest first) and its counters."""
        ...

    async def get_job_events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's events (plans, joins, releases, failures), oldest first."""
        ...

    async def list_jobs(self) -> list[t.Job]:
        """Every job the coordinator still holds, whatever its state, as a summary:
        ``spec_json`` empty (``get_job`` has the spec)."""
        ...

    async def list_jobs_page(self, page_size: int = 0,
                             page_token: str = "") -> tuple[list[t.Job], str]:
        """One page of job summaries, oldest first, and the next page's token ("" after
        the last); ``page_size`` 0 = 100, at most 500."""
        ...

    async def cancel_job(self, job_id: str, reason: str = "") -> t.Job:
        """Stop the job on the trainer and scheduler and record ``reason``."""
        ...

    async def list_workers(self) -> list[t.Lease]:
        """The leases held now: which workers are alive, in which role and bucket."""
        ...


class RolloutApi(Protocol):
    """What callers need from a rollout instance."""

    async def lend(self, job_id: str, expected_epoch: int, generation: int,
                   trainer_address: str, *, timeout_s: float | None = None) -> LendResult:
        """Lend the instance to training: stop sampling, hand its trajectories back and
        join the trainer's gradient channel; a newer ``generation`` makes this one stale."""
        ...

    async def reclaim(self, generation: int, reason: str, *,
                      timeout_s: float | None = None) -> t.Lease:
        """Take a lent instance back to rollout (cancel a pending join or leave an
        active one)."""
        ...

    async def get_instance_status(self) -> InstanceStatus:
        """What the instance is doing now (for the planner and ``libra status``)."""
        ...


class SchedulerClientApi(Protocol):
    """The scheduler as its callers see it: ``GrpcSchedulerClient`` over gRPC, and
    ``services.scheduler.inprocess.InProcessSchedulerClient`` in one process."""

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        """Begin admitting and placing the job's trajectories (``resume``: it ran
        before, so its counters continue)."""
        ...

    async def stop_job(self, job_id: str) -> None:
        """Stop admitting and placing the job's work (what the store holds stays)."""
        ...

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str, lease_epoch: int,
                                 needs_answer: bool = True) -> t.PlacementDecision:
        """A tool returned: the scheduler decides whether the trajectory stays on this
        instance or moves (the causal signal is ``state``)."""
        ...

    async def report_finished(self, job_id: str, trajectory_id: str, total_tokens: int,
                              status: t.TrajectoryStatus, instance_id: str,
                              lease_epoch: int) -> None:
        """A trajectory ended on this instance: its slot is free for new work."""
        ...

    async def stats(self, job_id: str) -> dict[str, Any]:
        """The job's placement figures: policy, pending work, decisions, migrations."""
        ...

    async def close(self) -> None:
        """Flush what is queued and end the report stream."""
        ...


class ToolGatewayApi(Protocol):
    """The tool gateway as the rollout sees it: run one tool call, score one trajectory."""

    async def execute(self, trajectory_id: str, call_id: str, tool: str, args: dict[str, Any],
                      deadline_ms: int, options: dict[str, Any] | None = None
                      ) -> t.ToolResult:
        """Run one tool call in the sandbox within ``deadline_ms``; the result carries the
        return's classification the scheduler decides on."""
        ...

    async def score(self, request: t.ScoreInput, timeout_s: float | None = None
                    ) -> t.ScoreOutput:
        """Score a finished trajectory with the job's reward."""
        ...


class WeightApi(Protocol):
    """The trainer's published versions, as a rollout's weight fetcher reads them
    (``libra/clients/weights.py``)."""

    async def get_manifest(self, job_id: str, version: int) -> bytes:
        """The exact bytes of ``version``'s manifest (NotFound when not published)."""
        ...

    def fetch_chunks(self, job_id: str, version: int,
                     from_chunk: int) -> AsyncIterator[WeightChunk]:
        """The chunks of the weights file from ``from_chunk`` on, in order."""
        ...

    async def list_model_files(self, job_id: str) -> list[ModelFile]:
        """The files of the job's model directory (NotFound when it has none)."""
        ...

    def fetch_model_file(self, job_id: str, name: str) -> AsyncIterator[WeightChunk]:
        """One file of the job's model directory, in chunks."""
        ...
