"""Record a trace from a real ``libra run``: finished trajectories -> trace JSONL.

Sources: the job's Redis stream of finished trajectories (``libra.redis_keys.
trajectories(job_id)``, serialised ``common.v1.Trajectory``), or a dump of such
bytes / ``Trajectory`` objects. Per trajectory:

- turns come from the loss mask after the prompt: each run of model tokens (mask 1)
  is a turn's output, each run of tool tokens (mask 0) that follows is its tool payload;
- tool type and status come from ``tool_states`` (one per tool return);
- the step is the oldest policy version among the model tokens (``min_version``);
- tool latency is not stored per call: when ``decode_tokens_per_s`` is given, the
  wall time not explained by generation at that speed is split evenly over the calls;
  otherwise latencies are 0 (documented in docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from libra import types as t
from sim.trace import ToolCall, TraceTrajectory, Turn


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """(value, length) runs of a 0/1 list."""
    out: list[tuple[int, int]] = []
    for v in mask:
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out


def from_trajectory(
    traj: t.Trajectory, decode_tokens_per_s: float | None = None
) -> TraceTrajectory | None:
    """Convert one finished trajectory; ``None`` if it has no generated tokens."""
    mask = traj.loss_mask[traj.num_prompt_tokens :]
    runs = _runs(mask)
    while runs and runs[0][0] == 0:  # tool tokens before any output: fold into the prompt
        runs.pop(0)
    outputs: list[int] = []
    payloads: list[int] = []
    for value, length in runs:
        if value == 1:
            if len(outputs) > len(payloads):  # two output runs in a row cannot happen; merge
                outputs[-1] += length
            else:
                outputs.append(length)
        elif outputs:
            payloads.append(length)
    if not outputs:
        return None
    num_tools = len(outputs) - 1
    payloads = payloads[:num_tools] + [0] * max(0, num_tools - len(payloads))
    latency = 0.0
    wall_s = max(0.0, (traj.finished_at_ms - traj.created_at_ms) / 1000.0)
    if decode_tokens_per_s and num_tools:
        latency = max(0.0, wall_s - sum(outputs) / decode_tokens_per_s) / num_tools
    turns = []
    for i, out in enumerate(outputs):
        tool = None
        if i < num_tools:
            state = traj.tool_states[i] if i < len(traj.tool_states) else None
            tool = ToolCall(
                state.tool_type if state else "unknown",
                payloads[i],
                state.status.value if state else "success",
                latency,
            )
        turns.append(Turn(out, tool))
    return TraceTrajectory(
        str(traj.trajectory_id),
        str(traj.prompt_id),
        str(traj.group_id),
        max(0, traj.min_version),
        max(1, traj.num_prompt_tokens),
        tuple(turns),
    )


def from_trajectories(
    trajs: Iterable[t.Trajectory], decode_tokens_per_s: float | None = None
) -> list[TraceTrajectory]:
    """Convert many; failed or empty trajectories are skipped."""
    out = []
    for traj in trajs:
        if traj.status is t.TrajectoryStatus.FAILED:
            continue
        rec = from_trajectory(traj, decode_tokens_per_s)
        if rec is not None:
            out.append(rec)
    return out


def from_stream_entries(
    entries: Iterable[bytes], decode_tokens_per_s: float | None = None
) -> list[TraceTrajectory]:
    """Convert serialised ``common.v1.Trajectory`` bytes (a stream dump)."""
    from libra.wire.common import decode_trajectory

    return from_trajectories((decode_trajectory(b) for b in entries), decode_tokens_per_s)


async def from_redis(
    redis: Any, job_id: str, field: str = "data", decode_tokens_per_s: float | None = None
) -> list[TraceTrajectory]:
    """Read the whole trajectory stream of ``job_id`` (XRANGE) and convert it.

    Args:
        redis: A ``redis.asyncio`` client created with ``decode_responses=False``.
        job_id: The job.
        field: Stream entry field holding the serialised trajectory.
        decode_tokens_per_s: Measured generation speed, to estimate tool latencies.
    """
    from libra import redis_keys

    entries = await redis.xrange(redis_keys.trajectories(job_id))
    blobs = [fields.get(field.encode()) or fields.get(field) for _, fields in entries]
    return from_stream_entries([b for b in blobs if b], decode_tokens_per_s)
