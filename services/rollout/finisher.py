"""The end of a trajectory on this instance: scored, then published (fenced).

A finished trajectory with a final answer is scored by the tool gateway (its reward
named in the job spec); a reward failure fails the trajectory with the prefix the
trainer counts against ``reward.max_failures``. Publishing is one fenced store call:
refused when this instance's lease expired or was granted anew (the scheduler
re-placed the trajectory). The scheduler learns the finish from the stream.

Pure, like the core: the tool gateway and the store come in as collaborators.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from libra import types as t
from libra.clock import Clock
from libra.errors import LibraError
from libra.rewardspec import REWARD_FAILURE_PREFIX
from libra.tool_deadline import score_rpc_timeout_s
from services.rollout import trace_spans
from services.rollout.loop_types import ActiveTrajectory, JobContext, LeaseHolder
from services.rollout.profile import LoopProfile

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from libra.clients.api import ToolGatewayApi
    from services.rollout.store_protocol import RolloutStore

logger = logging.getLogger(__name__)

# A trajectory that ends with no sampled token fails with this reason, counted here.
UNSAMPLED_REASON = "no sampled tokens: nothing to train on"
UNSAMPLED_COUNTER = "trajectories_unsampled"


def has_sampled_tokens(traj: t.Trajectory) -> bool:
    """True if any token of the trajectory (or of a kept segment) was sampled."""
    return any(traj.loss_mask) or any(any(seg.loss_mask) for seg in traj.segments)


class Finisher:
    """Scores and publishes the trajectories that end here."""

    def __init__(self, instance_id: str, tools: ToolGatewayApi, store: RolloutStore,
                 held: LeaseHolder, clock: Clock, profile: LoopProfile) -> None:
        self._instance_id = instance_id
        self._tools = tools
        self._store = store
        self._held = held
        self._clock = clock
        self._profile = profile

    async def finish(self, ctx: JobContext, act: ActiveTrajectory,
                     final_answer: str | None) -> None:
        traj = act.traj
        if not ctx.holds(act):
            return  # dropped meanwhile (lease lost): re-placed, its new holder ends it
        if not has_sampled_tokens(traj):
            # Nothing the policy sampled (an episode closed before its first turn):
            # nothing to train on, and an empty loss mask must never reach the trainer.
            await self._store.count(traj.job_id, UNSAMPLED_COUNTER)
            await self.fail(ctx, act, UNSAMPLED_REASON)
            return
        if final_answer is not None:
            reward = ctx.spec.reward
            request = t.ScoreInput(
                traj.trajectory_id, reward.name, final_answer, traj.reference,
                ctx.agent.transcript(traj), traj.metadata_json, traj.num_turns,
                reward.options_json())
            try:
                # The gateway times the reward out itself, cut to this RPC's deadline
                # less its answer time, so its answer (naming the reward) arrives first
                # (libra/tool_deadline.py).
                out = await self._profile.timed("score", self._tools.score(
                    request, score_rpc_timeout_s(reward.timeout_s)), traj.trajectory_id)
            except LibraError as exc:
                # The trainer counts these against reward.max_failures (by the prefix).
                await self.fail(ctx, act, f"{REWARD_FAILURE_PREFIX} {reward.name}: {exc}")
                return
            traj.reward, traj.reward_components = out.reward, dict(out.components)
        traj.final_text = final_answer or ""
        traj.status = t.TrajectoryStatus.FINISHED
        await self._publish(ctx, act)

    async def fail(self, ctx: JobContext, act: ActiveTrajectory, reason: str) -> None:
        if not ctx.holds(act):
            return  # dropped meanwhile (lease lost): re-placed, its new holder ends it
        act.traj.status = t.TrajectoryStatus.FAILED
        act.traj.failure_reason = reason
        logger.warning("[trajectory] failed trajectory_id=%s reason=%s",
                       act.traj.trajectory_id, reason)
        await self._publish(ctx, act)

    async def _publish(self, ctx: JobContext, act: ActiveTrajectory) -> None:
        traj = act.traj
        traj.finished_at_ms = self._clock.now_ms()
        if not ctx.holds(act):
            # Dropped meanwhile (lease lost): it was re-placed, maybe here again (then the
            # entry is the new holder's and stays).
            return
        del ctx.active[traj.trajectory_id]
        # Fenced: refused when this instance's lease expired or was granted anew (the
        # scheduler re-placed the trajectory). The scheduler learns the finish from the
        # stream, so there is no call to make here.
        epoch, started_ms = self._held.epoch, self._clock.now_ms()
        is_published = await self._profile.timed("publish", self._store.publish(
            traj, self._instance_id, act.entry.entry_id, epoch), traj.trajectory_id)
        trace_spans.publish(traj, self._instance_id, started_ms, self._clock.now_ms(),
                            is_published)
        if not is_published:
            logger.warning("[lease] stale epoch=%d: result of trajectory_id=%s not published",
                           epoch, traj.trajectory_id)
