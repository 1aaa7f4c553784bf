"""Redis reads, writes and set-up shared by the services' store adapters.

The coordinator owns the job hash; the scheduler, rollout and trainer stores read it
through ``JobRecordReader`` (bytes-mode client). Consumer groups are created once,
idempotently, by ``ensure_consumer_group``. ``ScriptBatch`` writes many commands
atomically in one round trip and one reply.
"""

from __future__ import annotations

import json
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


# ARGV is a list of operations, each: number of arguments after the key, command, index
# of its key in KEYS, arguments. Every command the batch runs names exactly one key. A
# command named with a trailing '*' has one argument, a JSON array of its (text)
# arguments, decoded here by cjson and run in slices of _MAX_FIELDS_PER_OP pairs.
_SCRIPT_BATCH_LUA = """
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local command, key = ARGV[i + 1], KEYS[tonumber(ARGV[i + 2])]
  if string.sub(command, -1) == '*' then
    local args = cjson.decode(ARGV[i + 3])
    command = string.sub(command, 1, -2)
    for lo = 1, #args, 2000 do
      redis.call(command, key, unpack(args, lo, math.min(lo + 1999, #args)))
    end
  else
    local call = {command, key}
    for j = 1, n do call[2 + j] = ARGV[i + 2 + j] end
    redis.call(unpack(call))
  end
  i = i + 3 + n
end
return 0
"""

# Fields per HSET/HDEL op: a Lua call takes at most ~8000 arguments (LUAI_MAXCSTACK).
_MAX_FIELDS_PER_OP = 1000


def register_script_batch(redis: Any) -> Any:
    """The batch script on ``redis``, registered once per store (see ``ScriptBatch``)."""
    return redis.register_script(_SCRIPT_BATCH_LUA)


class ScriptBatch:
    """Write commands collected like a pipeline's and run by one EVALSHA.

    Atomic as MULTI/EXEC (a script runs alone), but one command to encode and one reply
    to read, where a MULTI of n commands is n commands and n + 1 replies (each answered
    QUEUED first): for a scheduler tick that writes a few dozen commands, most of its
    CPU. A command that fails at run time stops the batch there; what ran before stays
    (there is no rollback, as with EXEC). Supports the pipeline methods the stores write
    with."""

    def __init__(self, script: Any) -> None:
        self._script = script
        self._keys: dict[str, int] = {}
        self._args: list[Any] = []

    def _op(self, command: str, key: str, *args: Any) -> None:
        index = self._keys.setdefault(key, len(self._keys) + 1)
        self._args += [len(args), command, index, *args]

    def _op_text(self, command: str, key: str, args: list[Any]) -> bool:
        """Queue ``command`` with its arguments as one JSON array when they are all text
        (False otherwise: nothing queued). redis-py packs a command's arguments one by
        one in Python, ~4 us each: a scheduler tick flushing the policy state of a few
        hundred trajectories spent most of its time there; json.dumps is one C call."""
        if not all(type(a) is str for a in args):
            return False
        self._op(command + "*", key, json.dumps(args, ensure_ascii=False))
        return True

    def hset(self, name: str, key: Any = None, value: Any = None,
             mapping: dict[Any, Any] | None = None) -> None:
        """Queue the pipeline's ``hset``, split so no Lua call passes ~8000 arguments
        (text fields and values travel as one JSON argument)."""
        pairs = list((mapping or {}).items()) + ([(key, value)] if key is not None else [])
        if len(pairs) > 1 and self._op_text("HSET", name, [x for p in pairs for x in p]):
            return
        for start in range(0, len(pairs), _MAX_FIELDS_PER_OP):
            self._op("HSET", name, *(x for pair in pairs[start:start + _MAX_FIELDS_PER_OP]
                                     for x in pair))

    def hdel(self, name: str, *fields: Any) -> None:
        """Queue the pipeline's ``hdel``, split like :meth:`hset`."""
        if len(fields) > 1 and self._op_text("HDEL", name, list(fields)):
            return
        for start in range(0, len(fields), _MAX_FIELDS_PER_OP):
            self._op("HDEL", name, *fields[start:start + _MAX_FIELDS_PER_OP])

    def hincrby(self, name: str, key: Any, amount: int = 1) -> None:
        """Queue the pipeline's ``hincrby`` (run by :meth:`execute`)."""
        self._op("HINCRBY", name, key, amount)

    def xadd(self, name: str, fields: dict[Any, Any]) -> None:
        """Queue the pipeline's ``xadd`` (the entry id chosen by Redis)."""
        self._op("XADD", name, "*", *(x for pair in fields.items() for x in pair))

    def rpush(self, name: str, *values: Any) -> None:
        """Queue the pipeline's ``rpush``, split like :meth:`hset`."""
        for start in range(0, len(values), _MAX_FIELDS_PER_OP):
            self._op("RPUSH", name, *values[start:start + _MAX_FIELDS_PER_OP])

    def ltrim(self, name: str, start: int, end: int) -> None:
        """Queue the pipeline's ``ltrim`` (run by :meth:`execute`)."""
        self._op("LTRIM", name, start, end)

    def set(self, name: str, value: Any) -> None:
        """Queue the pipeline's ``set`` (run by :meth:`execute`)."""
        self._op("SET", name, value)

    async def execute(self) -> None:
        """Run the collected commands in one EVALSHA (nothing to do when none were added)."""
        if self._args:
            await self._script(keys=list(self._keys), args=self._args)
