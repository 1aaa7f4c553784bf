"""Scheduler state in Redis: job specs, live instances, load counters, assignments, and
the placement policy's own state (``RedisPolicyStore``).

The only module of the scheduler that talks to redis. A tick costs one read and at most
one write (plus a read of the pending queue when it is not known: at start and after a
failed write): on a small host every round trip is a wake-up of this process, and its
CPU comes out of some other process's share.

- One Lua call reads the job's status and counters, takes the new finishes from the
  job's trajectory stream, gives their slots back and acknowledges them (atomically),
  and, when the core asks for it, reads every lease and the job's loads.
- One atomic write (a ``ScriptBatch``: one EVALSHA, where a MULTI would answer every
  command) stores what the tick decided: placements (task kept for re-placement,
  assignment, inbox entry, load +1), newly queued trajectories, admitted groups and the
  policy's changed state, so a crash cannot leave a trajectory counted but not queued.

That write's commands and the decoding of the read's reply are in ``tick_codec.py``.

Moves are not written here: the rollout instance commits a move (assignment, load,
counters) when it hands the trajectory off.

Finishes come from the job's trajectory stream (the one the trainer consumes), read
through the scheduler's own consumer group (``keys.SCHEDULER_GROUP``): a rollout
instance makes no call per finished trajectory, and a crash of either side between
publish and release cannot leak a slot (an entry is released and acknowledged by the
same script; one delivered but not acknowledged is read again). The script returns only
the fields the scheduler needs, not the trajectory itself.

The tick script names the lease keys itself (the set of workers is only known inside
it), which a Redis Cluster would refuse: Libra keeps its state on one Redis server.
"""

from __future__ import annotations

from typing import Any

from libra import redis_keys as keys
from libra import types as t
from libra.redis_fields import LEASE_SUMMARY_FIELDS, lease_summary
from libra.redis_shared import JobRecordReader, ensure_consumer_group
from libra.wire.common import decode_trajectory, encode_trajectory
from services.scheduler.redis_policy_store import RedisPolicyStore
from services.scheduler.state import (
    ROLLOUT_ROLES,
    LeaseSnapshot,
    TickState,
    TickWrites,
    lease_snapshot,
)
from services.scheduler.store_protocol import FlushablePolicyStore, SchedulerStore
from services.scheduler.tick_codec import (
    decode_load,
    decode_page,
    finish_record,
    pairs,
    text,
    tick_commands,
)

__all__ = ["ROLLOUT_ROLES", "FlushablePolicyStore", "RedisPolicyStore", "RedisSchedulerStore",
           "SchedulerStore"]

# A finished trajectory gives its slot back: forget its assignment and task and take
# one from its instance's load. Returns that instance, or false when it was not assigned.
_RELEASE_FN_LUA = """
local function release(assignments, tasks, load, traj)
  local instance = redis.call('HGET', assignments, traj)
  if not instance then return false end
  redis.call('HDEL', assignments, traj)
  redis.call('HDEL', tasks, traj)
  redis.call('HINCRBY', load, instance, -1)
  return instance
end
"""

# KEYS: assignments hash, tasks hash, load hash; ARGV[1] = trajectory id.
_RELEASE_LUA = _RELEASE_FN_LUA + "return release(KEYS[1], KEYS[2], KEYS[3], ARGV[1])\n"

# KEYS: 1 assignments, 2 tasks, 3 load, 4 pending queue, 5 counters. ARGV: trajectory
# id, encoded trajectory, ... Re-queues each trajectory still assigned: its slot is given
# back (``release``: the load keeps counting the assignments, also when an instance's
# work is re-queued a page at a time) and it joins the queue. One no longer assigned
# (finished meanwhile) is skipped. Returns the ids re-queued.
_REQUEUE_LUA = _RELEASE_FN_LUA + """
local back = {}
for i = 1, #ARGV, 2 do
  if release(KEYS[1], KEYS[2], KEYS[3], ARGV[i]) then
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
    back[#back + 1] = ARGV[i]
  end
end
if #back > 0 then redis.call('HINCRBY', KEYS[5], 'requeued', #back) end
return back
"""

# Every worker's lease summary, and a digest of them all. ``seen``: the digest the
# caller holds the summaries of; when they are unchanged (the usual case: a snapshot
# every 0.25 s, leases that live for seconds and change only when one comes, goes or
# changes role) no row is returned and the caller keeps its own. At 1,000 instances
# decoding 1,000 rows of 4 fields was most of a snapshot's cost here.
_LEASES_FN_LUA = """
local function lease_rows(workers, prefix, seen, fields)
  local rows, parts = {}, {}
  for _, worker in ipairs(redis.call('SMEMBERS', workers)) do
    local lease = redis.call('HMGET', prefix .. worker, unpack(fields))
    rows[#rows + 1] = {worker, lease[1], lease[2], lease[3]}
    parts[#parts + 1] = table.concat({worker, tostring(lease[1]), tostring(lease[2]),
                                      tostring(lease[3])}, '\\0')
  end
  local digest = redis.sha1hex(table.concat(parts, '\\n'))
  if digest == seen then rows = {} end
  return rows, digest
end
"""

# KEYS: 1 job hash, 2 policy pointer, 3 counters, 4 trajectory stream, 5 assignments,
# 6 tasks, 7 load, 8 workers set. ARGV: 1 consumer group, 2 cursor ('>' or '0'),
# 3 max finishes, 4 '1' to read the leases, 5 the orphan sweep's HSCAN cursor ('': no
# page), 6 its COUNT, 7 lease key prefix, 8 the lease digest the caller holds
# (``lease_rows``), 9.. the lease fields to read (``LEASE_SUMMARY_FIELDS``).
# Returns {job {state, step}, published, counters, finishes, leases, load, read error,
# page {next cursor, flat assignments} or {}, lease digest ('' without leases)}.
# Per finish: {entry id, trajectory id, total tokens, status, the instance whose slot it
# gave back or '', the trajectory's data only when the entry has no total_tokens}; it
# is released (``release``) and acknowledged. Per worker: {id, role, bucket,
# epoch} (role false: the lease expired).
_TICK_LUA = _RELEASE_FN_LUA + _LEASES_FN_LUA + """
local job = redis.call('HMGET', KEYS[1], 'state', 'step')
local published = redis.call('HEXISTS', KEYS[2], 'version')
local counters = redis.call('HGETALL', KEYS[3])
local finishes, read_error = {}, ''
local reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[1], 'COUNT', ARGV[3],
                          'STREAMS', KEYS[4], ARGV[2])
if type(reply) == 'table' and reply.err then
  read_error = reply.err
elseif reply then
  local ids = {}
  for _, entry in ipairs(reply[1][2]) do
    local f = {}
    if entry[2] then
      for i = 1, #entry[2], 2 do f[entry[2][i]] = entry[2][i + 1] end
    end
    local traj, instance = f['trajectory_id'] or '', ''
    if traj ~= '' then instance = release(KEYS[5], KEYS[6], KEYS[7], traj) or '' end
    local data = ''
    if not f['total_tokens'] then data = f['data'] or '' end
    finishes[#finishes + 1] = {entry[1], traj, f['total_tokens'] or '', f['status'] or '',
                               instance, data}
    ids[#ids + 1] = entry[1]
  end
  if #ids > 0 then redis.call('XACK', KEYS[4], ARGV[1], unpack(ids)) end
end
local leases, load, digest = {}, {}, ''
if ARGV[4] == '1' then
  leases, digest = lease_rows(KEYS[8], ARGV[7], ARGV[8], {unpack(ARGV, 9)})
  load = redis.call('HGETALL', KEYS[7])
end
local page = {}
if ARGV[5] ~= '' then page = redis.call('HSCAN', KEYS[5], ARGV[5], 'COUNT', ARGV[6]) end
return {job, published, counters, finishes, leases, load, read_error, page, digest}
"""


# KEYS: 1 workers set, 2 the job's load hash. ARGV: 1 lease key prefix, 2 '1' to read the
# load, 3 the lease digest the caller holds, 4.. the lease fields
# (``LEASE_SUMMARY_FIELDS``). Returns {leases, load, digest} as the tick script does:
# the loop over 1,000 leases runs in Redis, not as 1,000 pipelined commands packed and
# parsed here (93 ms a snapshot at 1,000 instances on a busy host).
_LEASES_LUA = _LEASES_FN_LUA + """
local leases, digest = lease_rows(KEYS[1], ARGV[1], ARGV[3], {unpack(ARGV, 4)})
local load = {}
if ARGV[2] == '1' then load = redis.call('HGETALL', KEYS[2]) end
return {leases, load, digest}
"""


class RedisSchedulerStore(JobRecordReader):
    """``SchedulerStore`` over a bytes-mode ``redis.asyncio`` client."""

    def __init__(self, redis: Any) -> None:
        self._r = redis
        self._release = redis.register_script(_RELEASE_LUA)
        self._tick = redis.register_script(_TICK_LUA)
        self._leases = redis.register_script(_LEASES_LUA)
        self._requeue = redis.register_script(_REQUEUE_LUA)
        # The last lease summaries decoded, and the digest the scripts gave them: sent
        # back, so an unchanged set of leases is not returned again (``lease_rows``).
        self._lease_digest = b""
        self._lease_summaries: list[t.LeaseSummary | None] = []

    async def job_step(self, job_id: str) -> int:
        """The last training step the coordinator recorded for the job (0 before any)."""
        raw = await self._r.hget(keys.job(job_id), "step")
        return int(raw) if raw else 0

    async def tick_state(self, job_id: str, finish_cursor: str, max_finishes: int,
                         with_leases: bool = False,
                         orphan_page: tuple[int, int] | None = None) -> TickState:
        """One round trip: state, step, published?, counters, up to ``max_finishes``
        finishes (slots given back, entries acknowledged) and, ``with_leases``, the
        lease snapshot, and ``orphan_page`` (cursor, count), that HSCAN page of the
        assignments. ``finish_cursor`` is ``0`` (delivered but not acknowledged: after a
        restart) or ``>`` (new entries)."""
        page_cursor, page_count = orphan_page or ("", 0)
        sent = self._lease_digest, self._lease_summaries
        (job, published, counters, finishes, leases, load, read_error, page,
         digest) = await self._tick(
            keys=[keys.job(job_id), keys.policy(job_id), keys.counters(job_id),
                  keys.trajectories(job_id), keys.assignments(job_id), keys.tasks(job_id),
                  keys.load(job_id), keys.WORKERS],
            args=[keys.SCHEDULER_GROUP, finish_cursor, max_finishes,
                  "1" if with_leases else "0", page_cursor, page_count, keys.lease(""),
                  sent[0], *LEASE_SUMMARY_FIELDS])
        if read_error:
            if b"NOGROUP" not in read_error:
                raise RuntimeError(f"reading the finishes of job {job_id}: "
                                   f"{text(read_error)}")
            await self.ensure_finish_group(job_id)  # the stream was deleted meanwhile
        state, step = job
        snapshot = None
        if with_leases:
            snapshot = lease_snapshot(self._summaries(leases, digest, sent),
                                      decode_load(load))
        return TickState(text(state) if state else None, int(step) if step else 0,
                         bool(published), {text(k): int(v) for k, v in pairs(counters)},
                         [finish_record(entry) for entry in finishes], snapshot,
                         None if orphan_page is None else decode_page(page))

    async def ensure_finish_group(self, job_id: str) -> None:
        """The scheduler's consumer group on the job's trajectory stream, from its start."""
        await ensure_consumer_group(self._r, keys.trajectories(job_id), keys.SCHEDULER_GROUP)

    async def open_policy_store(self, job_id: str) -> RedisPolicyStore:
        """The job's policy state, loaded from Redis (empty for a new job)."""
        store = RedisPolicyStore(self._r, job_id)
        await store.load()
        return store

    async def lease_snapshot(self, job_id: str) -> LeaseSnapshot:
        """Every live lease's epoch, and the rollout-role instances with the job's load
        (no load is read for ``job_id`` ``""``: epochs are all the caller needs)."""
        sent = self._lease_digest, self._lease_summaries
        leases, load, digest = await self._leases(
            keys=[keys.WORKERS, keys.load(job_id or "-")],
            args=[keys.lease(""), "1" if job_id else "0", sent[0], *LEASE_SUMMARY_FIELDS])
        return lease_snapshot(self._summaries(leases, digest, sent), decode_load(load))

    def _summaries(self, rows: list[Any], digest: bytes,
                   sent: tuple[bytes, list[t.LeaseSummary | None]],
                   ) -> list[t.LeaseSummary | None]:
        """The lease summaries of a script's reply: the ones ``sent`` (digest and the
        summaries it stands for, taken when the call went out: a concurrent read may
        have replaced them since) when the digest says they are unchanged (then no row
        came), else decoded from ``rows`` and held for the next read."""
        if digest == sent[0]:
            return sent[1]
        summaries = [lease_summary(text(row[0]), row[1:]) for row in rows]
        self._lease_digest, self._lease_summaries = digest, summaries
        return summaries

    async def lease_epoch(self, worker_id: str) -> int | None:
        """One lease's epoch (a report's fence: not the 1,000 leases of a snapshot)."""
        lease = lease_summary(worker_id, await self._r.hmget(keys.lease(worker_id),
                                                             *LEASE_SUMMARY_FIELDS))
        return None if lease is None else lease.epoch

    async def counters(self, job_id: str) -> dict[str, int]:
        raw = await self._r.hgetall(keys.counters(job_id))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def incr_counters(self, job_id: str, **deltas: int) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            for name, delta in deltas.items():
                pipe.hincrby(keys.counters(job_id), name, delta)
            await pipe.execute()

    async def running_jobs(self) -> list[str]:
        ids = [j.decode() for j in await self._r.zrange(keys.JOBS_INDEX, 0, -1)]
        states = [await self.job_state(j) for j in ids]
        return [j for j, state in zip(ids, states, strict=True) if state == "running"]

    async def commit_tick(self, job_id: str, writes: TickWrites,
                          policy_store: FlushablePolicyStore) -> None:
        """A tick's writes and the policy's changes in one atomic batch: placements (from the
        pending queue or of admitted groups), newly queued trajectories and the count
        of admitted groups."""
        await policy_store.flush(also=None if writes.is_empty else
                                 lambda pipe: tick_commands(pipe, job_id, writes))

    async def pending(self, job_id: str) -> list[t.Trajectory]:
        raw = await self._r.hgetall(keys.pending(job_id))
        return [decode_trajectory(v) for _k, v in sorted(raw.items())]

    async def requeue(self, job_id: str, traj: t.Trajectory) -> bool:
        """Move a trajectory from its (dead) instance back to the pending queue."""
        return bool(await self.requeue_many(job_id, [traj]))

    async def requeue_many(self, job_id: str, trajs: list[t.Trajectory]) -> list[str]:
        """Many trajectories back to the pending queue in one script (an instance lost
        with 100 trajectories was 300 round trips one by one), slots given back."""
        if not trajs:
            return []
        back = await self._requeue(
            keys=[keys.assignments(job_id), keys.tasks(job_id), keys.load(job_id),
                  keys.pending(job_id), keys.counters(job_id)],
            args=[x for traj in trajs for x in (traj.trajectory_id, encode_trajectory(traj))])
        return [text(traj_id) for traj_id in back]

    async def tasks_of(self, job_id: str,
                       trajectory_ids: list[str]) -> list[t.Trajectory | None]:
        if not trajectory_ids:
            return []
        raw = await self._r.hmget(keys.tasks(job_id), trajectory_ids)
        return [decode_trajectory(v) if v else None for v in raw]

    async def finish(self, job_id: str, trajectory_id: str) -> str | None:
        """Forget a trajectory's task and assignment; returns the instance it was on."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hget(keys.assignments(job_id), trajectory_id)
            pipe.hdel(keys.tasks(job_id), trajectory_id)
            pipe.hdel(keys.assignments(job_id), trajectory_id)
            instance, _, _ = await pipe.execute()
        return instance.decode() if instance else None

    async def release(self, job_id: str, trajectory_id: str) -> str | None:
        """A finished trajectory gives its slot back: forget it and decrement the load of
        the instance it is assigned to, in one atomic step; None if it was not assigned
        (re-queued meanwhile, or reported twice)."""
        instance = await self._release(
            keys=[keys.assignments(job_id), keys.tasks(job_id), keys.load(job_id)],
            args=[trajectory_id])
        return instance.decode() if instance else None

    async def assignments(self, job_id: str) -> dict[str, str]:
        raw = await self._r.hgetall(keys.assignments(job_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def assignments_page(self, job_id: str, cursor: int,
                               count: int) -> tuple[int, dict[str, str]]:
        """One HSCAN page of the assignments (a 100,000-entry HGETALL blocks Redis and
        this process for tens of ms; a page costs a round trip of about ``count``)."""
        cursor, raw = await self._r.hscan(keys.assignments(job_id), cursor, count=count)
        return int(cursor), {k.decode(): v.decode() for k, v in raw.items()}

    async def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None:
        raw = await self._r.hget(keys.tasks(job_id), trajectory_id)
        return decode_trajectory(raw) if raw else None

    async def forget_instances(self, job_id: str, instance_ids: list[str]) -> None:
        # Their inboxes held what they were running; those tasks are re-placed from
        # `tasks`. Their loads are not touched: the re-queues give the slots back one by
        # one (a sweep finds the assignments a page at a time; deleting a load at the
        # first page let the instance, back with a new lease, be filled past its cap).
        # One DEL for all: a departure sweep's page held ~10 gone instances' work when
        # 10 died at once, a round trip each.
        if instance_ids:
            await self._r.delete(*(keys.inbox(i) for i in instance_ids))

    async def clear_load(self, job_id: str) -> None:
        await self._r.delete(keys.load(job_id))

    async def placement_epochs(self, job_id: str) -> dict[str, int]:
        raw = await self._r.hgetall(keys.placement_epochs(job_id))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def update_placement_epochs(self, job_id: str, epochs: dict[str, int],
                                      gone: list[str]) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            if epochs:
                pipe.hset(keys.placement_epochs(job_id), mapping=epochs)
            if gone:
                pipe.hdel(keys.placement_epochs(job_id), *gone)
            await pipe.execute()
