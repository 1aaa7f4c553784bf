"""redis_url: plain URLs as before, redis+sentinel:// URLs parsed or refused by name."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.sentinel import SentinelConnectionPool

from libra.redis_connect import (
    SENTINEL_CONNECT_TIMEOUT_S,
    SOCKET_TIMEOUT_S,
    SentinelTarget,
    is_sentinel_url,
    parse_sentinel_url,
    redis_client,
    redis_client_sync,
)
from libra_cli.redis_server import EmbeddedRedis, start_redis


def test_a_sentinel_url_names_sentinels_master_db_and_passwords() -> None:
    url = ("redis+sentinel://:s3cret@sentinel-0:26379,sentinel-1:26380,[::1]:26381/"
           "mymaster/2?sentinel_password=sp&min_other_sentinels=1")
    assert is_sentinel_url(url) and not is_sentinel_url("redis://127.0.0.1:6379/0")
    assert parse_sentinel_url(url) == SentinelTarget(
        sentinels=[("sentinel-0", 26379), ("sentinel-1", 26380), ("::1", 26381)],
        master_name="mymaster", db=2, password="s3cret", sentinel_password="sp",
        min_other_sentinels=1)
    plain = parse_sentinel_url("redis+sentinel://h:1/m")
    assert (plain.db, plain.password, plain.username) == (0, None, None)


@pytest.mark.parametrize(("url", "message"), [
    ("redis+sentinel://:pw@/m/0", "no sentinel host:port"),
    ("redis+sentinel://:pw@h/m/0", "sentinel 'h' is not host:port"),
    ("redis+sentinel://:pw@h:1", "the path must be /master_name"),
    ("redis+sentinel://:pw@h:1/m/x", "db must be a number"),
    ("redis+sentinel://:pw@h:1/m/0?quorum=2", "unknown options ['quorum']"),
    ("redis+sentinel://:pw@h:1/m/0?min_other_sentinels=many", "min_other_sentinels"),
])
def test_a_bad_sentinel_url_is_refused_naming_the_problem_not_the_password(
        url: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_sentinel_url(url)
    assert message in str(err.value) and "redis_url" in str(err.value)
    assert ":pw@" not in str(err.value)


async def test_the_factory_builds_a_sentinel_client_or_a_plain_one() -> None:
    client = redis_client("redis+sentinel://:pw@127.0.0.1:1/m/3", decode_responses=True)
    try:
        assert isinstance(client.connection_pool, SentinelConnectionPool)
        assert client.connection_pool.connection_kwargs["db"] == 3
    finally:
        await client.aclose()
    plain = redis_client("redis://127.0.0.1:1/0")
    try:
        assert isinstance(plain, aioredis.Redis)
        assert not isinstance(plain.connection_pool, SentinelConnectionPool)
    finally:
        await plain.aclose()


async def test_a_plain_client_waits_for_a_connection_instead_of_failing(
        redis_server: EmbeddedRedis) -> None:
    # Two connections, six commands at once: the default pool raised MaxConnectionsError
    # (taken for an outage); the blocking one queues them.
    client = redis_client(redis_server.url, max_connections=2, decode_responses=True)
    try:
        assert isinstance(client.connection_pool, aioredis.BlockingConnectionPool)
        replies = await asyncio.gather(*(client.blpop([f"none-{i}"], timeout=0.05)
                                         for i in range(6)))
        assert replies == [None] * 6
    finally:
        await client.aclose()


# -- socket timeouts: explicit, configurable ---------------------------------------------


def _timeouts(kwargs: dict) -> tuple[float | None, float | None]:
    return kwargs.get("socket_timeout"), kwargs.get("socket_connect_timeout")


async def test_every_client_gets_the_explicit_socket_timeouts_by_default() -> None:
    plain = redis_client("redis://127.0.0.1:1/0")
    sentinel = redis_client("redis+sentinel://127.0.0.1:1/m")
    sync = redis_client_sync("redis://127.0.0.1:1/0")
    try:
        expected = (SOCKET_TIMEOUT_S, SOCKET_TIMEOUT_S)
        assert _timeouts(plain.connection_pool.connection_kwargs) == expected
        assert _timeouts(sentinel.connection_pool.connection_kwargs) == expected
        assert _timeouts(sync.connection_pool.connection_kwargs) == expected
        # The sentinels keep their own short timeout: a dead one is skipped quickly.
        (first,) = sentinel.connection_pool.sentinel_manager.sentinels
        assert _timeouts(first.connection_pool.connection_kwargs) == (
            SENTINEL_CONNECT_TIMEOUT_S, SENTINEL_CONNECT_TIMEOUT_S)
    finally:
        await plain.aclose()
        await sentinel.aclose()
        sync.close()


async def test_the_caller_or_the_url_sets_the_socket_timeouts() -> None:
    given = redis_client("redis://127.0.0.1:1/0", socket_timeout=2.0)
    by_url = redis_client("redis://127.0.0.1:1/0?socket_timeout=0.5&socket_connect_timeout=1",
                          socket_timeout=2.0)
    sentinel = redis_client("redis+sentinel://127.0.0.1:1/m?socket_timeout=3", socket_timeout=2.0)
    try:
        assert _timeouts(given.connection_pool.connection_kwargs) == (2.0, SOCKET_TIMEOUT_S)
        assert _timeouts(by_url.connection_pool.connection_kwargs) == (0.5, 1.0)
        assert _timeouts(sentinel.connection_pool.connection_kwargs) == (3.0, SOCKET_TIMEOUT_S)
    finally:
        for client in (given, by_url, sentinel):
            await client.aclose()


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
def test_a_bad_socket_timeout_in_a_sentinel_url_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match="socket_timeout must be a number of seconds > 0"):
        parse_sentinel_url(f"redis+sentinel://127.0.0.1:1/m?socket_timeout={value}")


async def test_a_stalled_redis_fails_a_command_at_the_socket_timeout(
        tmp_path: Path) -> None:
    # A server of its own, stopped (SIGSTOP, as a host stall stops it): the command
    # fails with a timeout instead of waiting for the server to come back.
    server = start_redis(tmp_path / "stalled")
    client = redis_client(f"{server.url}?socket_timeout=0.2", decode_responses=True)
    try:
        assert await client.ping()
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(aioredis.TimeoutError):
                await client.get("k")
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert await client.ping()  # a new connection once it answers again
    finally:
        await client.aclose()
        server.stop()
