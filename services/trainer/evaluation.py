"""The trainer's side of held-out evaluation (pure; rules in libra/evaluation.py).

The trainer is the consumer of the job's trajectory stream, so eval trajectories reach
it too: it routes them here instead of into a training batch (they are acknowledged
and counted as ``eval_consumed``, never as trained or dropped), and each round becomes
an :class:`~libra.evaluation.EvalRecord` once as many trajectories arrived as the
scheduler admitted it with (``eval_size:<round>`` in the job's counters). Routing never
waits: a step trains on the groups it has while a round is still running.
"""

from __future__ import annotations

from libra import types as t
from libra.evaluation import EvalRecord, aggregate_round, eval_size_counter, eval_steps
from libra.jobspec import JobSpec


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

    def is_recorded(self, eval_round: int) -> bool:
        return eval_round in self._recorded

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
