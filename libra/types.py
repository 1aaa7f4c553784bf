"""Domain types shared by every service.

These dataclasses are what cores see. Generated protobuf messages never travel past
servicers and clients; ``libra.wire`` converts between the two.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NewType

JobId = NewType("JobId", str)
TrajectoryId = NewType("TrajectoryId", str)
GroupId = NewType("GroupId", str)
PromptId = NewType("PromptId", str)
WorkerId = NewType("WorkerId", str)
InstanceId = NewType("InstanceId", str)
PolicyVersion = NewType("PolicyVersion", int)


class ToolStatus(enum.Enum):
    """How a tool call ended: one axis of the causal signal."""

    SUCCESS = "success"
    FAILURE = "failure"
    TIMEOUT = "timeout"


class SizeClass(enum.Enum):
    """Payload size class of a tool return, by token thresholds."""

    SMALL = "small"
    MEDIUM = "medium"
    LARGE = "large"


@dataclass(frozen=True, slots=True)
class ToolReturnState:
    """The causal signal of one tool return: (tool type, size class, status).

    The scheduler's prefix tree is keyed by the string form ``"type:size:status"``.
    """

    tool_type: str
    size_class: SizeClass
    status: ToolStatus

    @property
    def key(self) -> str:
        """The prefix tree's key, ``"type:size:status"`` (also a Redis hash field)."""
        return f"{self.tool_type}:{self.size_class.value}:{self.status.value}"

    @classmethod
    def from_key(cls, key: str) -> ToolReturnState:
        """The state ``key`` names (the store reads it back from Redis)."""
        tool_type, size, status = key.rsplit(":", 2)
        return cls(tool_type, SizeClass(size), ToolStatus(status))


@dataclass(frozen=True, slots=True)
class SizeThresholds:
    """Token thresholds that split payloads into small / medium / large.

    A payload of at most ``small_max_tokens`` is small, at most ``medium_max_tokens`` medium,
    anything larger large (reference defaults 500 / 5,000).
    """

    small_max_tokens: int = 500
    medium_max_tokens: int = 5000

    def __post_init__(self) -> None:
        if not 0 <= self.small_max_tokens < self.medium_max_tokens:
            raise ValueError(
                "size thresholds must satisfy 0 <= small_max_tokens < medium_max_tokens, got "
                f"{self.small_max_tokens} / {self.medium_max_tokens}"
            )

    def classify(self, payload_tokens: int) -> SizeClass:
        """The size class of a payload of ``payload_tokens`` (the boundaries are inclusive)."""
        if payload_tokens <= self.small_max_tokens:
            return SizeClass.SMALL
        if payload_tokens <= self.medium_max_tokens:
            return SizeClass.MEDIUM
        return SizeClass.LARGE


@dataclass(frozen=True, slots=True)
class Bucket:
    """A group of rollout instances of one parallelism; ordered by ``max_tokens``."""

    name: str
    max_tokens: int
    tp_degree: int = 1
    max_batch_size: int = 8
    max_trajectories_per_instance: int = 16


@dataclass(slots=True)
class InstanceLoad:
    """A rollout instance as the placement policy sees it."""

    instance_id: InstanceId
    bucket: str
    active_trajectories: int
    is_live: bool = True
    labels: dict[str, str] = field(default_factory=dict)


class TrajectoryStatus(enum.Enum):
    """Where a trajectory is: generating or waiting on tools, ended with an answer, or failed."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(slots=True)
class Trajectory:
    """One trajectory: the task a rollout instance runs and, once finished, the record
    the trainer consumes. Token-level lists are aligned with ``token_ids``."""

    trajectory_id: TrajectoryId
    job_id: JobId
    group_id: GroupId
    prompt_id: PromptId
    prompt_text: str
    reference: str
    status: TrajectoryStatus = TrajectoryStatus.RUNNING
    failure_reason: str = ""
    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    num_turns: int = 0
    tool_states: list[ToolReturnState] = field(default_factory=list)
    tool_return_positions: list[int] = field(default_factory=list)
    instance_id: str = ""
    bucket: str = ""
    num_migrations: int = 0
    created_at_ms: int = 0
    finished_at_ms: int = 0
    final_text: str = ""
    attempt: int = 0
    # The last ``partial_turn_tokens`` of ``token_ids`` are a turn interrupted on the
    # instance that handed the trajectory over; the next instance resumes that turn.
    partial_turn_tokens: int = 0
    # The prompt as chat messages (JSON list) when the dataset row has messages; "" for a
    # text prompt. ``prompt_text`` then holds their joined contents (length, logs).
    prompt_messages_json: str = ""
    # Named parts of ``reward`` (a composite reward's components), set with it.
    reward_components: dict[str, float] = field(default_factory=dict)
    # The dataset row's metadata (task.metadata_field) as JSON; "" when none.
    metadata_json: str = ""
    # Held-out evaluation (libra/evaluation.py): the eval round this trajectory belongs
    # to (>= 1), or 0 for a training trajectory. Eval trajectories run the real path but
    # are never trained on and are counted apart from the training accounting.
    eval_round: int = 0

    @property
    def is_eval(self) -> bool:
        """A held-out evaluation trajectory: never trained on, counted apart."""
        return self.eval_round > 0

    @property
    def num_generated_tokens(self) -> int:
        """Tokens after the prompt (model and tool tokens)."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def min_version(self) -> int:
        """Oldest policy version among model-generated tokens (-1 if none)."""
        versions = [v for v, m in zip(self.token_versions, self.loss_mask, strict=True) if m]
        return min(versions) if versions else -1

    def check_aligned(self) -> str | None:
        """A reason string when token-level arrays disagree in length, else None."""
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "token_versions"):
            if len(getattr(self, name)) != n:
                return f"{name} has {len(getattr(self, name))} entries, token_ids has {n}"
        if not 0 <= self.num_prompt_tokens <= n:
            return f"num_prompt_tokens {self.num_prompt_tokens} outside [0, {n}]"
        if not 0 <= self.partial_turn_tokens <= n - self.num_prompt_tokens:
            return (f"partial_turn_tokens {self.partial_turn_tokens} outside "
                    f"[0, {n - self.num_prompt_tokens}]")
        return None


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


class DecisionAction(enum.Enum):
    """At a tool return: keep the trajectory on its instance, or move it elsewhere."""

    STAY = "stay"
    MOVE = "move"


@dataclass(frozen=True, slots=True)
class PlacementDecision:
    """The scheduler's answer at a tool return."""

    action: DecisionAction
    target_bucket: str = ""
    target_instance: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call returned, with its causal signal."""

    status: ToolStatus
    output: str
    error: str
    payload_tokens: int
    latency_ms: int
    state: ToolReturnState
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """The tool ran and returned normally (an error or timeout is not ok)."""
        return self.status is ToolStatus.SUCCESS


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    """Where the current policy version's weights are (published by the trainer)."""

    version: int
    weights_path: str
    sha256: str
    model_dir: str
    published_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class TranscriptToolCall:
    """A well-formed tool call parsed from an assistant turn."""

    name: str
    arguments_json: str = "{}"


@dataclass(frozen=True, slots=True)
class TranscriptMessage:
    """One message of a finished trajectory as a reward reads it."""

    role: str
    """``system``, ``user``, ``assistant`` or ``tool``."""
    content: str
    tool_calls: tuple[TranscriptToolCall, ...] = ()
    """assistant: the well-formed calls of the turn."""
    name: str = ""
    """tool: the tool that answered (``invalid``: the call never reached a tool)."""
    tool_status: str = ""
    """tool: ``success``, ``failure`` or ``timeout``."""


@dataclass(frozen=True, slots=True)
class ScoreInput:
    """A finished trajectory to score (rollout -> tool gateway ``Score``)."""

    trajectory_id: str
    reward: str
    final_text: str
    reference: str = ""
    messages: tuple[TranscriptMessage, ...] = ()
    metadata_json: str = ""
    """The dataset row's metadata as JSON ("" when none)."""
    num_turns: int = 0
    options_json: str = ""
    """Job-level reward settings (``RewardSpec.options()``) as JSON."""


@dataclass(frozen=True, slots=True)
class ScoreOutput:
    """The reward of a trajectory plus its named parts."""

    reward: float
    components: dict[str, float] = field(default_factory=dict)
