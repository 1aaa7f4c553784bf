"""Redis reads, writes and set-up shared by the services' store adapters.

The coordinator owns the job hash; the scheduler, rollout and trainer stores read it
through ``JobRecordReader`` (bytes-mode client). Consumer groups are created once,
idempotently, by ``ensure_consumer_group``. ``ScriptBatch`` writes many commands
atomically in one round trip and one reply.
"""

from __future__ import annotations

import struct
from typing import Any

from libra import redis_keys as keys


class JobRecordReader:
    """Mixin for store adapters holding a bytes-mode ``redis.asyncio`` client in ``_r``."""

    _r: Any

    async def job_field(self, job_id: str, name: str) -> str | None:
        """Field ``name`` of the job's hash, decoded (None when the job or field is missing)."""
        raw = await self._r.hget(keys.job(job_id), name)
        return raw.decode() if raw else None

    async def job_spec_json(self, job_id: str) -> str | None:
        """The job's stored spec (normalised JSON), None for an unknown job."""
        return await self.job_field(job_id, "spec_json")

    async def job_state(self, job_id: str) -> str | None:
        """The job's state (a ``JobState`` value), None for an unknown job."""
        return await self.job_field(job_id, "state")


async def ensure_consumer_group(redis: Any, stream: str, group: str) -> None:
    """Create ``group`` on ``stream`` (and the stream) unless it exists already."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except Exception as exc:  # redis answers BUSYGROUP when the group exists
        if "BUSYGROUP" not in str(exc):
            raise


# ARGV[1] is every operation packed into one string: per operation a header of three
# big-endian 32-bit integers (index of its key in KEYS, number of arguments, length of
# the command's name), the name, then each argument as a 32-bit length and its bytes.
# Every command the batch runs names exactly one key. A command of many arguments (a
# large HSET, HDEL or RPUSH: only those take many) runs in slices of 2,000, under Lua's
# limit of ~8,000 arguments to one call (LUAI_MAXCSTACK); HSET's slices keep pairs whole.
_SCRIPT_BATCH_LUA = """
local blob = ARGV[1]
local pos, size = 1, #blob
while pos <= size do
  local key_index, n, name_len, at = struct.unpack('>I4I4I4', blob, pos)
  local command = string.sub(blob, at, at + name_len - 1)
  pos = at + name_len
  local args = {}
  for j = 1, n do
    local len, start = struct.unpack('>I4', blob, pos)
    args[j] = string.sub(blob, start, start + len - 1)
    pos = start + len
  end
  local key = KEYS[key_index]
  if n <= 2000 then
    redis.call(command, key, unpack(args))
  else
    for lo = 1, n, 2000 do
      redis.call(command, key, unpack(args, lo, math.min(lo + 1999, n)))
    end
  end
end
return 0
"""

_HEADER = struct.Struct(">III").pack
_LENGTH = struct.Struct(">I").pack


def register_script_batch(redis: Any) -> Any:
    """The batch script on ``redis``, registered once per store (see ``ScriptBatch``)."""
    return redis.register_script(_SCRIPT_BATCH_LUA)


def _as_bytes(value: Any) -> bytes:
    """An argument as Redis receives it (text as UTF-8, numbers in decimal)."""
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode()
    if isinstance(value, bool) or not isinstance(value, (int, float, str, bytes)):
        raise TypeError(f"a Redis argument must be bytes, text or a number: {value!r}")
    return str(value).encode()


class ScriptBatch:
    """Write commands collected like a pipeline's and run by one EVALSHA.

    Atomic as MULTI/EXEC (a script runs alone), but one command to encode and one reply
    to read, where a MULTI of n commands is n commands and n + 1 replies (each answered
    QUEUED first). All operations travel packed into one argument (see the script
    above), decoded in Lua: redis-py packs a command's arguments one by one in Python,
    ~4 us each, and a tick placing 128 trajectories wrote ~1,300 of them (an inbox
    entry, a task and an assignment each; at 1,000 instances the largest CPU cost of
    the scheduler in cProfile). Here an argument costs a length and a join. The keys
    still go in KEYS. A command that fails at run time stops the batch there; what ran
    before stays (there is no rollback, as with EXEC). Supports the pipeline methods
    the stores write with."""

    def __init__(self, script: Any) -> None:
        self._script = script
        self._keys: dict[str, int] = {}
        self._pieces: list[bytes] = []
        self.num_ops = 0

    def _op(self, command: str, key: str, *args: Any) -> None:
        encoded = [_as_bytes(arg) for arg in args]  # a bad one raises: nothing queued
        index = self._keys.setdefault(key, len(self._keys) + 1)
        name = command.encode()
        pieces = self._pieces
        pieces += (_HEADER(index, len(encoded), len(name)), name)
        for data in encoded:
            pieces += (_LENGTH(len(data)), data)
        self.num_ops += 1

    def hset(self, name: str, key: Any = None, value: Any = None,
             mapping: dict[Any, Any] | None = None) -> None:
        """Queue the pipeline's ``hset`` (one operation, however many fields)."""
        pairs = list((mapping or {}).items()) + ([(key, value)] if key is not None else [])
        if pairs:
            self._op("HSET", name, *(x for pair in pairs for x in pair))

    def hdel(self, name: str, *fields: Any) -> None:
        """Queue the pipeline's ``hdel``."""
        if fields:
            self._op("HDEL", name, *fields)

    def hincrby(self, name: str, key: Any, amount: int = 1) -> None:
        """Queue the pipeline's ``hincrby`` (run by :meth:`execute`)."""
        self._op("HINCRBY", name, key, amount)

    def xadd(self, name: str, fields: dict[Any, Any]) -> None:
        """Queue the pipeline's ``xadd`` (the entry id chosen by Redis)."""
        self._op("XADD", name, "*", *(x for pair in fields.items() for x in pair))

    def rpush(self, name: str, *values: Any) -> None:
        """Queue the pipeline's ``rpush``."""
        if values:
            self._op("RPUSH", name, *values)

    def ltrim(self, name: str, start: int, end: int) -> None:
        """Queue the pipeline's ``ltrim`` (run by :meth:`execute`)."""
        self._op("LTRIM", name, start, end)

    def set(self, name: str, value: Any) -> None:
        """Queue the pipeline's ``set`` (run by :meth:`execute`)."""
        self._op("SET", name, value)

    async def execute(self) -> None:
        """Run the collected commands in one EVALSHA (nothing to do when none were added)."""
        if self._pieces:
            await self._script(keys=list(self._keys), args=[b"".join(self._pieces)])
