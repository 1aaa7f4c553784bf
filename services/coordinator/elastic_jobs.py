"""Per job, its elastic loop (``elastic.ElasticLoop``): built on the job's first step
report when its spec enables the elastic pool and a planner is wired, fed every new step
record, stopped when the job ends, forgotten when it is resumed. Pure."""

from __future__ import annotations

import logging

from libra import types as t
from libra.clock import Clock
from libra.jobspec import ElasticSpec, job_spec_from_json
from services.coordinator.elastic import ElasticExecutor, ElasticLoop, ElasticWiring
from services.coordinator.store_protocol import CoordinatorStore

logger = logging.getLogger(__name__)


class ElasticJobs:
    """The elastic loops of the coordinator's jobs (``wiring`` None: no planner)."""

    def __init__(self, wiring: ElasticWiring | None, store: CoordinatorStore,
                 clock: Clock) -> None:
        self._wiring = wiring
        self._store = store
        self._clock = clock
        # Per job: its elastic loop, or None when the job is not elastic (cached).
        self._loops: dict[str, ElasticLoop | None] = {}

    def loop(self, job_id: str) -> ElasticLoop | None:
        """The job's elastic loop once it saw a step (None otherwise)."""
        return self._loops.get(job_id)

    def forget(self, job_id: str) -> None:
        """A resumed job plans from scratch: its previous run's loop was stopped."""
        self._loops.pop(job_id, None)

    def stop(self, job_id: str) -> None:
        """The job ended: lent instances go back to rollout (in the background)."""
        if (loop := self._loops.get(job_id)) is not None:
            loop.stop()

    async def feed(self, job: t.Job, record: t.StepRecord) -> None:
        """Plan on a new step record (no-op for a job that is not elastic)."""
        loop = self._loop_of(job)
        if loop is None:
            return
        try:
            await loop.on_step(record)
        except Exception:
            # The planner is advisory: a failure there must not fail the trainer's step
            # report (the step is already stored); it is logged and the next step retries.
            logger.exception("[elastic] planning failed job_id=%s", job.job_id)

    def _loop_of(self, job: t.Job) -> ElasticLoop | None:
        if job.job_id in self._loops:
            return self._loops[job.job_id]
        job_spec = job_spec_from_json(job.spec_json)
        spec = job_spec.elastic
        loop = None
        if spec.enabled and self._wiring is None:
            logger.warning("[elastic] job_id=%s asks for the elastic pool but this "
                           "coordinator has no planner wired; running without", job.job_id)
        elif spec.enabled and self._wiring is not None:
            loop = self._new_loop(job.job_id, spec, job_spec.algorithm.max_staleness,
                                  self._wiring)
        self._loops[job.job_id] = loop
        return loop

    def _new_loop(self, job_id: str, spec: ElasticSpec, max_staleness: int,
                  wiring: ElasticWiring) -> ElasticLoop:
        executor = ElasticExecutor(job_id=job_id, spec=spec, rollouts=wiring.rollouts,
                                   events=self._store, clock=self._clock,
                                   trainer_address=wiring.trainer_address,
                                   rpc_deadline_s=wiring.rpc_deadline_s)
        return ElasticLoop(job_id=job_id, planner=wiring.planner_factory(spec, max_staleness),
                           executor=executor, events=self._store,
                           leases=self._store.live_leases, clock=self._clock)
