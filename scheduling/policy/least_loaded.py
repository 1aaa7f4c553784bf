"""Baseline ``least_loaded``: length-blind least-connections placement.

Every trajectory goes to the live instance with the fewest pinned trajectories, over
all buckets, ties broken round-robin so no instance starves. It never moves a
trajectory. (The reference re-routes every turn independently; we pin, because our
load counters count pinned trajectories and a re-pin costs a re-prefill.)
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.policy.base import (
    InstanceSource,
    Placement,
    Reason,
    TrajectoryDescriptor,
    resolve_instances,
)
from scheduling.policy.layout import BucketLayout
from scheduling.policy.pinning import PinningPolicy
from scheduling.policy.routing import route_any
from scheduling.policy.store import PolicyStore


@dataclass(frozen=True, kw_only=True, slots=True)
class LeastLoadedConfig:
    """``least_loaded`` has no knobs; the class keeps ``make_policy`` uniform."""


class LeastLoadedPolicy(PinningPolicy):
    """Least-connections placement with a round-robin tie-break; ignores length.

    Args:
        layout: Bucket layout (for per-instance caps).
        store: Policy state.
        config: Unused; accepted for a uniform constructor.
    """

    name = "least_loaded"

    def __init__(
        self, layout: BucketLayout, store: PolicyStore, config: LeastLoadedConfig | None = None
    ) -> None:
        # Fallback is meaningless when every bucket is already a candidate.
        super().__init__(layout, store, enable_fallback=False)

    def _place(self, trajectory: TrajectoryDescriptor, instances: InstanceSource) -> Placement:
        result = route_any(resolve_instances(instances), self._layout, cursor=self._cursor)
        target_bucket = result.bucket if result is not None else None
        return self._placement_from(trajectory, target_bucket, Reason.LEAST_LOADED, result)
