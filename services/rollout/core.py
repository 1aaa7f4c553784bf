"""Rollout core: one inference instance running the agent loop of its trajectories.

Turn-level continuous batching: every pass takes the trajectories that are ready for
their next turn (not waiting on a tool) and samples one turn for all of them in a single
engine call; tool calls run concurrently on the event loop meanwhile; new trajectories
join at the next pass.

Partial rollout: while an engine call runs, a watcher polls the policy pointer; when
a newer version is published it aborts the call at a token boundary. The interrupted turns
keep their tokens (with the old version), the new weights are loaded before the next
pass, and those turns resume with the rest of their token budget: nothing in flight is
thrown away, and a turn is parsed only once it is complete.

Placement decisions are off the critical path: after a tool return the trajectory is
ready for its next turn at once (staying is the default) and the report goes to the
scheduler in the background. A MOVE that comes back is handed off as soon as it lands:
at once if the trajectory waits for its next turn; if it is in the engine call, only its
row is stopped at a token boundary (the batch goes on) and it leaves with its partial
turn, which the target resumes; if it is in a tool call, at that tool return (whose own
decision is awaited first, so the handoff goes where the scheduler wants it now). A move
whose trajectory finished or was dropped meanwhile is moot. The scheduler commits
nothing for a move: the handoff itself re-pins the assignment and load in Redis (fenced
on the lease epoch and on the assignment), so Redis never points at an instance that
does not hold the trajectory.

The core composes collaborators, each given only the state it needs: the lease
(``lease_keeper``), reports and handoffs (``mover``), lending to training (``lender``),
verified weight loads (``weight_loader``), scoring and publishing (``finisher``), inbox
intake and the job's engine and agent (``intake``), a turn's tool calls and their reports
(``tool_step``); the loop's types are in ``loop_types``.
Pure: the engine, Redis and peers come in as collaborators.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from libra import types as t
from libra.cancellation import raise_if_cancelled
from libra.clock import Clock
from services.rollout import agent, trace_spans
from services.rollout.batch_window import BatchWindow, wait_for_wakeup
from services.rollout.engine_types import GenerationRequest, GenerationResult
from services.rollout.episode_turn import EpisodeChannel
from services.rollout.finisher import Finisher
from services.rollout.hybrid_join import ChannelOpener, TrainerLoader
from services.rollout.intake import Intake
from services.rollout.lease_keeper import LeaseKeeper
from services.rollout.lender import Lender
from services.rollout.loop_types import (
    ActiveTrajectory,
    Engine,  # noqa: F401 - re-exported (the engines implement it)
    EngineLoader,
    JobContext,
    LeaseHolder,
    RolloutSettings,
    SchedulerApi,
)
from services.rollout.mover import Mover
from services.rollout.profile import LoopProfile
from services.rollout.tool_calls import ToolCaller
from services.rollout.tool_step import ToolStep
from services.rollout.weight_loader import WeightLoader

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from libra.clients.api import CoordinatorApi, ToolGatewayApi
    from services.rollout.store_protocol import RolloutStore
    from services.rollout.weight_fetcher import WeightSource

logger = logging.getLogger(__name__)

# While every pinned trajectory waits on a tool, how often the loop still looks at the
# inbox for new work.
WAIT_FOR_TOOLS_S = 0.02


class RolloutCore:
    """The busy loop of one rollout instance."""

    def __init__(self, settings: RolloutSettings, store: RolloutStore, loader: EngineLoader,
                 tools: ToolGatewayApi, scheduler: SchedulerApi, coordinator: CoordinatorApi,
                 clock: Clock, opener: ChannelOpener | None = None,
                 load_trainer: TrainerLoader | None = None,
                 episodes: EpisodeChannel | None = None,
                 weight_source: WeightSource | None = None) -> None:
        self._settings = settings
        self._store = store
        self._coordinator = coordinator
        self._clock = clock
        self._job: tuple[str, JobContext] | None = None
        self._held = LeaseHolder()
        self._stopping = False
        self._wakeup = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.tokens_generated = 0
        # Trajectories whose last turn was generated here (handed to the finisher).
        self.trajectories_finished = 0
        # Moves handed off mid-turn (their engine row stopped).
        self.num_moves_mid_turn = 0
        self._stepping = False  # an engine call is in flight
        self.window = BatchWindow(clock)  # external agents' calls share engine calls
        self.profile = LoopProfile()  # the loop's own costs (GetInstanceStatus)
        sid = settings.instance_id
        self._mover = Mover(sid, scheduler, store, self._held, self.profile, self._spawn,
                            clock)
        self._lender = Lender(settings, store, coordinator, clock, self._held, opener,
                              load_trainer, job=lambda: self._job,
                              busy=lambda: self._stepping or bool(self._tasks),
                              wake=self._wakeup.set)
        self._keeper = LeaseKeeper(settings, store, coordinator, self._held, self._drop_work)
        self.weights = WeightLoader(sid, store, settings.weight_load_deadline_s,
                                    weight_source)
        self._finisher = Finisher(sid, tools, store, self._held, clock, self.profile)
        self._tool_step = ToolStep(ToolCaller(tools, clock, settings.tool_deadline_s),
                                   self._mover, self._finisher, self.window, self.profile,
                                   clock, self._become_ready)
        self._intake = Intake(settings, store, loader, self.weights, self._finisher, episodes,
                              job=lambda: self._job, serve=self._serve,
                              start_episode=self._start_episode)

    # -- collaborators' surface (the servicer and tests use these names) ------------------

    @property
    def settings(self) -> RolloutSettings:
        """This instance's identity and limits (replaced once the entry point knows its
        address)."""
        return self._settings

    @settings.setter
    def settings(self, value: RolloutSettings) -> None:
        """Replaced once the server's port is known (the lease's address, __main__):
        the collaborators that read settings see the new ones."""
        self._settings = value
        self._keeper.settings = value
        self._lender.settings = value
        self._intake.settings = value
        self.weights.load_deadline_s = value.weight_load_deadline_s

    @property
    def num_moves_handed_off(self) -> int:
        """MOVE decisions carried out: trajectories handed to another instance's inbox."""
        return self._mover.num_moves_handed_off

    @property
    def num_moves_moot(self) -> int:
        """MOVE decisions that came too late: the trajectory had finished or left already."""
        return self._mover.num_moves_moot

    @property
    def num_decision_waits(self) -> int:
        """Tool returns at which a trajectory waited for its decision (a move was pending)."""
        return self._tool_step.num_decision_waits

    @property
    def decision_wait_s(self) -> float:
        """The time those waits took: the decision's cost on the critical path."""
        return self._tool_step.decision_wait_s

    @property
    def hybrid_phase(self) -> str:
        """Where a lent (hybrid) instance is in joining or leaving training; empty when
        not lent."""
        return self._lender.hybrid_phase

    async def lend(self, job_id: str, expected_epoch: int, generation: int,
                   trainer_address: str) -> tuple[t.Lease, int]:
        """Lend this hybrid instance to training (see :meth:`Lender.lend`)."""
        return await self._lender.lend(job_id, expected_epoch, generation, trainer_address)

    async def reclaim(self, generation: int, reason: str) -> t.Lease:
        """Back to rollout (see :meth:`Lender.reclaim`)."""
        return await self._lender.reclaim(generation, reason)

    # -- lifecycle ------------------------------------------------------------------------

    async def register(self, wait_s: float = 0.0) -> t.Lease:
        """Take this instance's lease (at start, waiting up to ``wait_s`` for the coordinator)."""
        return await self._keeper.register(wait_s)

    async def heartbeat(self) -> None:
        """Renew the lease every third of its TTL; on loss, drop work and re-register."""
        await self._keeper.heartbeat(lambda: self._stopping)

    async def _drop_work(self) -> None:
        logger.warning("[lease] lost; dropping %d trajectories", self.num_active)
        if self._job is not None:
            self._job[1].forget_active()
        await self._lender.end_lend("lease lost")

    @property
    def num_active(self) -> int:
        """Trajectories this instance holds now (its load, as reported in status)."""
        return len(self._job[1].active) if self._job else 0

    @property
    def num_tasks(self) -> int:
        """Tool steps and hand-offs still running in the background (0 = all settled)."""
        return len(self._tasks)

    @property
    def job_id(self) -> str:
        """The job this instance works on; empty between jobs."""
        return self._job[0] if self._job else ""

    @property
    def policy_version(self) -> int:
        """The policy version loaded in the engine; -1 before any job."""
        return self._job[1].engine.policy_version if self._job else -1

    async def drain(self, grace_s: float) -> None:
        """Stop taking work; let in-flight trajectories finish within the grace period."""
        self._stopping = True
        deadline = self._clock.now_s() + grace_s * 0.8
        while self.num_active and self._clock.now_s() < deadline:
            await asyncio.sleep(0.05)
        await self._keeper.release()

    async def run(self) -> None:
        """The loop: pull work, refresh weights, sample one turn for every ready one."""
        heartbeat = asyncio.create_task(self.heartbeat())
        try:
            while not self._stopping or self.num_active:
                raise_if_cancelled()
                if self._lender.lending:  # lent to training: the hybrid join runs meanwhile
                    await wait_for_wakeup(self._wakeup, WAIT_FOR_TOOLS_S)
                    continue
                # 1) Pull newly placed trajectories (block only when idle).
                self.profile.start_pass(self.num_active)
                if not self._stopping:
                    await self._intake.pull(self.num_active)
                self.profile.mark("pull")
                if self._job is None:
                    continue
                job_id, ctx = self._job
                # 2) Load a newer policy version between engine calls (never during one).
                await self._refresh_weights(job_id, ctx)
                self.profile.mark("refresh")
                # 3) One turn for every ready trajectory.
                if not await self._step(job_id, ctx):
                    await wait_for_wakeup(self._wakeup, WAIT_FOR_TOOLS_S)
        finally:
            heartbeat.cancel()

    def instance_status(self, engine_profile_json: str = "") -> t.InstanceStatus:
        """What this instance reports about itself (GetInstanceStatus)."""
        lease = self._held.lease
        return t.InstanceStatus(
            self._settings.instance_id, self._settings.bucket, self.num_active,
            self.policy_version, self.tokens_generated, self.job_id,
            lease.role.value if lease else "", self.hybrid_phase, engine_profile_json,
            self.profile.to_json())

    @property
    def lease(self) -> t.Lease | None:
        """The lease held now; None before registering or after losing it."""
        return self._held.lease

    # -- loop steps -----------------------------------------------------------------------

    async def _refresh_weights(self, job_id: str, ctx: JobContext) -> None:
        if await self._store.job_state(job_id) in ("succeeded", "failed", "cancelled"):
            self._job = None
            await self._intake.end_job(job_id, ctx)
            return
        await self.weights.load_newer(job_id, ctx.engine)

    async def _step(self, job_id: str, ctx: JobContext) -> bool:
        # Calls of external agents that arrive together share this engine call.
        await self.window.hold(lambda: sum(a.ready for a in ctx.active.values()),
                               ctx.max_batch_size, ctx.spec.task.episode_batch_window_ms / 1000,
                               self._wakeup)
        self.profile.mark("window")
        ready = [a for a in ctx.active.values() if a.ready][: ctx.max_batch_size]
        if not ready:
            return False
        requests, batch = [], []
        for act in ready:
            act.ready = False  # in this engine call (or leaving) until its turn is done
            if self._mover.hand_off_if_due(ctx, act):
                continue
            request = ctx.agent.next_request(act.traj, seed=None,
                                             num_turn_tokens=len(act.turn_prefix))
            if request is None and act.turn_prefix:
                # An interrupted turn that has no room left ends as it stands.
                self._after_turn(ctx, act, GenerationResult(
                    token_ids=[], logprobs=[], finish_reason="length",
                    policy_version=ctx.engine.policy_version))
            elif request is None:  # an external agent's close may still want scoring
                answer = getattr(ctx.agent, "final_answer", lambda _traj: None)(act.traj)
                self._spawn(self._finisher.finish(ctx, act, final_answer=answer))
            else:
                requests.append(request)
                batch.append(act)
        if not requests:
            return True
        for row, act in enumerate(batch):
            act.row = row
        self._stepping, started_ms = True, self._clock.now_ms()
        try:
            results = await self._generate(job_id, ctx, requests, batch)
        finally:
            self._stepping = False
            for act in batch:
                act.row = None
        ended_ms = self._clock.now_ms()
        self.window.note_engine_call((ended_ms - started_ms) / 1000)
        for act, result in zip(batch, results, strict=True):
            self.tokens_generated += len(result.token_ids)
            trace_spans.turn(act.traj, self.settings.instance_id, self.settings.bucket,
                             len(batch), result, started_ms, ended_ms)
            if ctx.holds(act):  # not dropped during the call (lease lost)
                self._after_turn(ctx, act, result)
        self.profile.end_pass()
        return True

    async def _generate(self, job_id: str, ctx: JobContext, requests: list[GenerationRequest],
                        batch: list[ActiveTrajectory]) -> list[GenerationResult]:
        """One engine call, aborted at a token boundary if a newer policy is published
        (and, for external agents, a row whose client went away; their streamed turns
        are relayed meanwhile)."""
        watchers = [asyncio.create_task(self.weights.abort_on_newer(
            job_id, ctx.engine, self.settings.policy_poll_s))]
        during = getattr(ctx.agent, "during_engine_call", None)  # an external agent's
        if during is not None:
            watchers.append(asyncio.create_task(during(
                ctx.engine, [act.traj for act in batch], self.settings.policy_poll_s)))
        try:
            return await self.profile.engine_call(ctx.engine, requests)
        finally:
            for watcher in watchers:
                watcher.cancel()

    def _after_turn(self, ctx: JobContext, act: ActiveTrajectory,
                    result: GenerationResult) -> None:
        client_gone = getattr(ctx.agent, "client_gone", None)
        if result.finish_reason == "aborted" and not (client_gone and client_gone(act.traj)):
            # Not a finished turn (a turn whose client went away ends here and is taken
            # back by its agent): keep the tokens and resume it on the new weights next
            # pass, or on the target instance when it was stopped for a move.
            agent.apply_partial(act.traj, result)
            act.turn_prefix.extend(result.token_ids)
            if self._mover.hand_off_if_due(ctx, act):
                self.num_moves_mid_turn += 1
            else:
                act.ready = True
            return
        outcome = ctx.agent.apply_generation(act.traj, result, act.turn_prefix)
        act.turn_prefix = []
        if outcome.finished or not (outcome.calls or outcome.errors):
            self.trajectories_finished += 1
            self._spawn(self._finisher.finish(ctx, act, outcome.final_answer))
        else:
            self._spawn(self._tool_step.run(ctx, act, outcome))

    def _serve(self, job: tuple[str, JobContext]) -> None:
        self._job = job

    def _start_episode(self, ctx: JobContext, act: ActiveTrajectory) -> None:
        self._spawn(self._tool_step.run(ctx, act, agent.TurnOutcome()))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(self.profile.task(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _become_ready(self, act: ActiveTrajectory) -> None:
        act.ready = True
        self._wakeup.set()
