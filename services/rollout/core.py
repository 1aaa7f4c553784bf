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

Reports and handoffs live in :mod:`services.rollout.moves`, lending to training (elastic
pool) in :mod:`services.rollout.lend`.

Pure: the engine, Redis and peers come in as collaborators.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from libra import types as t
from libra.clock import Clock
from libra.errors import LeaseLost, LibraError
from libra.jobspec import JobSpec, ModelSpec, job_spec_from_json
from libra.rewardspec import REWARD_FAILURE_PREFIX
from libra.weight_sync import MANIFEST_SUFFIX, WeightSyncError, read_verified, sha256_file
from services.rollout import agent
from services.rollout.agent_registry import AgentUnavailable, build_agent_or_stand_in
from services.rollout.engine_types import GenerationRequest, GenerationResult
from services.rollout.external_agent import EpisodeChannel, EpisodeEnded, ExternalAgent
from services.rollout.lend import LendingMixin
from services.rollout.lending import ChannelOpener, TrainerLoader
from services.rollout.moves import MovesMixin
from services.rollout.profile import LoopProfile
from services.rollout.tool_calls import ToolCaller

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from libra.clients.coordinator import CoordinatorApi
    from libra.clients.toolgateway import ToolGatewayApi
    from services.rollout.store import InboxEntry, RolloutStore

logger = logging.getLogger(__name__)

# Extra wait for a Score RPC beyond the job's reward.timeout_s (the gateway's own).
SCORE_DEADLINE_MARGIN_S = 5.0
# While every pinned trajectory waits on a tool, how often the loop still looks at the
# inbox for new work.
WAIT_FOR_TOOLS_S = 0.02


class Engine(Protocol):
    policy_version: int

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...

    def load_weights(self, path: str, version: int) -> None: ...

    def abort(self) -> None: ...

    def abort_rows(self, rows: Iterable[int]) -> None: ...

    def load_weights_bytes(self, data: bytes, version: int) -> None: ...


class EngineLoader(Protocol):
    def load(self, model_dir: str, policy: t.PolicyInfo, tp_degree: int,
             model: ModelSpec) -> tuple[Engine, agent.Tokenizer]: ...


class SchedulerApi(Protocol):
    """Decisions at tool returns (the client batches concurrent reports on one stream).
    Finishes need no call: the scheduler reads them from the trajectory stream. Without
    ``needs_answer`` a stay may be settled late (with a later batch's answer)."""

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str, lease_epoch: int,
                                 needs_answer: bool = True) -> t.PlacementDecision: ...


@dataclass(frozen=True)
class RolloutSettings:
    instance_id: str
    bucket: str
    address: str = ""
    max_batch_size: int = 8
    max_trajectories: int = 16
    lease_ttl_ms: int = 3000
    tool_deadline_s: float = 5.0
    idle_block_ms: int = 200
    policy_poll_s: float = 0.05
    weight_load_deadline_s: float = 30.0
    role: t.WorkerRole = t.WorkerRole.CORE_ROLLOUT
    """``HYBRID_ROLLOUT`` lets the elastic pool lend this instance to training."""


@dataclass
class _Active:
    entry: InboxEntry
    traj: t.Trajectory
    # Waiting for its next turn (not in an engine call, a tool call or its finish).
    ready: bool = True
    # Tokens of the current turn sampled before an interruption (a weight update; or
    # where it was handed over from, when a move or a hand-back interrupted it).
    turn_prefix: list[int] = field(default_factory=list)
    # A MOVE decided for it and not yet handed off.
    move: t.PlacementDecision | None = None
    # Its index in the engine call in flight (None outside one): a late MOVE stops it.
    row: int | None = None

    def state_to_hand_over(self) -> t.Trajectory:
        """The trajectory as another instance continues it (with its partial turn)."""
        self.traj.partial_turn_tokens = len(self.turn_prefix)
        return self.traj


@dataclass
class _JobContext:
    spec: JobSpec
    engine: Engine
    agent: agent.Agent
    max_batch_size: int
    """The job's bucket's ``max_batch_size``, capped by this instance's."""
    active: dict[str, _Active] = field(default_factory=dict)


class RolloutCore(MovesMixin, LendingMixin):
    """The busy loop of one rollout instance."""

    def __init__(self, settings: RolloutSettings, store: RolloutStore, loader: EngineLoader,
                 tools: ToolGatewayApi, scheduler: SchedulerApi, coordinator: CoordinatorApi,
                 clock: Clock, opener: ChannelOpener | None = None,
                 load_trainer: TrainerLoader | None = None,
                 episodes: EpisodeChannel | None = None) -> None:
        self.settings = settings
        self._store = store
        self._loader = loader
        self._tools = tools
        self._tool_calls = ToolCaller(tools, clock, settings.tool_deadline_s)
        self._scheduler = scheduler
        self._coordinator = coordinator
        self._clock = clock
        self._episodes = episodes  # the external agent's Redis lists (external_agent.py)
        self._job: tuple[str, _JobContext] | None = None
        self._lease: t.Lease | None = None
        self._stopping = False
        self._wakeup = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        # Tool-return reports awaiting their decision (nobody waits on them).
        self._reports: set[asyncio.Task] = set()
        # (job, version, sha256) whose weights failed verification: checked and reported
        # once, not on every pass of the loop.
        self._rejected: set[tuple[str, int, str]] = set()
        self.tokens_generated = 0
        # Moves handed off (of which mid-turn: its engine row stopped), and moves that
        # came back after their trajectory was gone.
        self.num_moves_handed_off = 0
        self.num_moves_mid_turn = 0
        self.num_moves_moot = 0
        # Tool returns at which a trajectory waited for its decision (a move was pending)
        # and the time they waited: the decision's cost on the critical path.
        self.num_decision_waits = 0
        self.decision_wait_s = 0.0
        # Elastic pool: role changes and renewals never interleave (both move the epoch).
        self._lease_lock = asyncio.Lock()
        self._init_lending(opener, load_trainer)
        self._stepping = False  # an engine call is in flight
        self.profile = LoopProfile()  # the loop's own costs (GetInstanceStatus)

    # -- lifecycle ------------------------------------------------------------------------

    async def register(self) -> t.Lease:
        s = self.settings
        await self._store.ensure_inbox(s.instance_id)
        self._lease = await self._coordinator.acquire_lease(
            s.instance_id, s.role, s.bucket, s.address, s.lease_ttl_ms)
        return self._lease

    async def heartbeat(self) -> None:
        """Renew the lease every third of its TTL; on loss, drop work and re-register.

        A registration that fails (the coordinator restarting) is tried again at each
        beat: the loop never ends on a coordinator outage.
        """
        is_registered = True
        while not self._stopping:
            await asyncio.sleep(self.settings.lease_ttl_ms / 3000.0)
            if self._lease is None:
                continue
            if not is_registered:
                is_registered = await self._register_again()
                continue
            try:
                async with self._lease_lock:
                    self._lease = await self._coordinator.renew_lease(self._lease.worker_id,
                                                                      self._lease.epoch)
            except LeaseLost:
                # The scheduler re-placed what we held; finishing it here would duplicate.
                logger.warning("[lease] lost; dropping %d trajectories", self.num_active)
                if self._job is not None:
                    self._job[1].active.clear()
                await self._end_lend("lease lost")
                is_registered = await self._register_again()
            except LibraError as exc:
                logger.warning("[lease] renew failed error=%s", exc)

    async def _register_again(self) -> bool:
        try:
            await self.register()
        except LibraError as exc:
            logger.warning("[lease] register failed error=%s; trying again next beat", exc)
            return False
        return True

    @property
    def num_active(self) -> int:
        return len(self._job[1].active) if self._job else 0

    @property
    def job_id(self) -> str:
        return self._job[0] if self._job else ""

    @property
    def policy_version(self) -> int:
        return self._job[1].engine.policy_version if self._job else -1

    async def drain(self, grace_s: float) -> None:
        """Stop taking work; let in-flight trajectories finish within the grace period."""
        self._stopping = True
        deadline = self._clock.now_s() + grace_s * 0.8
        while self.num_active and self._clock.now_s() < deadline:
            await asyncio.sleep(0.05)
        if self._lease is None:
            return
        try:
            await self._coordinator.release_lease(self._lease.worker_id, self._lease.epoch)
        except LibraError as exc:
            # `libra down` stops the coordinator at the same time: the lease then
            # expires by its TTL instead, and the process still exits cleanly.
            logger.warning("[lease] release failed error=%s; it expires in %d ms", exc,
                           self.settings.lease_ttl_ms)

    async def run(self) -> None:
        """The loop: pull work, refresh weights, sample one turn for every ready one."""
        heartbeat = asyncio.create_task(self.heartbeat())
        try:
            while not self._stopping or self.num_active:
                if self._lending:  # lent to training: the hybrid join runs meanwhile
                    await self._wait_for_work()
                    continue
                # 1) Pull newly placed trajectories (block only when idle).
                self.profile.start_pass(self.num_active)
                await self._pull()
                self.profile.mark("pull")
                if self._job is None:
                    continue
                job_id, ctx = self._job
                # 2) Load a newer policy version between engine calls (never during one).
                await self._refresh_weights(job_id, ctx)
                self.profile.mark("refresh")
                # 3) One turn for every ready trajectory.
                if not await self._step(job_id, ctx):
                    await self._wait_for_work()
        finally:
            heartbeat.cancel()

    @property
    def lease(self) -> t.Lease | None:
        return self._lease

    # -- loop steps -----------------------------------------------------------------------

    async def _wait_for_work(self) -> None:
        """Sleep until a tool call returns (or briefly, to look at the inbox again)."""
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout=WAIT_FOR_TOOLS_S)
        except TimeoutError:
            pass
        self._wakeup.clear()

    async def _pull(self) -> None:
        if self._stopping:
            return
        free = self.settings.max_trajectories - self.num_active
        if free <= 0:
            return
        # Block on the inbox only when nothing is pinned here; otherwise a trajectory
        # whose tool call returns would wait for the inbox instead of its next turn.
        block_ms = 0 if self.num_active else self.settings.idle_block_ms
        for entry in await self._store.read_inbox(self.settings.instance_id, free, block_ms):
            await self._accept(entry)

    async def _accept(self, entry: InboxEntry) -> None:
        ctx = await self._context(entry.job_id)
        if ctx is None or entry.trajectory.trajectory_id in ctx.active:
            await self._store.ack(self.settings.instance_id, entry.entry_id)
            return
        traj = entry.trajectory
        traj.instance_id = self.settings.instance_id
        traj.bucket = self.settings.bucket
        act = _Active(entry, traj)
        try:
            ctx.agent.start(traj)
        except ValueError as exc:  # a prompt this job's agent cannot render (or no agent)
            ctx.active[traj.trajectory_id] = act
            await self._fail(ctx, act, str(exc) if isinstance(exc, AgentUnavailable)
                             else f"prompt: {exc}")
            return
        if traj.partial_turn_tokens:  # interrupted where it was handed over: resume it
            act.turn_prefix = traj.token_ids[-traj.partial_turn_tokens:]
            traj.partial_turn_tokens = 0
        ctx.active[traj.trajectory_id] = act
        if getattr(ctx.agent, "awaits_first_call", False) and not traj.token_ids:
            act.ready = False  # an episode: its program's first call is its prompt
            self._spawn(self._call_tool(ctx, act, agent.TurnOutcome()))

    async def _context(self, job_id: str) -> _JobContext | None:
        if self._job is not None and self._job[0] == job_id:
            return self._job[1]
        spec_json = await self._store.job_spec_json(job_id)
        policy = await self._store.policy(job_id)
        if spec_json is None or policy is None:
            logger.warning("[job] task for unknown or unpublished job_id=%s dropped", job_id)
            return None
        spec = job_spec_from_json(spec_json)
        # The bucket this instance serves fixes its parallelism (vLLM tensor_parallel_size)
        # and its engine batch (the instance's own cap still applies).
        bucket = next((b for b in spec.layout.buckets if b.name == self.settings.bucket), None)
        tp_degree = bucket.tp_degree if bucket else 1
        max_batch = min(self.settings.max_batch_size,
                        bucket.max_batch_size if bucket else self.settings.max_batch_size)
        engine, tokenizer = await asyncio.to_thread(self._loader.load, policy.model_dir, policy,
                                                    tp_degree, spec.model)
        job_agent = await asyncio.to_thread(build_agent_or_stand_in, spec, tokenizer)
        if isinstance(job_agent, ExternalAgent) and self._episodes is not None:
            job_agent.attach(self._episodes)
        await self._load_verified(job_id, engine, policy)
        self._job = (job_id, _JobContext(spec, engine, job_agent, max_batch))
        logger.info("[job] serving job_id=%s policy_version=%d max_batch_size=%d", job_id,
                    engine.policy_version, max_batch)
        return self._job[1]

    async def _refresh_weights(self, job_id: str, ctx: _JobContext) -> None:
        if await self._store.job_state(job_id) in ("succeeded", "failed", "cancelled"):
            # The job ended: what is still running here will never be trained on.
            for act in list(ctx.active.values()):  # tasks pop from it meanwhile
                await self._store.ack(self.settings.instance_id, act.entry.entry_id)
            ctx.active.clear()
            self._job = None
            await self._store.leave_weights(job_id, self.settings.instance_id)
            return
        policy = await self._store.policy(job_id)
        if policy is not None and policy.version > ctx.engine.policy_version:
            await self._load_verified(job_id, ctx.engine, policy)

    async def _load_verified(self, job_id: str, engine: Engine, policy: t.PolicyInfo) -> None:
        """Load weights only when their checksum matches; otherwise keep serving the old.

        The versions held and fetched are announced around the load, so the trainer
        never prunes a file this instance is still reading (a slow reload keeps it)."""
        if (job_id, policy.version, policy.sha256) in self._rejected:
            return
        instance = self.settings.instance_id
        await self._store.report_weights(job_id, instance, engine.policy_version,
                                         policy.version)
        try:
            await self._load_checked(job_id, engine, policy)
        finally:
            await self._store.report_weights(job_id, instance, engine.policy_version, -1)

    async def _load_checked(self, job_id: str, engine: Engine, policy: t.PolicyInfo) -> None:
        key = (job_id, policy.version, policy.sha256)
        if policy.weights_path.endswith(MANIFEST_SUFFIX):
            await self._load_manifest(job_id, engine, policy)
            return
        try:
            digest = await asyncio.to_thread(sha256_file, Path(policy.weights_path))
        except OSError:  # missing or unreadable: as untrustworthy as a wrong checksum
            digest = ""
        if digest != policy.sha256:
            self._rejected.add(key)
            logger.error("[weights] checksum mismatch version=%d path=%s", policy.version,
                         policy.weights_path)
            await self._store.record_event(job_id, "weights_checksum_mismatch",
                                           version=str(policy.version),
                                           instance=self.settings.instance_id)
            return
        await asyncio.to_thread(engine.load_weights, policy.weights_path, policy.version)

    async def _load_manifest(self, job_id: str, engine: Engine, policy: t.PolicyInfo) -> None:
        """Fetch and verify a chunked version within the deadline, then swap it in whole.

        Only the fetch runs under the deadline: the swap itself is one in-memory
        ``load_state_dict`` between engine calls, so a model is never half old, half new.
        A refused version is reported once (error event) and the old weights keep serving
        until a newer version is published.
        """
        key = (job_id, policy.version, policy.sha256)
        started = time.perf_counter()
        try:
            data = await asyncio.wait_for(
                asyncio.to_thread(read_verified, Path(policy.weights_path), policy.sha256),
                self.settings.weight_load_deadline_s)
        except (WeightSyncError, TimeoutError) as exc:
            self._rejected.add(key)
            kind = ("weights_load_timeout" if isinstance(exc, TimeoutError)
                    else "weights_checksum_mismatch")
            logger.error("[weights] %s version=%d error=%s", kind, policy.version, exc)
            await self._store.record_event(job_id, kind, version=str(policy.version),
                                           instance=self.settings.instance_id,
                                           error=str(exc) or kind)
            return
        await asyncio.to_thread(engine.load_weights_bytes, data, policy.version)
        reload_s = time.perf_counter() - started
        await self._store.record_event(job_id, "weights_loaded", version=str(policy.version),
                                       instance=self.settings.instance_id,
                                       reload_s=f"{reload_s:.4f}",
                                       size_bytes=str(len(data)))

    async def _step(self, job_id: str, ctx: _JobContext) -> bool:
        ready = [a for a in ctx.active.values() if a.ready][: ctx.max_batch_size]
        if not ready:
            return False
        requests, batch = [], []
        for act in ready:
            act.ready = False  # in this engine call (or leaving) until its turn is done
            if self._hand_off_if_due(ctx, act):
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
                self._spawn(self._finish(ctx, act, final_answer=answer))
            else:
                requests.append(request)
                batch.append(act)
        if not requests:
            return True
        for row, act in enumerate(batch):
            act.row = row
        self._stepping = True
        try:
            results = await self._generate(job_id, ctx, requests)
        finally:
            self._stepping = False
            for act in batch:
                act.row = None
        for act, result in zip(batch, results, strict=True):
            self.tokens_generated += len(result.token_ids)
            self._after_turn(ctx, act, result)
        self.profile.end_pass()
        return True

    async def _generate(self, job_id: str, ctx: _JobContext,
                        requests: list[GenerationRequest]) -> list[GenerationResult]:
        """One engine call, aborted at a token boundary if a newer policy is published."""
        watcher = asyncio.create_task(self._abort_on_new_policy(job_id, ctx))
        try:
            return await self.profile.engine_call(ctx.engine, requests)
        finally:
            watcher.cancel()

    async def _abort_on_new_policy(self, job_id: str, ctx: _JobContext) -> None:
        while True:
            await asyncio.sleep(self.settings.policy_poll_s)
            policy = await self._store.policy(job_id)
            if (policy is not None and policy.version > ctx.engine.policy_version
                    and (job_id, policy.version, policy.sha256) not in self._rejected):
                logger.debug("[weights] aborting engine call for version=%d", policy.version)
                ctx.engine.abort()
                return

    def _after_turn(self, ctx: _JobContext, act: _Active, result: GenerationResult) -> None:
        if result.finish_reason == "aborted":
            # Not a finished turn: keep the tokens and resume it on the new weights next
            # pass, or on the target instance when it was stopped for a move.
            agent.apply_partial(act.traj, result)
            act.turn_prefix.extend(result.token_ids)
            if self._hand_off_if_due(ctx, act):
                self.num_moves_mid_turn += 1
            else:
                act.ready = True
            return
        outcome = ctx.agent.apply_generation(act.traj, result, act.turn_prefix)
        act.turn_prefix = []
        if outcome.finished or not (outcome.calls or outcome.errors):
            self._spawn(self._finish(ctx, act, outcome.final_answer))
        else:
            self._spawn(self._call_tool(ctx, act, outcome))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(self.profile.task(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- per-trajectory steps (run as tasks) ------------------------------------------------

    async def _call_tool(self, ctx: _JobContext, act: _Active, outcome: agent.TurnOutcome) -> None:
        traj = act.traj
        # An external agent's "tool" is its program's next call (external_agent.py).
        run_turn = getattr(ctx.agent, "run_turn", None) or self._tool_calls.run_turn
        try:
            results = await self.profile.timed(
                "tool", run_turn(ctx.spec, traj, outcome), traj.trajectory_id)
        except LibraError as exc:
            await self._fail(ctx, act, str(exc) if isinstance(exc, EpisodeEnded)
                             else f"tool gateway: {exc}")
            return
        ctx.agent.apply_tool_results(traj, results)
        # Every return extends the trajectory's causal path; the decision that counts is
        # the last one's (the earlier ones' decisions land like any late decision).
        for item in results[:-1]:
            self._spawn_report(self._apply_decision_later(
                ctx, act, self._report(traj, item.result.state, needs_answer=False)))
        result = results[-1].result
        if act.move is None:
            # Staying is the default: the trajectory goes on here at once, and a MOVE
            # applies when it comes back (mid-turn if need be), so a decision's round
            # trip never holds a trajectory nor the engine.
            self._spawn_report(self._apply_decision_later(
                ctx, act, self._report(traj, result.state, needs_answer=False)))
            self._become_ready(act)
            return
        # A move is pending: the trajectory leaves at this boundary anyway, so take this
        # return's decision first (the policy may now want it elsewhere, or back here).
        started_s = self._clock.now_s()
        self._note_decision(act, await self._decide(
            self._report(traj, result.state, needs_answer=True)))
        self.num_decision_waits += 1
        self.decision_wait_s += self._clock.now_s() - started_s
        if not self._hand_off_if_due(ctx, act):
            self._become_ready(act)

    def _become_ready(self, act: _Active) -> None:
        act.ready = True
        self._wakeup.set()

    async def _finish(self, ctx: _JobContext, act: _Active, final_answer: str | None) -> None:
        traj = act.traj
        if final_answer is not None:
            reward = ctx.spec.reward
            request = t.ScoreInput(
                traj.trajectory_id, reward.name, final_answer, traj.reference,
                ctx.agent.transcript(traj), traj.metadata_json, traj.num_turns,
                reward.options_json())
            try:
                # The gateway times the reward out itself; the RPC waits a little longer
                # so that its answer (naming the reward) arrives first.
                out = await self.profile.timed("score", self._tools.score(
                    request, reward.timeout_s + SCORE_DEADLINE_MARGIN_S), traj.trajectory_id)
            except LibraError as exc:
                # The trainer counts these against reward.max_failures (by the prefix).
                await self._fail(ctx, act, f"{REWARD_FAILURE_PREFIX} {reward.name}: {exc}")
                return
            traj.reward, traj.reward_components = out.reward, dict(out.components)
        traj.final_text = final_answer or ""
        traj.status = t.TrajectoryStatus.FINISHED
        await self._publish(ctx, act)

    async def _fail(self, ctx: _JobContext, act: _Active, reason: str) -> None:
        act.traj.status = t.TrajectoryStatus.FAILED
        act.traj.failure_reason = reason
        logger.warning("[trajectory] failed trajectory_id=%s reason=%s",
                       act.traj.trajectory_id, reason)
        await self._publish(ctx, act)

    async def _publish(self, ctx: _JobContext, act: _Active) -> None:
        traj = act.traj
        traj.finished_at_ms = self._clock.now_ms()
        if ctx.active.pop(traj.trajectory_id, None) is None:
            return  # dropped meanwhile (lease lost): it was re-placed elsewhere
        # Fenced: refused when this instance's lease expired or was granted anew (the
        # scheduler re-placed the trajectory). The scheduler learns the finish from the
        # stream, so there is no call to make here.
        epoch = self._lease.epoch if self._lease else 0
        if not await self.profile.timed("publish", self._store.publish(
                traj, self.settings.instance_id, act.entry.entry_id, epoch), traj.trajectory_id):
            logger.warning("[lease] stale epoch=%d: result of trajectory_id=%s not published",
                           epoch, traj.trajectory_id)


