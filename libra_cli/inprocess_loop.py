"""One readable loop: the five service cores wired in one process (``libra run --in-process``).

Read this first. It only wires: every line of logic is the services' own, reached
through their in-process clients (``services/*/inprocess.py``), which do what the
servicers do between the wire and a core. The path of one trajectory:

1. admit: the scheduler's tick (``services/scheduler/core.py`` ``_tick``) admits a
   group of ``samples_per_prompt`` trajectories under the staleness budget
   (``services/scheduler/admission.py``), once the trainer has published version 0.
2. place: the job's policy picks an instance's bucket (``services/scheduler/placement.py``,
   ``scheduling/policy/``); the store writes it to that instance's inbox.
3. generate: the rollout instance reads its inbox and samples one turn for every ready
   trajectory in one engine call (``services/rollout/core.py`` ``run``/``_step``,
   ``services/rollout/torch_engine.py``); the agent parses the turn
   (``services/rollout/agent.py``).
4. tool: each call goes to the gateway (``services/rollout/tool_calls.py`` ->
   ``services/toolgateway/core.py`` ``execute`` ->
   ``services/toolgateway/tools/calculator.py``).
5. decide: the tool return's causal state goes to the scheduler, whose policy says stay
   or move (``services/rollout/mover.py`` -> ``services/scheduler/core.py``
   ``report_tool_returns``); a move is a fenced handoff to another inbox.
6. score: the final answer is scored by the job's reward
   (``services/rollout/finisher.py`` -> ``services/toolgateway/core.py`` ``score``).
7. collect: the finished trajectory is published to the job's stream; the trainer
   gathers complete groups, dropping stale or failed ones
   (``services/trainer/batch_collector.py``, ``services/trainer/grpo.py``).
8. train: group-normalised advantages and one PPO step (``services/trainer/core.py``
   ``_train_on``, ``libra/training/torch_backend.py``, ``libra/training/loss.py``).
9. publish: new weights and the policy pointer (``services/trainer/publishing.py``); the
   rollout loads them between engine calls (``services/rollout/weight_loader.py``), and
   the step record goes to the coordinator (``services/coordinator/core.py``
   ``report_step``). After ``num_steps`` the trainer reports the job's end there too.

Stores: ONE embedded redis-server (``libra_cli/redis_server.py``) with the services' Redis
stores, not the in-memory ones: each memory store fakes the others' writes
(``MemoryTrainerStore.append`` plays the rollout's publish, ``MemoryRolloutStore.place``
the scheduler's placement) and keeps its own counters, so one world of them would be new
code with its own bugs; Redis runs the services' own scripts and the stack's accounting.

Left out: servers, sockets, the REST API, the elastic pool (an ``elastic.enabled`` job
runs without lending, logged) and reconciliation (the trainer cannot be lost alone).
One rollout instance per bucket of the job's layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from libra.clock import SystemClock
from libra.data_roots import DEFAULT_DATA_ROOTS, check_search_corpus, resolve_roots
from libra.jobspec import JobSpec
from libra_cli.redis_server import start_redis
from services.coordinator.core import CoordinatorCore
from services.coordinator.dataset_check import check_dataset
from services.coordinator.init_from_check import check_job_init_from
from services.coordinator.inprocess import InProcessCoordinatorClient
from services.coordinator.model_check import check_job_model
from services.coordinator.store import RedisCoordinatorStore
from services.rollout.backend import TorchEngineLoader
from services.rollout.core import RolloutCore, RolloutSettings
from services.rollout.store import RedisRolloutStore
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.inprocess import InProcessSchedulerClient
from services.scheduler.store import RedisSchedulerStore
from services.toolgateway.__main__ import build_core as build_toolgateway_core
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.inprocess import InProcessToolGatewayClient
from services.trainer.core import TrainerCore
from services.trainer.distributed import make_backend_factory
from services.trainer.inprocess import InProcessTrainerClient
from services.trainer.store import RedisTrainerStore

logger = logging.getLogger(__name__)

# As `libra up` runs them: the scheduler's tick (its config), a SIGTERM's drain (stack.toml).
TICK_S = SchedulerConfig().tick_s
DRAIN_GRACE_S = 10.0


@dataclass
class InProcessStack:
    """What a caller of the loop holds: the public job API and where the state lives."""

    coordinator: InProcessCoordinatorClient
    redis_url: str


class _LateCoordinator:
    """Breaks the cycle coordinator <-> trainer and rollouts (an address, over a network)."""

    client: InProcessCoordinatorClient | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class _OneModelLoadAtATime:
    """transformers' ``from_pretrained`` patches class attributes while it loads
    (``no_init_weights``, ``no_tie_weights``): two loads in threads of one process can
    leave them patched for good (later models untied, not initialised). A service loads
    one model at a time; here the engines' loads and the trainer's build take turns."""

    def __init__(self, inner: Any, lock: threading.Lock) -> None:
        self._inner, self._lock = inner, lock

    def __getattr__(self, name: str) -> Any:  # the loader's load, the factory's create
        def locked(*args: Any) -> Any:
            with self._lock:
                return getattr(self._inner, name)(*args)
        return locked


@contextlib.asynccontextmanager
async def in_process_stack(run_root: Path, spec: JobSpec) -> AsyncIterator[InProcessStack]:
    """Redis and the five cores, wired as ``libra up`` wires the services; stopped on exit
    (what was started is stopped in reverse order, also when wiring fails half-way)."""
    async with contextlib.AsyncExitStack() as exits:
        server = start_redis(run_root / ".libra" / "inprocess-redis", appendonly=False)
        exits.callback(server.stop)
        text = aioredis.from_url(server.url, decode_responses=True)  # the coordinator's
        exits.push_async_callback(text.aclose)
        raw = aioredis.from_url(server.url, decode_responses=False)  # the other stores'
        exits.push_async_callback(raw.aclose)
        clock, coordinator_api, models = SystemClock(), _LateCoordinator(), threading.Lock()
        scheduler = SchedulerCore(RedisSchedulerStore(raw), clock, tick_s=TICK_S,
                                  lease_snapshot_s=5 * TICK_S)
        gateway = InProcessToolGatewayClient(build_toolgateway_core(ToolGatewayConfig()))
        trainer = TrainerCore(RedisTrainerStore(raw), _OneModelLoadAtATime(
            make_backend_factory(1, 1), models), coordinator_api, clock, consumer="trainer-0")
        roots = resolve_roots(DEFAULT_DATA_ROOTS)
        coordinator = CoordinatorCore(
            RedisCoordinatorStore(text, clock), InProcessTrainerClient(trainer),
            InProcessSchedulerClient(scheduler), clock, run_root,
            model_check=check_job_model, dataset_check=check_dataset,
            init_from_check=check_job_init_from, tool_catalog=gateway,
            corpus_check=lambda job: check_search_corpus(job.tools.search_corpus, roots))
        coordinator_api.client = InProcessCoordinatorClient(coordinator)
        rollouts = [RolloutCore(
            RolloutSettings(instance_id=f"rollout-{i}", bucket=bucket.name,
                            address=f"in-process/rollout-{i}",
                            max_batch_size=bucket.max_batch_size,
                            max_trajectories=bucket.max_trajectories_per_instance),
            RedisRolloutStore(raw), _OneModelLoadAtATime(TorchEngineLoader(), models), gateway,
            InProcessSchedulerClient(scheduler), coordinator_api, clock)
            for i, bucket in enumerate(spec.layout.buckets)]
        loops: list[asyncio.Task] = []
        exits.push_async_callback(_stop, trainer, scheduler, rollouts, loops)
        for rollout in rollouts:  # as each rollout's __main__ does once it serves
            await rollout.register()
        loops += [asyncio.create_task(core.run()) for core in (scheduler, *rollouts)]
        for task in loops:
            task.add_done_callback(_log_crash)
        yield InProcessStack(coordinator_api.client, server.url)


def _log_crash(task: asyncio.Task) -> None:
    """A service would exit on its loop's crash; here the job would only stall: say why."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("[loop] a core's loop crashed", exc_info=task.exception())


async def _stop(trainer: TrainerCore, scheduler: SchedulerCore,
                rollouts: list[RolloutCore], loops: list[asyncio.Task]) -> None:
    """The drains a SIGTERM runs in each service, then the loops end."""
    await trainer.drain(DRAIN_GRACE_S)
    await scheduler.drain(DRAIN_GRACE_S)
    await asyncio.gather(*(rollout.drain(DRAIN_GRACE_S) for rollout in rollouts))
    for task in loops:
        task.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
