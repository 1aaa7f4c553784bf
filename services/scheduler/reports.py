"""What rollout instances report, handled in memory for the scheduler core (pure): the
fence that refuses a stale instance's report, the policy's stay/move decision on a tool
return, and what a finished trajectory teaches the policy.

Kept apart from ``core.py``, whose RPCs and tick call these: nothing here writes to the
store (the fence alone reads one lease, when its snapshot is behind).

Moves: a MOVE is decided here but committed by the rollout instance when it hands the
trajectory off (one fenced Lua step re-pins assignment and load and counts the
migration; ``services/rollout/store.py``). The instance does not wait for the decision,
so a move can come too late (the trajectory finished first) and then never happens:
Redis, which only the handoff changes, stays right. The decision's load change is
applied at once to this process's snapshot of loads (a reservation on the target, so
caps hold between ticks); for a move that never happens it is off until the next lease
snapshot re-reads the loads.

Fencing: every report carries the reporting instance's lease epoch, checked against the
epochs of the last lease snapshot (that one lease is re-read when a report claims a newer
epoch than the snapshot knows); a stale one is refused with ``FailedPrecondition``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libra import types as t
from libra.errors import FailedPrecondition
from libra.limits import check_id
from scheduling.policy.errors import UnknownTrajectory
from services.scheduler.job_run import JobRun, ToolReturnReport, apply_local_load
from services.scheduler.state import FinishRecord

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from services.scheduler.store_protocol import SchedulerStore


class LeaseFence:
    """The lease epoch of every live worker as of the last lease snapshot; a report
    whose epoch is not its instance's current one is refused."""

    def __init__(self, store: SchedulerStore) -> None:
        self._store = store
        self._epochs: dict[str, int] = {}

    def take(self, epochs: dict[str, int]) -> None:
        """The epochs of a new lease snapshot, replacing what was known."""
        self._epochs = epochs

    async def check(self, instance_id: str, epoch: int) -> None:
        """Refuse a report whose epoch is not the instance's current lease epoch."""
        check_id(instance_id, "instance_id")
        current = self._epochs.get(instance_id)
        behind = current is None or epoch > current  # the snapshot may predate a grant
        if current != epoch and behind:
            # This instance's lease alone (at 1,000 instances a full snapshot per stale
            # report was most of the scheduler's time once leases churned).
            current = await self._store.lease_epoch(instance_id)
            if current is None:
                self._epochs.pop(instance_id, None)
            else:
                self._epochs[instance_id] = current
        if current != epoch:
            held = "no live lease" if current is None else f"current epoch {current}"
            raise FailedPrecondition(
                f"stale lease epoch {epoch} of {instance_id!r} ({held}): report refused")


def decide(run: JobRun, report: ToolReturnReport) -> t.PlacementDecision:
    """The policy's decision, in memory: nothing is written (the instance commits a
    move when it hands the trajectory off); a move's load change is applied to the
    local snapshot of loads."""
    try:
        decision = run.policy.on_tool_return(t.TrajectoryId(report.trajectory_id),
                                             report.state, report.tokens_so_far,
                                             run.instances)
    except UnknownTrajectory:
        run.decisions["unknown"] += 1
        return t.PlacementDecision(t.DecisionAction.STAY, reason="unknown_trajectory")
    run.decisions[decision.reason.value] += 1
    action = t.DecisionAction.MOVE if decision.is_move else t.DecisionAction.STAY
    if decision.is_move:
        apply_local_load(run, decision.load_deltas)
        run.migrations += 1  # decided; the job's ``migrations`` counter counts handoffs
    return t.PlacementDecision(action, decision.to_bucket, decision.to_instance_id,
                               decision.reason.value)


def apply_finishes(run: JobRun, finishes: list[FinishRecord]) -> None:
    """The policy learns from the finishes a tick read (their slots already given back
    in Redis); each one's slot is given back in the local snapshot of loads."""
    if not finishes:
        if run.finish_cursor == "0":
            run.finish_cursor = ">"  # nothing left from before: read new entries
        return
    for finish in finishes:
        if finish.released_from is None:
            continue  # re-queued meanwhile (its slot is given back), or read twice
        learn_finish(run, finish.trajectory_id, finish.total_tokens, finish.status)
        apply_local_load(run, ((finish.released_from, -1),))


def learn_finish(run: JobRun, traj_id: str, total_tokens: int,
                 status: t.TrajectoryStatus) -> None:
    """Tell the policy a trajectory finished (or was aborted)."""
    try:
        if status is t.TrajectoryStatus.FINISHED:
            run.policy.finish(t.TrajectoryId(traj_id), total_tokens)
        else:
            run.policy.abort(t.TrajectoryId(traj_id))
    except UnknownTrajectory:
        pass  # placed by a previous scheduler process whose policy state was lost
