"""Domain types shared by every service.

These dataclasses are what cores see. Generated protobuf messages never travel past
servicers and clients; ``libra.wire`` converts between the two. This module holds the
trajectory and what happens to it (tool returns, placement decisions); the ids, the job
and worker records, and the scoring transcript live in ``libra.id_types``,
``libra.job_types`` and ``libra.score_types`` and are importable from here as well.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from libra.id_types import GroupId as GroupId
from libra.id_types import InstanceId as InstanceId
from libra.id_types import JobId as JobId
from libra.id_types import PolicyVersion as PolicyVersion
from libra.id_types import PromptId as PromptId
from libra.id_types import TrajectoryId as TrajectoryId
from libra.id_types import WorkerId as WorkerId
from libra.job_types import TRAINER_WORKING_PHASES as TRAINER_WORKING_PHASES
from libra.job_types import InstanceStatus as InstanceStatus
from libra.job_types import Job as Job
from libra.job_types import JobState as JobState
from libra.job_types import Lease as Lease
from libra.job_types import LeaseRef as LeaseRef
from libra.job_types import LeaseRenewal as LeaseRenewal
from libra.job_types import LeaseSummary as LeaseSummary
from libra.job_types import LendResult as LendResult
from libra.job_types import PolicyInfo as PolicyInfo
from libra.job_types import RenewOutcome as RenewOutcome
from libra.job_types import StepRecord as StepRecord
from libra.job_types import TrainerStatus as TrainerStatus
from libra.job_types import WorkerRole as WorkerRole
from libra.score_types import ScoreInput as ScoreInput
from libra.score_types import ScoreOutput as ScoreOutput
from libra.score_types import TranscriptMessage as TranscriptMessage
from libra.score_types import TranscriptToolCall as TranscriptToolCall


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
    """A group of rollout instances of one parallelism; ordered by ``max_tokens``.

    The one bucket type: the job spec's ``[[layout.buckets]]`` entries are built as
    these (``libra.jobspec.LayoutSpec.buckets``, checked there), and the scheduler's
    layout, the placement policies and the simulator take them as they are.
    """

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
class Segment:
    """An earlier training sequence of a trajectory: what an external agent's episode
    had sampled before the program rewrote its history (libra/episodes.py). It is trained
    as its own sequence, with the trajectory's group and reward. Lists are aligned."""

    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)


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
    # The trajectory's W3C trace context (libra/tracing.py), set at admission; "" when
    # not traced. Every service records its spans under it.
    traceparent: str = ""
    # Earlier training sequences, oldest first (an external agent that rewrote its
    # history); ``token_ids`` and its aligned lists are the last sequence. One trajectory
    # still counts once (produced, trained, dropped); each segment is one more sequence.
    segments: list[Segment] = field(default_factory=list)

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
        versions = [v for seq in (*self.segments, self)
                    for v, m in zip(seq.token_versions, seq.loss_mask, strict=True) if m]
        return min(versions) if versions else -1

    def check_aligned(self) -> str | None:
        """A reason string when token-level arrays disagree in length, else None."""
        for index, seq in enumerate((*self.segments, self)):
            where = f"segments[{index}]." if index < len(self.segments) else ""
            n = len(seq.token_ids)
            for name in ("loss_mask", "logprobs", "token_versions"):
                if len(getattr(seq, name)) != n:
                    return f"{where}{name} has {len(getattr(seq, name))} entries, token_ids has {n}"
            if not 0 <= seq.num_prompt_tokens <= n:
                return f"{where}num_prompt_tokens {seq.num_prompt_tokens} outside [0, {n}]"
        n = len(self.token_ids)
        if not 0 <= self.partial_turn_tokens <= n - self.num_prompt_tokens:
            return (f"partial_turn_tokens {self.partial_turn_tokens} outside "
                    f"[0, {n - self.num_prompt_tokens}]")
        return None


@dataclass(frozen=True, slots=True)
class ToolReturnReport:
    """One tool return reported by a rollout instance to the scheduler (codec:
    ``libra.wire.scheduler``)."""

    job_id: str
    trajectory_id: str
    state: ToolReturnState
    tokens_so_far: int


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
    """What a tool call returned, with its causal signal: the one type for a tool call's
    outcome, made by the gateway core and carried unchanged by its servicer, its clients
    (gRPC and in-process) and the rollout (codec: ``libra.wire.toolgateway``).

    ``call_id``, ``tool`` and ``num_attempts`` are what the gateway knew when it answered;
    the wire carries neither ``num_attempts`` nor the ids back (the caller holds them), so
    a result read from the wire has ``num_attempts`` 1 and the ids the caller gave.
    """

    status: ToolStatus
    output: str
    error: str
    payload_tokens: int
    latency_ms: int
    state: ToolReturnState
    truncated: bool = False
    call_id: str = ""
    tool: str = ""
    num_attempts: int = 1

    @property
    def ok(self) -> bool:
        """The tool ran and returned normally (an error or timeout is not ok)."""
        return self.status is ToolStatus.SUCCESS

    @property
    def size_class(self) -> SizeClass:
        """The payload's size class (part of ``state``)."""
        return self.state.size_class
