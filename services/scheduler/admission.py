"""Admission of prompt groups and eval rounds under the staleness budget (pure).

A new group is admitted only while ``admitted_groups - consumed_groups <
(max_staleness + 1) * prompts_per_step``; an eval round that came due is admitted first
and outside the budget (services/scheduler/evaluation.py). What finds no place is queued
here: at most one group beyond capacity.
"""

from __future__ import annotations

import logging

from libra import tracing
from libra import types as t
from libra.clock import Clock
from libra.data import DatasetRow
from libra.ids import group_id, trajectory_id
from services.scheduler.evaluation import make_eval_round, round_to_admit
from services.scheduler.job_run import JobRun
from services.scheduler.placement import assign
from services.scheduler.state import TickWrites

# The core's logger: operators grep one logger name for the scheduler's decisions.
logger = logging.getLogger("services.scheduler.core")


class Admission:
    """Draws prompt groups from the job's dataset and admits them (needs only a clock)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def admit(self, run: JobRun, counters: dict[str, int], writes: TickWrites,
              max_trajectories: int | None = None) -> None:
        """Admit groups while the staleness budget allows and the instances take them,
        stopping before ``max_trajectories`` would be passed (at least one group is
        admitted when the budget allows: a group larger than the bound still goes)."""
        algo = run.spec.algorithm
        budget_groups = (algo.max_staleness + 1) * algo.prompts_per_step
        consumed = counters.get("trained_groups", 0) + counters.get("dropped_groups", 0)
        admitted = counters.get("admitted_groups", 0)
        num_groups, placed, queued = 0, [], []
        # Stop once a group does not fit: queue at most one group beyond capacity.
        group_size = algo.samples_per_prompt
        while admitted - consumed < budget_groups and not run.pending:
            if (num_groups and max_trajectories is not None
                    and len(placed) + len(queued) + group_size > max_trajectories):
                writes.is_capped = True  # the budget and the instances take more
                break
            group = self.make_group(run, admitted)
            placed += _traced_placements(assign(run, group, run.instances),
                                         self._clock.now_ms())
            unplaced = [traj for traj in group if not traj.instance_id]
            queued += unplaced
            admitted += 1
            num_groups += 1
            run.pending = {traj.trajectory_id: traj for traj in unplaced}
        writes.queued += queued
        writes.placed += placed
        writes.num_groups += num_groups

    def admit_eval(self, run: JobRun, step: int, counters: dict[str, int],
                   writes: TickWrites) -> None:
        """Admit the eval round that came due, if any (first in line)."""
        eval_round = round_to_admit(run.eval_steps, counters, step)
        if not eval_round or not run.eval_rows or run.pending is None:
            return
        trajs = make_eval_round(run.job_id, run.spec, eval_round, run.eval_rows,
                                self._clock.now_ms())
        placed = assign(run, trajs, run.instances)
        unplaced = [traj for traj in trajs if not traj.instance_id]
        writes.placed += placed
        writes.queued += unplaced
        run.pending.update((traj.trajectory_id, traj) for traj in unplaced)
        writes.eval_round, writes.eval_size = eval_round, len(trajs)
        logger.info("[eval] admitted round job_id=%s round=%d step=%d trajectories=%d",
                    run.job_id, eval_round, step, len(trajs))

    def make_group(self, run: JobRun, group_index: int) -> list[t.Trajectory]:
        """The trajectories of group ``group_index`` (one per sample of its prompt)."""
        # The group index is the cumulative admission count, so prompts continue where a
        # previous scheduler process stopped.
        run.next_group = max(run.next_group, group_index)
        row = _next_row(run)
        gid = group_id(run.job_id, group_index, row.prompt_id)
        now_ms = self._clock.now_ms()
        algo = run.spec.algorithm
        # Traced or not is decided here, once: the traceparent's flag tells every service.
        ratio = tracing.effective_sample_ratio(run.spec.observability.trace_sample_ratio,
                                               algo.prompts_per_step * algo.samples_per_prompt)
        ids = [trajectory_id(gid, sample) for sample in range(algo.samples_per_prompt)]
        return [t.Trajectory(
            trajectory_id=tid, job_id=t.JobId(run.job_id),
            group_id=gid, prompt_id=row.prompt_id, prompt_text=row.prompt_text,
            reference=row.reference, prompt_messages_json=row.prompt_messages_json,
            metadata_json=row.metadata_json, created_at_ms=now_ms,
            traceparent=tracing.new_traceparent(tracing.is_sampled(tid, ratio)))
            for tid in ids]


def _traced_placements(placed: list[t.Trajectory], now_ms: int) -> list[t.Trajectory]:
    """The admission's placement decision, as a span of each traced trajectory."""
    for traj in placed:
        tracing.record_child("scheduler.place", traj.traceparent, traj.created_at_ms, now_ms,
                             **{"libra.job_id": traj.job_id, "libra.to_bucket": traj.bucket,
                                "libra.to_instance": traj.instance_id,
                                "libra.reason": "admission"})
    return placed


def _next_row(run: JobRun) -> DatasetRow:
    # Epoch-wise shuffle so every prompt recurs (the prefix tree learns per prompt).
    # A row that cannot be rendered (the submit check renders only the first rows) is
    # skipped and counted instead of stalling the job.
    drawn = run.prompts.draw_renderable(run.next_group)
    run.next_group += drawn.num_draws
    for error in drawn.skipped:
        run.num_skipped_rows += 1
        logger.warning("[dataset] skipped a row that cannot be rendered job_id=%s "
                       "error=%s", run.job_id, error)
    return drawn.row
