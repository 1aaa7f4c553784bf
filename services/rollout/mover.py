"""The rollout core's side of placement: reports at tool returns and moves.

``RolloutCore`` composes a :class:`Mover`. A tool return's report goes to the
scheduler in the background; the decision, when it comes, is noted on the trajectory
and a MOVE is handed off as soon as it lands (between turns at once, mid-turn by
stopping the trajectory's engine row, after a tool call at its return). The handoff is
one fenced store call that commits the move; a move whose trajectory is gone is moot.

Pure, like the core: the scheduler and the store come in as collaborators.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from libra import tracing
from libra import types as t
from libra.clock import Clock
from libra.errors import LibraError
from services.rollout import trace_spans
from services.rollout.loop_types import ActiveTrajectory, JobContext, LeaseHolder, SchedulerApi
from services.rollout.profile import LoopProfile

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from services.rollout.store_protocol import RolloutStore

logger = logging.getLogger(__name__)


class Mover:
    """Placement reports and handoffs of the trajectories pinned here.

    ``spawn`` runs a handoff as one of the core's trajectory tasks (a lend waits for
    them); reports are kept apart (a lend does not wait for decisions)."""

    def __init__(self, instance_id: str, scheduler: SchedulerApi, store: RolloutStore,
                 held: LeaseHolder, profile: LoopProfile,
                 spawn: Callable[[Any], None], clock: Clock) -> None:
        self._instance_id = instance_id
        self._clock = clock
        self._scheduler = scheduler
        self._store = store
        self._held = held
        self._profile = profile
        self._spawn = spawn
        # Tool-return reports awaiting their decision (nobody waits on them).
        self._reports: set[asyncio.Task] = set()
        # Moves handed off, and moves that came back after their trajectory was gone.
        self.num_moves_handed_off = 0
        self.num_moves_moot = 0

    def spawn_report(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    def report(self, traj: t.Trajectory, state: t.ToolReturnState,
               needs_answer: bool) -> Awaitable[t.PlacementDecision]:
        """The report of a tool return, its arguments (token count, lease epoch) taken
        now, before the trajectory moves on; awaited by ``decide``. Only a caller that
        waits on the decision needs a stay answered (it costs the scheduler a message)."""
        sent = self._profile.timed("report", self._scheduler.report_tool_return(
            traj.job_id, traj.trajectory_id, state, traj.num_generated_tokens,
            self._instance_id, self._held.epoch, needs_answer=needs_answer))
        if not tracing.is_recording(traj.traceparent):
            return sent
        return self._traced(traj, state, sent)

    async def _traced(self, traj: t.Trajectory, state: t.ToolReturnState,
                      sent: Awaitable[t.PlacementDecision]) -> t.PlacementDecision:
        started_ms = self._clock.now_ms()
        answer = await sent  # an error is decide's to handle (no decision, no span)
        trace_spans.decision(traj, self._instance_id, state, answer, started_ms,
                             self._clock.now_ms())
        return answer

    async def decide(self, report: Awaitable[t.PlacementDecision]) -> t.PlacementDecision:
        try:
            return await report
        except LibraError as exc:
            # Placement is an optimisation: without an answer the trajectory stays put
            # (scheduler unreachable, or the report refused, e.g. a stale lease epoch).
            logger.warning("[decision] no decision, staying error=%s", exc)
            return t.PlacementDecision(t.DecisionAction.STAY, reason="scheduler_unreachable")

    async def apply_decision_later(self, ctx: JobContext, act: ActiveTrajectory,
                                   report: Awaitable[t.PlacementDecision]) -> None:
        decision = await self.decide(report)
        if ctx.active.get(act.traj.trajectory_id) is not act:
            # Finished, handed back or dropped meanwhile: the decision is moot. Nothing
            # was committed for it, so assignment and load still say where it was.
            if decision.action is t.DecisionAction.MOVE:
                self.num_moves_moot += 1
            return
        self.note_decision(act, decision)
        if act.move is None:
            return
        if act.ready:  # waiting for its next turn: leave now rather than at the next pass
            act.ready = not self.hand_off_if_due(ctx, act)
        elif act.row is not None:
            # In the engine call: stop just its row; it leaves from ``_after_turn`` with
            # the partial turn. (In a tool call, it leaves at that tool return.)
            ctx.engine.abort_rows([act.row])

    def note_decision(self, act: ActiveTrajectory, decision: t.PlacementDecision) -> None:
        """The latest decision says where the trajectory belongs: a MOVE elsewhere
        replaces any pending move, one back here cancels it. A STAY names the instance
        the scheduler already has it pinned to, so it leaves a pending move as it is."""
        target = decision.target_instance
        if target == self._instance_id:
            act.move = None
        elif target and decision.action is t.DecisionAction.MOVE:
            act.move = decision

    def hand_off_if_due(self, ctx: JobContext, act: ActiveTrajectory) -> bool:
        """Start the handoff of a trajectory with a pending move that is not in an
        engine or tool call (an interrupted turn goes along); True if it is leaving."""
        if act.move is None:
            return False
        self._spawn(self._handoff(ctx, act, act.move))
        return True

    async def _handoff(self, ctx: JobContext, act: ActiveTrajectory,
                       decision: t.PlacementDecision) -> None:
        if ctx.active.pop(act.traj.trajectory_id, None) is None:
            return  # dropped meanwhile (lease lost, job ended): must not be re-injected
        act.traj.num_migrations += 1
        epoch = self._held.epoch
        started_ms, from_bucket = self._clock.now_ms(), act.traj.bucket
        is_committed = await self._store.handoff(
            act.state_to_hand_over(), self._instance_id, act.entry.entry_id,
            decision.target_instance, decision.target_bucket, epoch)
        trace_spans.move(act.traj, self._instance_id, from_bucket, decision, started_ms,
                         self._clock.now_ms(), is_committed)
        if not is_committed:
            # Fenced: this lease moved on, or the scheduler re-queued the trajectory.
            logger.warning("[move] refused (stale epoch=%d or re-queued) trajectory_id=%s",
                           epoch, act.traj.trajectory_id)
            return
        self.num_moves_handed_off += 1
        logger.debug("[move] trajectory_id=%s to=%s reason=%s", act.traj.trajectory_id,
                     decision.target_instance, decision.reason)
