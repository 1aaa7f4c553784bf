"""Messages of the elastic gradient channel, as plain data (pure; no grpc, no torch).

The channel is one bidirectional stream between the core trainer and a lent rollout
worker (a *hybrid*). The hybrid opens it with a :class:`Hello` and then:

1. receives a :class:`Snapshot` (the core's model + optimizer + RNG after some step),
   loads it, and applies every :class:`Update` (merged gradient of a later step) it is
   sent, acknowledging each with :class:`Applied` - it contributes nothing meanwhile;
2. on an :class:`Offer` it takes a hybrid-training epoch (compare-and-set on its lease)
   and answers :class:`Activated`; the core counts it from the next step boundary;
3. per step it receives a :class:`SliceTask` and answers a :class:`GradientPayload`;
   the core merges payloads whose step, policy version and epoch match its own, and
   sends the merged gradient back as an :class:`Update` (lockstep);
4. a :class:`Detach` (or the stream's end) ends it.

Gradients travel as safetensors bytes (``data``); the wire layer chunks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libra.training.samples import TrainSample

# -- hybrid -> core ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """Opens the stream: the hybrid's job, worker id, lease epoch and lend generation."""

    job_id: str
    worker_id: str
    epoch: int
    generation: int


@dataclass(frozen=True, slots=True)
class Applied:
    """The hybrid's state now equals the core's after ``step``."""

    step: int
    checksum: str = ""


@dataclass(frozen=True, slots=True)
class Activated:
    """The hybrid holds hybrid-training epoch ``epoch``; its state is at ``step``."""

    epoch: int
    step: int


@dataclass(frozen=True, slots=True)
class GradientPayload:
    """A slice's gradient (safetensors bytes) for ``step``, with its token-mean metrics;
    ``non_finite`` when the slice's loss or gradient was not finite."""

    step: int
    policy_version: int
    epoch: int
    slice_id: int
    data: bytes
    metrics: dict[str, float] = field(default_factory=dict)
    non_finite: bool = False


HybridMessage = Hello | Applied | Activated | GradientPayload

# -- core -> hybrid ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The core's state after ``step`` (model, optimizer, RNG in ``directory``) for a
    joining hybrid to load, with the job's spec."""

    directory: str
    step: int
    policy_version: int
    spec_json: str


@dataclass(frozen=True, slots=True)
class Update:
    """The merged gradient that took the core from ``step - 1`` to ``step``."""

    step: int
    data: bytes
    skipped: bool
    lr: float


@dataclass(frozen=True, slots=True)
class Offer:
    """The core invites the hybrid to take a hybrid-training epoch from ``step`` on."""

    step: int


@dataclass(frozen=True, slots=True)
class SliceTask:
    """Compute slice ``slice_id`` of ``step``'s gradient: ``samples``' token-mean loss times
    ``scale`` (slice tokens / batch tokens)."""

    step: int
    policy_version: int
    epoch: int
    slice_id: int
    scale: float
    samples: list[TrainSample]


@dataclass(frozen=True, slots=True)
class Detach:
    """The core ends the hybrid's part (``reason`` says why)."""

    reason: str


CoreMessage = Snapshot | Update | Offer | SliceTask | Detach

