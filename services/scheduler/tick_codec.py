"""The scheduler store's translation between a tick and Redis: the commands that queue
what a tick decided, and the decoding of what the tick script answers.

Kept apart from ``store.py``, which holds the round trips themselves (the Lua scripts
and the calls that run them): this module only turns ``TickWrites`` into commands on a
pipeline (the policy store's atomic batch executes them) and a script's reply into
``FinishRecord``s, loads and pages. It sends nothing.
"""

from __future__ import annotations

import collections
from typing import Any

from libra import redis_keys as keys
from libra import types as t
from libra.evaluation import EVAL_ROUNDS_COUNTER, eval_size_counter
from libra.wire.common import decode_trajectory, encode_trajectory
from services.scheduler.state import FinishRecord, TickWrites


def tick_commands(pipe: Any, job_id: str, writes: TickWrites) -> None:
    """Queue a tick's writes on ``pipe``: placements, newly queued trajectories, the
    admitted groups' counts and an eval round's size."""
    if writes.placed_from_pending:
        pipe.hdel(keys.pending(job_id), *(tr.trajectory_id for tr in writes.placed_from_pending))
    if writes.queued:
        pipe.hset(keys.pending(job_id), mapping={
            traj.trajectory_id: encode_trajectory(traj) for traj in writes.queued})
    place_commands(pipe, job_id, writes.placed_from_pending + writes.placed)
    if writes.num_groups:
        pipe.hincrby(keys.counters(job_id), "admitted_groups", writes.num_groups)
        pipe.hincrby(keys.counters(job_id), "admitted", sum(
            not tr.is_eval for tr in writes.queued + writes.placed))
    if writes.eval_round:
        # With the round's trajectories: the trainer learns its size, and a restarted
        # scheduler does not admit it again.
        pipe.hset(keys.counters(job_id), mapping={
            EVAL_ROUNDS_COUNTER: writes.eval_round,
            eval_size_counter(writes.eval_round): writes.eval_size})


def place_commands(pipe: Any, job_id: str, trajs: list[t.Trajectory]) -> None:
    """Queue the placement of ``trajs`` (``instance_id`` set): one command per hash and
    per counter for all of them, one inbox entry each."""
    if not trajs:
        return
    data = {traj.trajectory_id: encode_trajectory(traj) for traj in trajs}
    pipe.hset(keys.tasks(job_id), mapping=data)
    pipe.hset(keys.assignments(job_id),
              mapping={traj.trajectory_id: traj.instance_id for traj in trajs})
    for traj in trajs:
        pipe.xadd(keys.inbox(traj.instance_id),
                  {"job_id": job_id, "task": data[traj.trajectory_id]})
    for instance_id, count in collections.Counter(tr.instance_id for tr in trajs).items():
        pipe.hincrby(keys.load(job_id), instance_id, count)
    for bucket, count in collections.Counter(tr.bucket for tr in trajs).items():
        pipe.hincrby(keys.counters(job_id), keys.placed_counter(bucket), count)


def finish_record(entry: list[bytes]) -> FinishRecord:
    """A finish as the tick script returns it. The rollout writes ``total_tokens`` and
    ``status`` beside the trajectory; an entry without them comes with the trajectory,
    decoded here. One without fields (deleted after delivery) has nothing to learn."""
    entry_id, traj_id, total_tokens, status, instance, data = entry
    released = text(instance) or None
    if data:
        traj = decode_trajectory(data)
        return FinishRecord(text(entry_id), traj.trajectory_id, traj.num_generated_tokens,
                            traj.status, released)
    if not traj_id or not total_tokens:
        return FinishRecord(text(entry_id), text(traj_id), 0, t.TrajectoryStatus.FAILED,
                            released)
    return FinishRecord(text(entry_id), text(traj_id), int(total_tokens),
                        t.TrajectoryStatus(text(status)), released)


def decode_load(value: Any) -> dict[str, int]:
    """The job's load hash: instance id -> trajectories assigned."""
    return {text(k): int(v) for k, v in pairs(value)}


def decode_page(reply: Any) -> tuple[int, dict[str, str]]:
    """An HSCAN reply of the assignments: the next cursor and the page, decoded. Each
    instance id is decoded once (a page of 2,000 names about 20 instances): at 100,000
    in flight a page is read every tick, and decoding it field by field was 2/3 of the
    sweep's cost (cProfile)."""
    flat = reply[1]
    if isinstance(flat, dict):
        flat = [x for kv in flat.items() for x in kv]
    names: dict[Any, str] = {}
    page = {}
    for key, value in zip(flat[::2], flat[1::2], strict=True):
        name = names.get(value)
        if name is None:
            name = names[value] = text(value)
        page[key.decode() if isinstance(key, bytes) else key] = name
    return int(reply[0]), page


def pairs(value: Any) -> list[tuple[Any, Any]]:
    """A hash's (field, value) pairs: from redis-py's dict, or a script's flat list."""
    if isinstance(value, dict):
        return list(value.items())
    return list(zip(value[::2], value[1::2], strict=True))


def text(value: str | bytes) -> str:
    """A reply's string, as bytes (redis-py's bytes mode) or already decoded."""
    return value.decode() if isinstance(value, bytes) else value
