"""A trajectory's tool-calling step, run as a task while the loop goes on (pure).

The turn's calls run (through the tool gateway, or as an external agent's next call),
their results join the trajectory, and each return is reported to the scheduler. Staying
is the default: the trajectory is ready for its next turn at once and a MOVE applies when
it comes back; only a trajectory with a move already pending waits for this return's
decision (the policy may now want it elsewhere, or back here).
"""

from __future__ import annotations

from collections.abc import Callable

from libra import types as t
from libra.clock import Clock
from libra.errors import LibraError
from services.rollout import agent
from services.rollout.batch_window import BatchWindow
from services.rollout.episode_turn import EpisodeEnded
from services.rollout.finisher import Finisher
from services.rollout.loop_types import ActiveTrajectory, JobContext
from services.rollout.mover import Mover
from services.rollout.profile import LoopProfile
from services.rollout.tool_calls import ToolCaller


class ToolStep:
    """Runs tool-calling turns and reports their returns; counts the decisions waited for."""

    def __init__(self, tool_calls: ToolCaller, mover: Mover, finisher: Finisher,
                 window: BatchWindow, profile: LoopProfile, clock: Clock,
                 become_ready: Callable[[ActiveTrajectory], None]) -> None:
        self._tool_calls = tool_calls
        self._mover = mover
        self._finisher = finisher
        self._window = window
        self._profile = profile
        self._clock = clock
        self._become_ready = become_ready
        # Tool returns at which a trajectory waited for its decision (a move was pending)
        # and the time they waited: the decision's cost on the critical path.
        self.num_decision_waits = 0
        self.decision_wait_s = 0.0

    async def run(self, ctx: JobContext, act: ActiveTrajectory,
                  outcome: agent.TurnOutcome) -> None:
        """The turn's tool calls, their results applied, the returns reported."""
        traj = act.traj
        if not ctx.holds(act):  # dropped before it started: its episode is not offered
            return
        # An external agent's "tool" is its program's next call (external_agent.py),
        # awaited as such by the batching window.
        external = getattr(ctx.agent, "run_turn", None)
        turn = (external or self._tool_calls.run_turn)(ctx.spec, traj, outcome)
        try:
            results = await self._profile.timed(
                "tool", self._window.awaiting_call(turn) if external else turn,
                traj.trajectory_id)
        except LibraError as exc:  # (nothing is published for a trajectory dropped here)
            await self._finisher.fail(ctx, act, str(exc) if isinstance(exc, EpisodeEnded)
                                      else f"tool gateway: {exc}")
            return
        if external and not ctx.holds(act):
            return  # dropped meanwhile: the agent's state for this id is the new copy's
        ctx.agent.apply_tool_results(traj, results)
        # Every return extends the trajectory's causal path; the decision that counts is
        # the last one's (the earlier ones' decisions land like any late decision).
        for item in results[:-1]:
            self._mover.spawn_report(self._mover.apply_decision_later(
                ctx, act, self._mover.report(traj, item.result.state, needs_answer=False)))
        await self._report_last(ctx, act, results[-1].result)

    async def _report_last(self, ctx: JobContext, act: ActiveTrajectory,
                           result: t.ToolResult) -> None:
        traj = act.traj
        if act.move is None:
            # Staying is the default: the trajectory goes on here at once, and a MOVE
            # applies when it comes back (mid-turn if need be), so a decision's round
            # trip never holds a trajectory nor the engine.
            self._mover.spawn_report(self._mover.apply_decision_later(
                ctx, act, self._mover.report(traj, result.state, needs_answer=False)))
            self._become_ready(act)
            return
        # A move is pending: the trajectory leaves at this boundary anyway, so take this
        # return's decision first (the policy may now want it elsewhere, or back here).
        started_s = self._clock.now_s()
        self._mover.note_decision(act, await self._mover.decide(
            self._mover.report(traj, result.state, needs_answer=True)))
        self.num_decision_waits += 1
        self.decision_wait_s += self._clock.now_s() - started_s
        if not self._mover.hand_off_if_due(ctx, act):
            self._become_ready(act)
