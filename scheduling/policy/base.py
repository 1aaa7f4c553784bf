"""The interface every placement policy implements, and the values it returns.

Call flow (scheduler service or simulator):

1. ``begin(trajectory, instances)`` when a trajectory is admitted -> ``Placement``.
   If ``placement.is_placed`` is false, nothing changed: keep the trajectory queued
   and call ``begin`` again later.
2. ``on_tool_return(trajectory_id, state, tokens_so_far, instances)`` after every tool
   return, before the next turn is sent -> ``Decision`` (stay or move).
3. ``finish(trajectory_id, total_tokens)`` (or ``abort``) when it ends -> ``Release``.
4. ``on_step_end(step)`` when a training step ends.

Load accounting: the caller owns the per-instance load counters (Redis in the
service, shared by scheduler replicas). The policy only reads them, via
``instances``, and reports the change it implies in ``load_deltas``; the caller
applies each ``(instance_id, delta)`` pair (``HINCRBY``) after the call returns.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from libra.types import GroupId, InstanceId, InstanceLoad, PromptId, ToolReturnState, TrajectoryId
from scheduling.policy.routing import RouteKind

# Current instance loads: a snapshot, or a callable the policy calls only when it
# actually needs to route (most tool returns are stays, which then cost no load read).
InstanceSource = Sequence[InstanceLoad] | Callable[[], Sequence[InstanceLoad]]
LoadDeltas = tuple[tuple[InstanceId, int], ...]


def resolve_instances(instances: InstanceSource) -> Sequence[InstanceLoad]:
    """Return the snapshot behind an ``InstanceSource``."""
    return instances() if callable(instances) else instances


class Action(enum.StrEnum):
    """What to do with a trajectory at a tool return."""

    STAY = "stay"
    MOVE = "move"


class Reason(enum.StrEnum):
    """Why a placement or decision came out the way it did (also a stats key)."""

    # Placements.
    SHORTEST_BUCKET = "shortest_bucket"
    PREDICTED = "predicted"
    LEAST_LOADED = "least_loaded"
    INPUT_LENGTH = "input_length"
    HISTORY = "history"
    SCOUT = "scout"
    FOLLOW_SCOUT = "follow_scout"
    WAIT_FOR_SCOUT = "wait_for_scout"
    # Decisions.
    STAY = "stay"
    MOVE = "move"
    UNSEEN = "unseen"
    DISAGREE = "disagree"
    DISAGREE_CLAMP = "disagree_clamp"
    ALREADY_IN_TARGET = "already_in_target"
    CONTEXT_LENGTH = "context_length"
    DEMOTION = "demotion"
    # Either.
    NO_INSTANCE_FALLBACK = "no_instance_fallback"
    NO_CAPACITY = "no_capacity"


@dataclass(frozen=True, slots=True)
class TrajectoryDescriptor:
    """What a policy knows about a trajectory when it is admitted."""

    trajectory_id: TrajectoryId
    prompt_id: PromptId
    group_id: GroupId | None = None
    input_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Result of ``begin``.

    Attributes:
        trajectory_id: The trajectory.
        instance_id: Where it is pinned, or ``None`` if not placed (keep it queued).
        bucket: Bucket of ``instance_id`` (``None`` if not placed).
        target_bucket: The bucket the policy wanted (``None`` if it was told to wait).
        reason: Why.
        route_kind: Preferred or fallback route (``None`` if not placed).
    """

    trajectory_id: TrajectoryId
    instance_id: InstanceId | None
    bucket: str | None
    target_bucket: str | None
    reason: Reason
    route_kind: RouteKind | None = None

    @property
    def is_placed(self) -> bool:
        """Whether the trajectory now holds a slot on ``instance_id``."""
        return self.instance_id is not None

    @property
    def load_deltas(self) -> LoadDeltas:
        """Load changes the caller must apply: ``+1`` on the chosen instance."""
        return ((self.instance_id, 1),) if self.instance_id is not None else ()


@dataclass(frozen=True, slots=True)
class Decision:
    """Result of ``on_tool_return``.

    ``to_*`` is where the trajectory is pinned after the decision; it equals
    ``from_*`` when the action is ``STAY``.

    Attributes:
        trajectory_id: The trajectory.
        action: Stay or move.
        reason: Why.
        from_bucket: Bucket before the decision.
        from_instance_id: Instance before the decision.
        to_bucket: Bucket after the decision.
        to_instance_id: Instance after the decision (send the next turn here).
        target_bucket: The bucket the evidence pointed to, or ``None`` if none.
    """

    trajectory_id: TrajectoryId
    action: Action
    reason: Reason
    from_bucket: str
    from_instance_id: InstanceId
    to_bucket: str
    to_instance_id: InstanceId
    target_bucket: str | None = None

    @property
    def is_move(self) -> bool:
        """Whether the trajectory was re-pinned."""
        return self.action is Action.MOVE

    @property
    def load_deltas(self) -> LoadDeltas:
        """``-1`` on the old instance and ``+1`` on the new one for a move, else nothing."""
        if not self.is_move:
            return ()
        return ((self.from_instance_id, -1), (self.to_instance_id, 1))


@dataclass(frozen=True, slots=True)
class Release:
    """Result of ``finish`` / ``abort``: the slot the trajectory gives back."""

    trajectory_id: TrajectoryId
    instance_id: InstanceId
    bucket: str

    @property
    def load_deltas(self) -> LoadDeltas:
        """``-1`` on the instance the trajectory was pinned to."""
        return ((self.instance_id, -1),)


class PlacementPolicy(Protocol):
    """The interface shared by C-MLFQ and the baselines. Synchronous and deterministic."""

    name: str

    def begin(self, trajectory: TrajectoryDescriptor, instances: InstanceSource) -> Placement:
        """Place a new trajectory. Raises ``DuplicateTrajectory`` if already placed."""
        ...

    def on_tool_return(
        self,
        trajectory_id: TrajectoryId,
        state: ToolReturnState,
        tokens_so_far: int,
        instances: InstanceSource,
    ) -> Decision:
        """Record a tool return and decide stay/move. Raises ``UnknownTrajectory``."""
        ...

    def finish(self, trajectory_id: TrajectoryId, total_tokens: int) -> Release:
        """Release a finished trajectory and learn from it. Raises ``UnknownTrajectory``."""
        ...

    def abort(self, trajectory_id: TrajectoryId) -> Release:
        """Release a cancelled trajectory without learning. Raises ``UnknownTrajectory``."""
        ...

    def on_step_end(self, step: int) -> None:
        """A training step ended (periodic rebuild, pruning, snapshot)."""
        ...

    def priority(self, trajectory_id: TrajectoryId) -> int:
        """Dispatch priority (higher first); 0 for unknown trajectories."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters for metrics and reports."""
        ...
