"""The rollout core's inbox intake: newly placed trajectories become active ones.

``RolloutCore`` composes an :class:`Intake`. Each pass of the loop it reads up to the
free slots from this instance's inbox, loads the job's engine, agent and weights the
first time a job's trajectory arrives (the job spec is parsed here, once per job served,
and travels on as ``JobContext.spec``), and starts each trajectory: an agent that cannot
render the prompt fails it at once, a turn interrupted by a handover resumes here, and an
external agent's episode begins with its program's first call.

Pure, like the core: the store, the engine loader and the episode channel come in as
collaborators.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from libra.jobspec import JobSpec, job_spec_from_json
from services.rollout.agent_registry import AgentUnavailable, build_agent_or_stand_in
from services.rollout.episode_turn import EpisodeChannel
from services.rollout.external_agent import ExternalAgent
from services.rollout.finisher import Finisher
from services.rollout.loop_types import ActiveTrajectory, EngineLoader, JobContext, RolloutSettings
from services.rollout.weight_loader import WeightLoader

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from services.rollout.store_protocol import InboxEntry, RolloutStore

logger = logging.getLogger(__name__)

ServedJob = tuple[str, JobContext]


class Intake:
    """Inbox -> active trajectories (composed by ``RolloutCore``).

    It sees of the loop only the job served (``job`` / ``serve``), and how to start an
    episode's first tool call (``start_episode``)."""

    def __init__(self, settings: RolloutSettings, store: RolloutStore, loader: EngineLoader,
                 weights: WeightLoader, finisher: Finisher, episodes: EpisodeChannel | None,
                 *, job: Callable[[], ServedJob | None], serve: Callable[[ServedJob], None],
                 start_episode: Callable[[JobContext, ActiveTrajectory], None]) -> None:
        self.settings = settings
        self._store = store
        self.loader = loader
        self._weights = weights
        self._finisher = finisher
        self._episodes = episodes  # the external agent's Redis lists (external_agent.py)
        self._job = job
        self._serve = serve
        self._start_episode = start_episode

    async def pull(self, num_active: int) -> None:
        """Accept up to the free slots' worth of inbox entries."""
        free = self.settings.max_trajectories - num_active
        if free <= 0:
            return
        # Block on the inbox only when nothing is pinned here; otherwise a trajectory
        # whose tool call returns would wait for the inbox instead of its next turn.
        block_ms = 0 if num_active else self.settings.idle_block_ms
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
        act = ActiveTrajectory(entry, traj)
        try:
            ctx.agent.start(traj)
        except ValueError as exc:  # a prompt this job's agent cannot render (or no agent)
            ctx.active[traj.trajectory_id] = act
            await self._finisher.fail(ctx, act, str(exc) if isinstance(exc, AgentUnavailable)
                                      else f"prompt: {exc}")
            return
        if traj.partial_turn_tokens:  # interrupted where it was handed over: resume it
            act.turn_prefix = traj.token_ids[-traj.partial_turn_tokens:]
            traj.partial_turn_tokens = 0
        ctx.active[traj.trajectory_id] = act
        if getattr(ctx.agent, "awaits_first_call", False) and not traj.token_ids:
            act.ready = False  # an episode: its program's first call is its prompt
            self._start_episode(ctx, act)

    async def end_job(self, job_id: str, ctx: JobContext) -> None:
        """The job ended: what is still running here will never be trained on (its
        entries are acked, its episodes stop waiting), and its weights may be pruned."""
        for act in list(ctx.active.values()):  # tasks pop from it meanwhile
            await self._store.ack(self.settings.instance_id, act.entry.entry_id)
        ctx.forget_active()
        await self._store.leave_weights(job_id, self.settings.instance_id)

    async def _context(self, job_id: str) -> JobContext | None:
        served = self._job()
        if served is not None and served[0] == job_id:
            return served[1]
        spec_json = await self._store.job_spec_json(job_id)
        policy = await self._store.policy(job_id)
        if spec_json is None or policy is None:
            logger.warning("[job] task for unknown or unpublished job_id=%s dropped", job_id)
            return None
        spec = job_spec_from_json(spec_json)
        model_dir = await self._weights.model_dir(job_id, policy)
        engine, tokenizer = await asyncio.to_thread(
            self.loader.load, model_dir, policy, self._tp_degree(spec), spec.model)
        job_agent = await asyncio.to_thread(build_agent_or_stand_in, spec, tokenizer)
        if isinstance(job_agent, ExternalAgent) and self._episodes is not None:
            job_agent.attach(self._episodes)
        await self._weights.load_verified(job_id, engine, policy)
        ctx = JobContext(spec, engine, job_agent, self._max_batch_size(spec))
        self._serve((job_id, ctx))
        logger.info("[job] serving job_id=%s policy_version=%d max_batch_size=%d", job_id,
                    engine.policy_version, ctx.max_batch_size)
        return ctx

    # The bucket this instance serves fixes its parallelism (vLLM tensor_parallel_size)
    # and its engine batch (the instance's own cap still applies).

    def _tp_degree(self, spec: JobSpec) -> int:
        bucket = spec.layout.bucket(self.settings.bucket)
        return bucket.tp_degree if bucket else 1

    def _max_batch_size(self, spec: JobSpec) -> int:
        bucket = spec.layout.bucket(self.settings.bucket)
        cap = self.settings.max_batch_size
        return min(cap, bucket.max_batch_size) if bucket else cap
