"""The spans a rollout instance records in a trajectory's trace (libra/tracing.py): one
per generated turn, per placement decision, per move and per publish (tool calls: in
``tool_calls.py``). Pure: the spans go through ``libra.tracing``'s port; when the
trajectory is not traced or nothing exports, each call returns at once.
"""

from __future__ import annotations

from libra import tracing
from libra import types as t
from services.rollout.engine_types import GenerationResult


def turn(traj: t.Trajectory, instance_id: str, bucket: str, batch_size: int,
         result: GenerationResult, started_ms: int, ended_ms: int) -> None:
    """One turn's generation (or the part of it before an interruption)."""
    if not tracing.is_recording(traj.traceparent):
        return
    tracing.record_child("rollout.generate", traj.traceparent, started_ms, ended_ms, **{
        "libra.instance": instance_id, "libra.bucket": bucket,
        "libra.turn": traj.num_turns, "libra.batch_size": batch_size,
        "libra.tokens": len(result.token_ids), "libra.policy_version": result.policy_version,
        "libra.finish_reason": result.finish_reason})


def decision(traj: t.Trajectory, instance_id: str, state: t.ToolReturnState,
             answer: t.PlacementDecision, started_ms: int, ended_ms: int) -> None:
    """The scheduler's decision at a tool return, timed by the instance that asked."""
    if not tracing.is_recording(traj.traceparent):
        return
    tracing.record_child("scheduler.decision", traj.traceparent, started_ms, ended_ms, **{
        "libra.instance": instance_id, "libra.from_bucket": traj.bucket,
        "libra.tool_state": state.key, "libra.action": answer.action.value,
        "libra.to_bucket": answer.target_bucket, "libra.to_instance": answer.target_instance,
        "libra.reason": answer.reason})


def move(traj: t.Trajectory, instance_id: str, from_bucket: str,
         answer: t.PlacementDecision, started_ms: int, ended_ms: int,
         is_committed: bool) -> None:
    """A handoff to another instance (refused when fenced)."""
    if not tracing.is_recording(traj.traceparent):
        return
    tracing.record_child(
        "rollout.move", traj.traceparent, started_ms, ended_ms,
        error="" if is_committed else "handoff refused (stale lease epoch or re-queued)",
        **{"libra.from_instance": instance_id, "libra.from_bucket": from_bucket,
           "libra.to_instance": answer.target_instance,
           "libra.to_bucket": answer.target_bucket, "libra.reason": answer.reason,
           "libra.partial_turn_tokens": traj.partial_turn_tokens})


def publish(traj: t.Trajectory, instance_id: str, started_ms: int, ended_ms: int,
            is_published: bool) -> None:
    """The finished (or failed) trajectory written to the job's stream."""
    if not tracing.is_recording(traj.traceparent):
        return
    tracing.record_child(
        "rollout.publish", traj.traceparent, started_ms, ended_ms,
        error="" if is_published else "not published: stale lease epoch",
        **{"libra.instance": instance_id, "libra.status": traj.status.value,
           "libra.reward": traj.reward, "libra.num_turns": traj.num_turns,
           "libra.tokens": traj.num_generated_tokens,
           "libra.failure_reason": traj.failure_reason})
