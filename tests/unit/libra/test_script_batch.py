"""ScriptBatch against a real Redis: every supported command lands, in order, in one
round trip; large hashes are split under Lua's argument limit; a failing command
raises and leaves the earlier ones done (as EXEC would)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from libra.redis_shared import ScriptBatch, register_script_batch


@pytest.fixture
def r(redis_bytes: aioredis.Redis) -> aioredis.Redis:
    return redis_bytes


async def test_every_command_lands_in_order(r: aioredis.Redis) -> None:
    batch = ScriptBatch(register_script_batch(r))
    batch.hset("h", mapping={"a": "1", "b": b"2"})
    batch.hset("h", "c", 3)
    batch.hdel("h", "a")
    batch.hincrby("h", "c", 4)
    batch.xadd("s", {"job_id": "j", "task": b"\x00\x01"})
    batch.rpush("l", "x", "y", "z")
    batch.ltrim("l", -2, -1)
    batch.set("k", "v")
    await batch.execute()
    assert await r.hgetall("h") == {b"b": b"2", b"c": b"7"}
    ((_, fields),) = await r.xrange("s")
    assert fields == {b"job_id": b"j", b"task": b"\x00\x01"}
    assert await r.lrange("l", 0, -1) == [b"y", b"z"]
    assert await r.get("k") == b"v"


async def test_a_hash_larger_than_one_lua_call_is_written_whole(r: aioredis.Redis) -> None:
    batch = ScriptBatch(register_script_batch(r))
    batch.hset("big", mapping={f"f{i}": str(i) for i in range(5000)})
    batch.rpush("long", *(str(i) for i in range(5000)))
    await batch.execute()
    assert await r.hlen("big") == 5000
    assert await r.llen("long") == 5000
    batch = ScriptBatch(register_script_batch(r))
    batch.hdel("big", *(f"f{i}" for i in range(4999)))
    await batch.execute()
    assert await r.hgetall("big") == {b"f4999": b"4999"}


async def test_an_empty_batch_sends_nothing(r: aioredis.Redis) -> None:
    await ScriptBatch(register_script_batch(r)).execute()
    assert await r.dbsize() == 0


async def test_a_failing_command_raises_and_keeps_what_ran_before(
        r: aioredis.Redis) -> None:
    await r.set("text", "not a hash")
    batch = ScriptBatch(register_script_batch(r))
    batch.set("first", "1")
    batch.hset("text", "f", "v")  # WRONGTYPE
    batch.set("after", "1")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await batch.execute()
    assert await r.get("first") == b"1"
    assert await r.get("after") is None


async def test_every_argument_travels_in_one_packed_argument_byte_for_byte(
        r: aioredis.Redis) -> None:
    # Quotes, backslashes, non-ASCII, JSON, NULs and \xff inside values, numbers, empty
    # strings: what the policy state and encoded trajectories hold.
    text = {f"t{i}": f'{{"k": "v\\\\{i}", "name": "ü–✓ \\"q\\""}}' for i in range(3)}
    batch = ScriptBatch(register_script_batch(r))
    batch.hset("h", mapping=text)
    batch.hset("h", mapping={"bytes": b"\xff\x00\r\n$3", "n": 3, "f": 1.5, "empty": ""})
    batch.hdel("h", "t0", "t1")
    batch.xadd("inbox:ü", {"task": bytes(range(256))})
    calls: list[dict] = []

    async def script(**kwargs: object) -> None:
        calls.append(kwargs)
        await register_script_batch(r)(**kwargs)

    batch._script = script
    await batch.execute()
    ((call,),) = [calls]
    assert call["keys"] == ["h", "inbox:ü"] and len(call["args"]) == 1
    assert await r.hgetall("h") == {b"t2": text["t2"].encode(), b"bytes": b"\xff\x00\r\n$3",
                                    b"n": b"3", b"f": b"1.5", b"empty": b""}
    ((_, fields),) = await r.xrange("inbox:ü")
    assert fields == {b"task": bytes(range(256))}


async def test_an_argument_that_is_not_bytes_text_or_a_number_is_refused(
        r: aioredis.Redis) -> None:
    batch = ScriptBatch(register_script_batch(r))
    for bad in (None, True, ["a"], {"a": 1}):
        with pytest.raises(TypeError, match="bytes, text or a number"):
            batch.set("k", bad)
    await batch.execute()  # nothing was queued
    assert await r.dbsize() == 0


async def test_an_empty_command_queues_nothing(r: aioredis.Redis) -> None:
    batch = ScriptBatch(register_script_batch(r))
    batch.hset("h", mapping={})
    batch.hdel("h")
    batch.rpush("l")
    assert batch.num_ops == 0
    await batch.execute()
    assert await r.dbsize() == 0
