"""Baseline ``toolcount``: serve trajectories with more completed tool calls first.

Placement is least-loaded (as ``least_loaded``); the policy's contribution is
``priority``: the number of completed tool calls, which the caller's admission and
dispatch queues use to order pending turns (higher first). Trajectories deep into an
episode are closer to done, so finishing them first shortens the tail.
"""

from __future__ import annotations

from dataclasses import dataclass

from libra.types import TrajectoryId
from scheduling.policy.layout import BucketLayout
from scheduling.policy.least_loaded import LeastLoadedPolicy
from scheduling.policy.store import PolicyStore


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolcountConfig:
    """``toolcount`` has no knobs; the class keeps ``make_policy`` uniform."""


class ToolcountPolicy(LeastLoadedPolicy):
    """Least-loaded placement plus tool-call-count priority.

    Args:
        layout: Bucket layout (for per-instance caps).
        store: Policy state.
        config: Unused; accepted for a uniform constructor.
    """

    name = "toolcount"

    def __init__(
        self, layout: BucketLayout, store: PolicyStore, config: ToolcountConfig | None = None
    ) -> None:
        super().__init__(layout, store)

    def priority(self, trajectory_id: TrajectoryId) -> int:
        """Completed tool calls of the trajectory (higher is served first).

        Unknown trajectories (not yet begun, or finished) have priority 0, the priority
        of fresh work.
        """
        data = self._store.get_trajectory(trajectory_id)
        return 0 if data is None else len(data["path_keys"])
