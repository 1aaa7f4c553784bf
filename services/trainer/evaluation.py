"""The trainer's side of held-out evaluation (pure; rules in libra/evaluation.py).

The trainer is the consumer of the job's trajectory stream, so eval trajectories reach
it too: it routes them here instead of into a training batch (they are acknowledged
and counted as ``eval_consumed``, never as trained or dropped), and each round becomes
an :class:`~libra.evaluation.EvalRecord` once as many trajectories arrived as the
scheduler admitted it with (``eval_size:<round>`` in the job's counters). Routing never
waits: a step trains on the groups it has while a round is still running.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from libra import metrics
from libra import types as t
from libra.clock import Clock
from libra.evaluation import (
    EVAL_EVENT,
    EvalRecord,
    aggregate_round,
    eval_consumed_counter,
    eval_size_counter,
    eval_steps,
)
from libra.jobspec import JobSpec

if TYPE_CHECKING:  # the store's type only: no redis at run time
    from services.trainer.store_protocol import TrainerStore

logger = logging.getLogger(__name__)
Entries = list[tuple[str, t.Trajectory]]


class EvalAccumulator:
    """One job's eval trajectories by round, until each round is recorded."""

    def __init__(self, spec: JobSpec) -> None:
        self._steps = eval_steps(spec.algorithm.num_steps, spec.task.eval_interval)
        self._correct_reward = spec.task.eval_correct_reward
        self._rounds: dict[int, dict[str, t.Trajectory]] = {}
        self._recorded: set[int] = set()

    @property
    def final_round(self) -> int:
        """The round run after the last step (0: eval is off)."""
        return len(self._steps)

    def awaited(self, counters: dict[str, int]) -> bool:
        """True while the final round is not admitted yet or an admitted round has
        trajectories the trainer has not consumed. Rounds are admitted in order, but an
        earlier one may finish after the final one (its trajectories queued behind
        training work): recording it then would cut it short. Counted from the job's
        counters, not this process's memory, so a restarted trainer does not wait for
        rounds an earlier one already took in."""
        if not counters.get(eval_size_counter(self.final_round), 0):
            return True
        return any(counters.get(eval_consumed_counter(r), 0)
                   < counters.get(eval_size_counter(r), 0)
                   for r in range(1, self.final_round + 1))

    def add(self, traj: t.Trajectory) -> bool:
        """Keep an eval trajectory; False for a duplicate (a re-delivery or a zombie
        instance's copy) or one of a round already recorded or unknown."""
        r = traj.eval_round
        if r in self._recorded or not 1 <= r <= len(self._steps):
            return False
        held = self._rounds.setdefault(r, {})
        if traj.trajectory_id in held:
            return False
        held[traj.trajectory_id] = traj
        return True

    def complete(self, counters: dict[str, int]) -> list[EvalRecord]:
        """Records of the rounds whose trajectories are all in (then forgotten)."""
        done = [r for r, held in self._rounds.items()
                if 0 < counters.get(eval_size_counter(r), 0) <= len(held)]
        return [self._record(r, counters) for r in sorted(done)]

    def incomplete(self, counters: dict[str, int]) -> list[EvalRecord]:
        """Records of the rounds still missing trajectories (``is_complete`` false): what
        the job ends with when the final wait timed out."""
        return [self._record(r, counters) for r in sorted(self._rounds)]

    def _record(self, eval_round: int, counters: dict[str, int]) -> EvalRecord:
        held = self._rounds.pop(eval_round)
        self._recorded.add(eval_round)
        trajs = sorted(held.values(), key=lambda tr: tr.trajectory_id)
        return aggregate_round(eval_round, self._steps[eval_round - 1], trajs,
                               num_expected=counters.get(eval_size_counter(eval_round), 0),
                               correct_reward=self._correct_reward)


class EvalRouter:
    """The trainer's consumer side of one job's eval: routes eval entries to their
    rounds, records each complete round as an ``eval`` event, and waits after the last
    step for the final round."""

    def __init__(self, job_id: str, spec: JobSpec, store: TrainerStore, clock: Clock,
                 consumer: str, block_ms: int) -> None:
        self._job_id = job_id
        self._timeout_s = spec.task.eval_timeout_s
        self._store = store
        self._clock = clock
        self._consumer = consumer
        self._block_ms = block_ms
        self.rounds = EvalAccumulator(spec)

    async def take(self, entries: Entries) -> Entries:
        """Take the eval entries of a read (acked, counted ``eval_consumed``, never
        trained or dropped) and record the rounds now complete; returns the training
        entries, in order."""
        evals = [(e, tr) for e, tr in entries if tr.is_eval]
        if evals:
            new = Counter(tr.eval_round for _, tr in evals if self.rounds.add(tr))
            per_round = {eval_consumed_counter(r): n for r, n in new.items()}
            await self._store.consume(self._job_id, [e for e, _ in evals], [],
                                      eval_consumed=new.total(), **per_round)
            for record in self.rounds.complete(await self._store.counters(self._job_id)):
                await self._record(record)
        return [(e, tr) for e, tr in entries if not tr.is_eval]

    async def wait_final(self) -> None:
        """Wait up to ``task.eval_timeout_s`` for the round after the last step (the
        scheduler admits it on seeing that step) and every round admitted before it, so
        the report ends with them; rounds still missing trajectories then are recorded
        as incomplete. Training entries read meanwhile are left unacknowledged: in
        flight at the end, as before."""
        if not self.rounds.final_round:
            return
        deadline_s = self._clock.now_s() + self._timeout_s
        while (self._clock.now_s() < deadline_s
               and self.rounds.awaited(await self._store.counters(self._job_id))):
            await self.take(await self._store.read(self._job_id, self._consumer, 64,
                                                   self._block_ms))
        for record in self.rounds.incomplete(await self._store.counters(self._job_id)):
            await self._record(record)

    async def _record(self, record: EvalRecord) -> None:
        log = logger.info if record.is_complete else logger.warning
        log("[eval] job_id=%s round=%d step=%d samples=%d/%d reward_mean=%.4f "
            "accuracy=%.4f", self._job_id, record.eval_round, record.step,
            record.num_samples, record.num_expected, record.reward_mean, record.accuracy)
        await self._store.record_event(self._job_id, EVAL_EVENT, record=record.to_json())
        score = metrics.gauge("libra_job_eval_score")
        score.labels(self._job_id, "reward_mean").set(record.reward_mean)
        score.labels(self._job_id, "accuracy").set(record.accuracy)
        metrics.gauge("libra_job_eval_round").labels(self._job_id).set(record.eval_round)
