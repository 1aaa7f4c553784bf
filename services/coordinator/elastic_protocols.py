"""The elastic hybrid pool's contracts: the planner's signal, the planner, a rollout
instance's lend/reclaim, the events sink, and the wiring ``__main__`` builds. Pure."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from libra import tracing
from libra import types as t
from libra.jobspec import ElasticSpec

logger = logging.getLogger(__name__)

JOIN, RELEASE, HOLD = "join", "release", "hold"


class ElasticSignal(Protocol):
    """What the executor reads from a planner signal."""

    @property
    def action(self) -> str: ...  # "join" | "release" | "hold"

    @property
    def desired(self) -> int: ...  # desired number of hybrid workers (joining + active)

    @property
    def current(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def ttl_step(self) -> int: ...  # the signal is void from this step on


@dataclass(frozen=True, slots=True)
class Signal:
    """A planner signal (the shape ``ElasticSignal`` describes)."""

    action: str
    desired: int
    current: int
    reason: str
    ttl_step: int


class ElasticPlanner(Protocol):
    """Decides, once per trainer step, how many hybrid workers training should have."""

    def observe(self, step_record: dict[str, Any], workers: list[t.Lease],
                pressure: dict[str, float]) -> tuple[dict[str, Any], ElasticSignal | None]:
        """Returns the decision event (``{}`` when nothing was decided) and a fresh signal,
        or ``None`` to keep the previous one until its TTL."""
        ...


class LendReply(Protocol):
    @property
    def lease(self) -> t.Lease: ...

    @property
    def num_handed_back(self) -> int: ...


class RolloutLending(Protocol):
    """What the executor needs from a rollout instance (``libra.clients.rollout``)."""

    async def lend(self, job_id: str, expected_epoch: int, generation: int,
                   trainer_address: str, *, timeout_s: float | None = None) -> LendReply: ...

    async def reclaim(self, generation: int, reason: str, *,
                      timeout_s: float | None = None) -> t.Lease: ...


class EventSink(Protocol):
    async def record_event(self, job_id: str, event: dict[str, Any]) -> None: ...


async def record_quietly(sink: EventSink, job_id: str, event: dict[str, Any]) -> None:
    """Record an event (and a span of it, when traces are exported: libra/tracing.py);
    losing one (events store down) must not stop the executor."""
    tracing.record_event(f"elastic.{event.get('kind', 'event')}",
                         int(event.get("ts_ms", 0)), {"job_id": job_id, **event})
    try:
        await sink.record_event(job_id, event)
    except Exception:  # noqa: BLE001 - the event is logged above; the pass goes on
        logger.warning("[elastic] event not recorded job_id=%s kind=%s", job_id,
                       event.get("kind"), exc_info=True)


@dataclass(frozen=True, slots=True)
class ElasticWiring:
    """What the coordinator needs to run elastic jobs (built in ``__main__``)."""

    planner_factory: Callable[[ElasticSpec, int], ElasticPlanner]
    """Builds a job's planner from its ``[elastic]`` section and ``algorithm.max_staleness``
    (the pipeline depth the planner plans with, as the simulator does)."""
    rollouts: Callable[[str], RolloutLending]  # rollout address -> client
    trainer_address: str  # where lent instances reach the trainer's gradient channel
    rpc_deadline_s: float = 5.0
