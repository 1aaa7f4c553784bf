"""Jobs, workers and the trainer as the coordinator stores and reports them.

Worker roles and leases (what the coordinator grants and the scheduler fences with),
the job record and its lifecycle, the trainer's status and the step record it reports,
and where the published policy's weights are. Importable from ``libra.types`` too,
where a newcomer starts reading.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from libra.errors import LeaseLost
from libra.id_types import JobId, WorkerId


class WorkerRole(enum.Enum):
    """What a worker's lease lets it do; a hybrid rollout can be lent to training."""

    CORE_ROLLOUT = "core-rollout"
    CORE_TRAINING = "core-training"
    HYBRID_ROLLOUT = "hybrid-rollout"
    HYBRID_JOINING = "hybrid-joining"
    HYBRID_TRAINING = "hybrid-training"
    SERVICE = "service"


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's lease as the coordinator grants it (Redis hash codec:
    ``libra.redis_fields``; ``expires_at_ms`` comes from the key's TTL, not a field)."""

    worker_id: WorkerId
    role: WorkerRole
    bucket: str
    address: str
    epoch: int
    expires_at_ms: int
    ttl_ms: int


class RenewOutcome(enum.Enum):
    """One lease's fate in a batched renewal (``RenewLeases``)."""

    RENEWED = "renewed"
    GONE = "gone"  # expired or released: acquire a new one
    FENCED = "fenced"  # granted anew at a newer epoch: another holder has it


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """A held lease as its holder names it in a batched renewal."""

    worker_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class LeaseRenewal:
    """One lease's answer in a batched renewal, in the request's order: a lost lease is
    an answer, not an error, so the other leases of the batch are still renewed and each
    holder learns its own fate. ``lease`` is the renewed lease (RENEWED only)."""

    worker_id: str
    epoch: int  # the epoch the holder asked to renew
    outcome: RenewOutcome
    lease: Lease | None = None

    def lease_or_raise(self) -> Lease:
        """The renewed lease; LeaseLost (as ``RenewLease`` raises) when it was lost."""
        if self.lease is None or self.outcome is not RenewOutcome.RENEWED:
            if self.outcome is RenewOutcome.FENCED:
                raise LeaseLost(f"lease of {self.worker_id} is held at a newer epoch than "
                                f"{self.epoch}")
            raise LeaseLost(f"lease of {self.worker_id} expired; acquire a new one")
        return self.lease


@dataclass(frozen=True, slots=True)
class LeaseSummary:
    """What the scheduler reads of a live lease to place and to fence: the worker's
    role (a ``WorkerRole`` value), bucket and epoch."""

    worker_id: str
    role: str
    bucket: str
    epoch: int


class JobState(enum.Enum):
    """A job's lifecycle: pending in the queue, running, then one terminal state."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """Succeeded, failed or cancelled: nothing runs for the job any more."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(slots=True)
class Job:
    """A job as the coordinator stores and reports it (the spec stays JSON here; it is
    parsed once where it is used, ``libra.jobspec``)."""

    job_id: JobId
    name: str
    state: JobState
    spec_json: str
    created_at_ms: int
    updated_at_ms: int
    message: str = ""
    step: int = 0
    policy_version: int = 0
    run_dir: str = ""
    priority: int = 0
    """Queue priority: higher starts first, FIFO among equals."""
    queue_position: int = 0
    """1 = next to start, 2 = after it, ...; 0 = not queued (read from the queue, not
    stored with the job)."""
    num_resumes: int = 0
    """Times the job was restarted from its newest checkpoint (``libra resume``)."""


# The trainer's phases (GetTrainerStatus): idle before any job and after a stop; warmup
# and training while it works on ``job_id``; done and failed once that job ended there.
TRAINER_WORKING_PHASES = ("warmup", "training")


@dataclass(frozen=True, slots=True)
class TrainerStatus:
    """What the trainer is doing (the coordinator's reconciliation asks for it)."""

    job_id: str
    phase: str
    step: int = 0
    policy_version: int = -1
    message: str = ""
    """How the job ended there (with phase done or failed)."""

    def is_working_on(self, job_id: str) -> bool:
        """True while the trainer is busy with ``job_id`` (warm start or training)."""
        return self.job_id == job_id and self.phase in TRAINER_WORKING_PHASES


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One training step as the trainer reports it (``step_json``; report.json's ``steps``).

    Only ``step`` is required: a field left None was not reported and is left out of the
    JSON (records of older runs lack some; publish and checkpoint times only appear on
    steps that did those). ``metrics`` are the backend's numbers (loss, grad_norm, ...),
    flat beside the named fields in the JSON. Codec: ``libra.wire.step_record``.
    """

    step: int
    policy_version: int | None = None
    reward_mean: float | None = None
    num_trajectories: int | None = None
    num_sequences: int | None = None
    """Sequences trained: num_trajectories plus the earlier segments of split episodes."""
    rollout_s: float | None = None
    """Waiting for complete, fresh groups."""
    train_s: float | None = None
    wall_s: float | None = None
    dropped_stale: int | None = None
    dropped_failed: int | None = None
    reward_components: dict[str, float] | None = None
    turns_mean: float | None = None
    tokens_mean: float | None = None
    hybrid_workers: int | None = None
    hybrid_joining: int | None = None
    migrations: int | None = None
    bucket_occupancy: dict[str, int] | None = None
    """Bucket -> trajectories the scheduler placed there during the step."""
    publish_s: float | None = None
    weights_pruned: int | None = None
    checkpoint_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    """Where the current policy version's weights are (published by the trainer)."""

    version: int
    weights_path: str
    sha256: str
    model_dir: str
    published_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """What a rollout instance reports about itself (GetInstanceStatus; codec:
    ``libra.wire.rollout``). The profiles are JSON as the instance timed them: its engine
    calls (empty where none are logged) and its loop's costs."""

    instance_id: str
    bucket: str
    num_active_trajectories: int
    policy_version: int
    num_tokens_generated: int
    job_id: str
    role: str
    hybrid_phase: str
    engine_profile_json: str = ""
    loop_profile_json: str = ""


@dataclass(frozen=True, slots=True)
class LendResult:
    """The lease after the role change to hybrid-joining, and what was handed back."""

    lease: Lease
    num_handed_back: int
