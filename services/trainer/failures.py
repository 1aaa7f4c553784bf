"""Trajectory failures that end a job, and the per-step means of reward components.

A trajectory whose agent could not be built on its rollout (``AGENT_FAILURE_PREFIX``:
not installed there, or its entry point fails to import) fails the job at once: every
other trajectory of the job would fail the same way.

A trajectory whose reward failed (raised, timed out, non-finite or out-of-range score)
reaches the trainer as FAILED with a ``failure_reason`` starting with
``REWARD_FAILURE_PREFIX`` (set by the rollout). Each is dropped like any failed
trajectory; after ``reward.max_failures`` of them in one job the job FAILS with an error
naming the reward and the last error, instead of training on a reward that no longer
works (or stalling on groups that never complete).
"""

from __future__ import annotations

from collections.abc import Sequence

from libra import types as t
from libra.agents import AGENT_FAILURE_PREFIX
from libra.rewardspec import REWARD_FAILURE_PREFIX, RewardSpec


class JobFailure(RuntimeError):
    """A trajectory failure that ends the job; the message is the job's error."""


class RewardFailuresExhausted(JobFailure):
    """The job's reward failed ``reward.max_failures`` trajectories."""


class RewardFailureBudget:
    """Counts reward failures of one job (the total, across steps)."""

    def __init__(self, spec: RewardSpec) -> None:
        self._spec = spec
        self.num_failures = 0

    def observe(self, traj: t.Trajectory) -> None:
        """Count ``traj`` if its reward failed; end the job if its agent is unavailable.

        Raises:
            RewardFailuresExhausted: This failure reached ``reward.max_failures``.
            JobFailure: The job's agent could not be built on a rollout.
        """
        if traj.status is not t.TrajectoryStatus.FAILED:
            return
        if traj.failure_reason.startswith(AGENT_FAILURE_PREFIX):
            raise JobFailure(traj.failure_reason)
        if not traj.failure_reason.startswith(REWARD_FAILURE_PREFIX):
            return
        self.num_failures += 1
        if self.num_failures >= self._spec.max_failures:
            last = traj.failure_reason.removeprefix(REWARD_FAILURE_PREFIX).strip()
            raise RewardFailuresExhausted(
                f"reward {self._spec.name!r} failed {self.num_failures} trajectories "
                f"(reward.max_failures = {self._spec.max_failures}); last error: {last}")


def component_means(trajs: Sequence[t.Trajectory]) -> dict[str, float]:
    """Mean of each named reward component over the trajectories that report it."""
    sums: dict[str, list[float]] = {}
    for traj in trajs:
        for name, value in traj.reward_components.items():
            sums.setdefault(name, []).append(value)
    return {name: round(sum(v) / len(v), 6) for name, v in sorted(sums.items())}
