"""Shared machinery of every policy: pinned trajectories, load deltas, counters.

A trajectory is pinned to one instance from ``begin`` until ``finish``/``abort`` and
holds one unit of that instance's load, also while it waits on a tool. Subclasses only
choose buckets (``_place``, ``_decide``) and learn from finished work (``_learn``);
this class keeps the per-trajectory record in the store and turns bucket choices into
instances through ``routing``.
"""

from __future__ import annotations

import collections
from typing import Any

from libra.types import InstanceId, ToolReturnState, TrajectoryId
from scheduling.policy.base import (
    Action,
    Decision,
    InstanceSource,
    Placement,
    Reason,
    Release,
    TrajectoryDescriptor,
    resolve_instances,
)
from scheduling.policy.errors import DuplicateTrajectory, UnknownTrajectory
from scheduling.policy.layout import BucketLayout
from scheduling.policy.routing import RoundRobinCursor, RouteKind, RouteResult, route
from scheduling.policy.store import PolicyStore, TrajectoryRecord

# Counter names per reason / route kind, built once: every placement and tool return
# counts one, and formatting an enum's value each time was a visible share of the
# simulator's planner twin (the names are unchanged).
_DECISION_COUNTERS = {reason: f"decision_{reason.value}" for reason in Reason}
_PLACEMENT_COUNTERS = {reason: f"placement_{reason.value}" for reason in Reason}
_ROUTE_COUNTERS = {kind: f"placements_{kind.value}" for kind in RouteKind}


class PinningPolicy:
    """Base class implementing ``PlacementPolicy`` around three hooks.

    Args:
        layout: Bucket layout.
        store: Where per-trajectory state lives.
        enable_fallback: Let routing use other buckets when the wanted one is full.
    """

    name = "pinning"

    def __init__(self, layout: BucketLayout, store: PolicyStore, *, enable_fallback: bool) -> None:
        self._layout = layout
        self._store = store
        self._enable_fallback = enable_fallback
        self._cursor = RoundRobinCursor()
        self._counters: collections.Counter[str] = collections.Counter()

    @property
    def layout(self) -> BucketLayout:
        """The bucket layout this policy routes into."""
        return self._layout

    # Public interface (PlacementPolicy).

    def begin(self, trajectory: TrajectoryDescriptor, instances: InstanceSource) -> Placement:
        """Place a new trajectory; see ``base.PlacementPolicy.begin``."""
        if self._store.get_trajectory(trajectory.trajectory_id) is not None:
            raise DuplicateTrajectory(trajectory.trajectory_id)
        placement = self._place(trajectory, instances)
        if placement.instance_id is not None and placement.bucket is not None:
            record = TrajectoryRecord(
                trajectory_id=trajectory.trajectory_id,
                prompt_id=trajectory.prompt_id,
                group_id=trajectory.group_id or "",
                input_tokens=trajectory.input_tokens,
                bucket=placement.bucket,
                instance_id=placement.instance_id,
            )
            self._store.put_trajectory(trajectory.trajectory_id, record.to_dict())
        self._count_placement(placement)
        return placement

    def on_tool_return(
        self,
        trajectory_id: TrajectoryId,
        state: ToolReturnState,
        tokens_so_far: int,
        instances: InstanceSource,
    ) -> Decision:
        """Record a tool return and decide; see ``base.PlacementPolicy.on_tool_return``."""
        record = self._load(trajectory_id)
        record.path_keys.append(state.key)
        record.positions_tokens.append(tokens_so_far)
        decision = self._decide(record, tokens_so_far, instances)
        if decision.is_move:
            record.bucket = decision.to_bucket
            record.instance_id = decision.to_instance_id
            record.num_moves += 1
        self._store.put_trajectory(trajectory_id, record.to_dict())
        self._counters[_DECISION_COUNTERS[decision.reason]] += 1
        self._counters["moves" if decision.is_move else "stays"] += 1
        return decision

    def finish(self, trajectory_id: TrajectoryId, total_tokens: int) -> Release:
        """Release and learn; see ``base.PlacementPolicy.finish``."""
        record = self._load(trajectory_id)
        self._store.delete_trajectory(trajectory_id)
        self._learn(record, total_tokens)
        self._counters["finished"] += 1
        return Release(trajectory_id, InstanceId(record.instance_id), record.bucket)

    def abort(self, trajectory_id: TrajectoryId) -> Release:
        """Release without learning; see ``base.PlacementPolicy.abort``."""
        record = self._load(trajectory_id)
        self._store.delete_trajectory(trajectory_id)
        self._counters["aborted"] += 1
        return Release(trajectory_id, InstanceId(record.instance_id), record.bucket)

    def on_step_end(self, step: int) -> None:
        """Default: nothing to do at a step boundary."""

    def priority(self, trajectory_id: TrajectoryId) -> int:
        """Default: every trajectory has the same priority."""
        return 0

    def stats(self) -> dict[str, Any]:
        """Counters since construction (per scheduler replica)."""
        return dict(self._counters)

    # Hooks for subclasses.

    def _place(self, trajectory: TrajectoryDescriptor, instances: InstanceSource) -> Placement:
        raise NotImplementedError

    def _decide(
        self, record: TrajectoryRecord, tokens_so_far: int, instances: InstanceSource
    ) -> Decision:
        return self._stay(record, Reason.STAY)

    def _learn(self, record: TrajectoryRecord, total_tokens: int) -> None:
        """Default: baselines do not learn from finished trajectories."""

    # Helpers for subclasses.

    def _load(self, trajectory_id: TrajectoryId) -> TrajectoryRecord:
        data = self._store.get_trajectory(trajectory_id)
        if data is None:
            raise UnknownTrajectory(trajectory_id)
        return TrajectoryRecord.from_dict(data)

    def _route(self, bucket: str, instances: InstanceSource) -> RouteResult | None:
        return route(
            bucket,
            resolve_instances(instances),
            self._layout,
            cursor=self._cursor,
            enable_fallback=self._enable_fallback,
        )

    def _place_in(
        self,
        trajectory: TrajectoryDescriptor,
        bucket: str,
        reason: Reason,
        instances: InstanceSource,
    ) -> Placement:
        """Route a new trajectory into ``bucket`` (or a fallback)."""
        result = self._route(bucket, instances)
        return self._placement_from(trajectory, bucket, reason, result)

    def _placement_from(
        self,
        trajectory: TrajectoryDescriptor,
        target_bucket: str | None,
        reason: Reason,
        result: RouteResult | None,
    ) -> Placement:
        if result is None:
            return Placement(
                trajectory.trajectory_id, None, None, target_bucket, Reason.NO_CAPACITY
            )
        return Placement(
            trajectory.trajectory_id,
            result.instance_id,
            result.bucket,
            target_bucket,
            reason,
            result.kind,
        )

    def _stay(
        self, record: TrajectoryRecord, reason: Reason, target_bucket: str | None = None
    ) -> Decision:
        instance_id = InstanceId(record.instance_id)
        return Decision(
            TrajectoryId(record.trajectory_id),
            Action.STAY,
            reason,
            record.bucket,
            instance_id,
            record.bucket,
            instance_id,
            target_bucket,
        )

    def _move_to(
        self,
        record: TrajectoryRecord,
        target_bucket: str,
        reason: Reason,
        instances: InstanceSource,
    ) -> Decision:
        """Re-pin to ``target_bucket``; never drops the trajectory.

        If the target has no live instance with room, routing falls back to the nearest
        bucket that has one. Landing back in the current bucket, or finding no room at
        all, keeps the trajectory where it is (a re-pin would only cost a re-prefill).
        """
        result = self._route(target_bucket, instances)
        if result is None:
            return self._stay(record, Reason.NO_CAPACITY, target_bucket)
        if result.bucket == record.bucket:
            return self._stay(record, Reason.NO_INSTANCE_FALLBACK, target_bucket)
        if result.kind is RouteKind.FALLBACK:
            reason = Reason.NO_INSTANCE_FALLBACK
        return Decision(
            TrajectoryId(record.trajectory_id),
            Action.MOVE,
            reason,
            record.bucket,
            InstanceId(record.instance_id),
            result.bucket,
            result.instance_id,
            target_bucket,
        )

    def _count_placement(self, placement: Placement) -> None:
        if placement.route_kind is None:
            self._counters[_PLACEMENT_COUNTERS[placement.reason]] += 1
            return
        self._counters[_ROUTE_COUNTERS[placement.route_kind]] += 1
