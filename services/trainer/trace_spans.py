"""The end of a trajectory's trace on the trainer (libra/tracing.py): the training step
is a span of its own, linked both ways with the trajectories it trained on, and each
trajectory's root span ends here, trained or dropped. Pure: through ``libra.tracing``'s
port, a no-op when nothing exports.
"""

from __future__ import annotations

from libra import tracing
from libra import types as t


def trained(job_id: str, step: int, policy_version: int, trajs: list[t.Trajectory],
            started_ms: int, ended_ms: int) -> None:
    """The step that trained on ``trajs``; a "trainer.train" child and the root of each."""
    traced = [tr for tr in trajs if tracing.is_recording(tr.traceparent)]
    if not traced:
        return
    step_span = tracing.record_span(
        "trainer.step", started_ms, ended_ms, links=[tr.traceparent for tr in traced],
        **{"libra.job_id": job_id, "libra.step": step, "libra.policy_version": policy_version,
           "libra.num_trajectories": len(trajs)})
    for tr in traced:
        tracing.record_child("trainer.train", tr.traceparent, started_ms, ended_ms,
                             links=[step_span], **{"libra.step": step,
                                                   "libra.staleness": policy_version
                                                   - tr.min_version})
        _end(tr, ended_ms, "trained", links=[step_span])


def dropped(traj: t.Trajectory, reason: str, now_ms: int) -> None:
    """A trajectory acked without training (``reason``: dropped_stale, dropped_failed)."""
    _end(traj, now_ms, reason, error=traj.failure_reason)


def _end(traj: t.Trajectory, ended_ms: int, outcome: str, *, error: str = "",
         links: list[str] | None = None) -> None:
    tracing.end_trajectory(
        traj.traceparent, traj.created_at_ms, ended_ms, outcome, error=error,
        links=links or (), **{
            "libra.job_id": traj.job_id, "libra.trajectory_id": traj.trajectory_id,
            "libra.group_id": traj.group_id, "libra.prompt_id": traj.prompt_id,
            "libra.reward": traj.reward, "libra.num_turns": traj.num_turns,
            "libra.num_migrations": traj.num_migrations,
            "libra.tokens": traj.num_generated_tokens, "libra.status": traj.status.value})
