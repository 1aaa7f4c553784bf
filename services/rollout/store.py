"""Rollout state in Redis: the instance's inbox, job specs, policy pointer, results.

The only module of the rollout service that imports redis. Publishing a finished
trajectory is one Lua script (atomic): check that the instance's lease is still held at
its epoch (fencing: a zombie instance whose lease expired or was granted anew cannot
publish), append to the job's trajectory stream, acknowledge the inbox entry, count it -
so a crash can re-deliver (pending entry) but never lose it; and idempotent per
trajectory id, so a retry whose first try was applied (its reply lost, Redis restarted)
is counted as ``duplicate_publishes``, never appended twice. The stream entry carries
``total_tokens`` and ``status`` beside the trajectory: the scheduler reads them (its
own consumer group) to give the slot back without decoding the trajectory.

Handing a trajectory off to another instance (a MOVE) is one Lua script too, and it is
what commits the move: the scheduler only decides. Fenced like a publish, and only while
the trajectory is still assigned here, it writes the latest state, the entry in the
target's inbox, the ack of this entry, the new assignment, the load change (-1 here,
+1 there) and the migration counters, so assignment and load always say which instance
holds the trajectory, even when a decided move never happens (the trajectory finished
first).
"""

from __future__ import annotations

import logging
from typing import Any

from libra import redis_keys as keys
from libra import types as t
from libra.redis_fields import LEASE_EPOCH_CHECK_LUA
from libra.redis_shared import JobRecordReader, ensure_consumer_group
from libra.wire.common import decode_trajectory, encode_trajectory
from services.rollout.store_protocol import InboxEntry as InboxEntry
from services.rollout.store_protocol import RolloutStore as RolloutStore
from services.rollout.store_protocol import produced_counter

logger = logging.getLogger(__name__)


# KEYS[1] = lease hash, KEYS[2] = trajectory stream, KEYS[3] = inbox, KEYS[4] = counters,
# KEYS[5] = published ids
# ARGV[1] = lease epoch, ARGV[2] = inbox group, ARGV[3] = inbox entry id,
# ARGV[4] = counter field, ARGV[5..] = field/value pairs of the stream entry, starting
# with "trajectory_id", <id>.
# Returns 1 when published, 2 when this trajectory id was published before (the entry is
# acked and the repeat counted, nothing appended), 0 when the lease is gone or held at
# another epoch.
_PUBLISH_LUA = LEASE_EPOCH_CHECK_LUA + """
local is_new = redis.call('SADD', KEYS[5], ARGV[6]) == 1
if is_new then redis.call('XADD', KEYS[2], '*', unpack(ARGV, 5)) end
redis.pcall('XACK', KEYS[3], ARGV[2], ARGV[3])
redis.pcall('XDEL', KEYS[3], ARGV[3])
if not is_new then
  redis.call('HINCRBY', KEYS[4], 'duplicate_publishes', 1)
  return 2
end
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
return 1
"""


# KEYS[1] = lease hash of this instance, KEYS[2] = assignments, KEYS[3] = tasks,
# KEYS[4] = load, KEYS[5] = counters, KEYS[6] = this inbox, KEYS[7] = target inbox
# ARGV[1] = lease epoch, ARGV[2] = trajectory id, ARGV[3] = this instance,
# ARGV[4] = target instance, ARGV[5] = inbox group, ARGV[6] = this inbox entry id,
# ARGV[7] = job id, ARGV[8] = task (serialised trajectory), ARGV[9] = placement counter
# field of the target bucket.
# Returns 1 when handed off, 0 when the lease is gone or held at another epoch, or the
# trajectory is no longer assigned here (re-queued): then nothing is written.
_HANDOFF_LUA = LEASE_EPOCH_CHECK_LUA + """
if redis.call('HGET', KEYS[2], ARGV[2]) ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[8])
redis.call('XADD', KEYS[7], '*', 'job_id', ARGV[7], 'task', ARGV[8])
redis.pcall('XACK', KEYS[6], ARGV[5], ARGV[6])
redis.pcall('XDEL', KEYS[6], ARGV[6])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
redis.call('HINCRBY', KEYS[4], ARGV[3], -1)
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
redis.call('HINCRBY', KEYS[5], 'migrations', 1)
redis.call('HINCRBY', KEYS[5], ARGV[9], 1)
return 1
"""


class RedisRolloutStore(JobRecordReader):
    """``RolloutStore`` over a bytes-mode ``redis.asyncio`` client."""

    def __init__(self, redis: Any) -> None:
        self._r = redis
        self._publish = redis.register_script(_PUBLISH_LUA)
        self._handoff = redis.register_script(_HANDOFF_LUA)

    async def ensure_inbox(self, instance_id: str) -> None:
        await ensure_consumer_group(self._r, keys.inbox(instance_id), keys.ROLLOUT_GROUP)

    async def read_inbox(self, instance_id: str, count: int,
                         block_ms: int) -> list[InboxEntry]:
        stream = keys.inbox(instance_id)
        try:
            reply = await self._r.xreadgroup(keys.ROLLOUT_GROUP, instance_id, {stream: ">"},
                                             count=count, block=block_ms or None)
        except Exception as exc:  # NOGROUP: the scheduler deleted the inbox; recreate
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_inbox(instance_id)
            return []
        entries = []
        for _stream, items in reply or []:
            for entry_id, fields in items:
                entries.append(InboxEntry(entry_id.decode(), fields[b"job_id"].decode(),
                                          decode_trajectory(fields[b"task"])))
        return entries

    async def policy(self, job_id: str) -> t.PolicyInfo | None:
        raw = await self._r.hgetall(keys.policy(job_id))
        if not raw:
            return None
        h = {k.decode(): v.decode() for k, v in raw.items()}
        return t.PolicyInfo(int(h["version"]), h["weights_path"], h["sha256"], h["model_dir"],
                            int(h.get("published_at_ms", 0)))

    async def publish(self, traj: t.Trajectory, instance_id: str, entry_id: str,
                      lease_epoch: int) -> bool:
        """Publish a finished trajectory if this instance still holds its lease at
        ``lease_epoch``; False (nothing written) when fenced off. Idempotent per
        trajectory id: a repeat acks its inbox entry and is counted, not appended."""
        published = await self._publish(
            keys=[keys.lease(instance_id), keys.trajectories(traj.job_id),
                  keys.inbox(instance_id), keys.counters(traj.job_id),
                  keys.published_ids(traj.job_id)],
            args=[str(lease_epoch), keys.ROLLOUT_GROUP, entry_id,
                  produced_counter(traj),
                  "trajectory_id", traj.trajectory_id, "data", encode_trajectory(traj),
                  "total_tokens", str(traj.num_generated_tokens),
                  "status", traj.status.value, "instance_id", instance_id])
        if published == 2:
            logger.info("[publish] repeat of trajectory_id=%s recognised (counted, not "
                        "appended)", traj.trajectory_id)
        return bool(published)

    async def handoff(self, traj: t.Trajectory, instance_id: str, entry_id: str,
                      target_instance: str, target_bucket: str, lease_epoch: int) -> bool:
        """Hand a trajectory to ``target_instance`` and commit the move (assignment,
        load, counters); False (nothing written) when fenced off or re-queued. The task
        keeps the latest state for re-placement should the target die too."""
        job_id = traj.job_id
        handed = await self._handoff(
            keys=[keys.lease(instance_id), keys.assignments(job_id), keys.tasks(job_id),
                  keys.load(job_id), keys.counters(job_id), keys.inbox(instance_id),
                  keys.inbox(target_instance)],
            args=[str(lease_epoch), traj.trajectory_id, instance_id, target_instance,
                  keys.ROLLOUT_GROUP, entry_id, job_id, encode_trajectory(traj),
                  keys.placed_counter(target_bucket)])
        return bool(handed)

    async def hand_back(self, traj: t.Trajectory, instance_id: str, entry_id: str) -> None:
        """Leave a trajectory's latest state for the scheduler (this instance is being
        lent to training): it re-queues it from there once the lease role changes."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(keys.tasks(traj.job_id), traj.trajectory_id, encode_trajectory(traj))
            pipe.xack(keys.inbox(instance_id), keys.ROLLOUT_GROUP, entry_id)
            pipe.xdel(keys.inbox(instance_id), entry_id)
            await pipe.execute()

    async def clear_inbox(self, instance_id: str) -> None:
        """Drop whatever was placed here before a lend: the scheduler re-queued it."""
        inbox = keys.inbox(instance_id)
        entries = await self._r.xrange(inbox)
        if entries:
            ids = [entry_id for entry_id, _ in entries]
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.xack(inbox, keys.ROLLOUT_GROUP, *ids)
                pipe.xdel(inbox, *ids)
                await pipe.execute()

    async def ack(self, instance_id: str, entry_id: str) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.xack(keys.inbox(instance_id), keys.ROLLOUT_GROUP, entry_id)
            pipe.xdel(keys.inbox(instance_id), entry_id)
            await pipe.execute()

    async def count(self, job_id: str, name: str) -> None:
        await self._r.hincrby(keys.counters(job_id), name, 1)

    async def record_event(self, job_id: str, kind: str, **fields: str) -> None:
        await self._r.xadd(keys.events(job_id), {"kind": kind, **fields},
                           maxlen=keys.EVENTS_MAXLEN, approximate=True)

    async def report_weights(self, job_id: str, instance_id: str, loaded: int,
                             loading: int) -> None:
        """Say which versions this instance holds and fetches (-1: none), so the
        trainer keeps their files when it prunes old versions."""
        await self._r.hset(keys.weights_in_use(job_id), instance_id, f"{loaded} {loading}")

    async def leave_weights(self, job_id: str, instance_id: str) -> None:
        """This instance no longer serves the job: its versions may be pruned."""
        await self._r.hdel(keys.weights_in_use(job_id), instance_id)
