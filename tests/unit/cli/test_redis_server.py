"""``libra_cli.redis_server``: a real embedded redis-server (started here, stopped by pid)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_sync

from libra_cli.redis_server import EmbeddedRedis, pid_alive, start_redis


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    srv = start_redis(tmp_path / "data")
    yield srv
    srv.stop()


def client(srv: EmbeddedRedis) -> redis_sync.Redis:
    return redis_sync.Redis.from_url(srv.url, decode_responses=True)


def test_started_server_answers_ping(server: EmbeddedRedis) -> None:
    with client(server) as c:
        assert c.ping() is True


def test_started_server_has_aof_on(server: EmbeddedRedis) -> None:
    with client(server) as c:
        assert c.config_get("appendonly") == {"appendonly": "yes"}


def test_start_writes_pid_file(server: EmbeddedRedis) -> None:
    assert (server.data_dir / "redis.pid").read_text() == str(server.pid)


def test_stop_ends_the_process_by_pid(server: EmbeddedRedis) -> None:
    pid = server.pid
    server.stop()
    assert not pid_alive(pid)


def test_stop_twice_is_a_no_op(server: EmbeddedRedis) -> None:
    server.stop()
    server.stop()
    assert server.process.poll() is not None


def test_restart_on_same_data_dir_keeps_keys(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_redis(data)
    try:
        with client(first) as c:
            c.set("libra:test", "kept")
    finally:
        first.stop()
    second = start_redis(data)
    try:
        with client(second) as c:
            assert c.get("libra:test") == "kept"
    finally:
        second.stop()


def test_server_that_cannot_start_raises_with_log(tmp_path: Path,
                                                  server: EmbeddedRedis) -> None:
    with pytest.raises(RuntimeError, match="exited"):
        start_redis(tmp_path / "other", port=server.port)


def test_password_is_required_and_kept_out_of_the_command_line(tmp_path: Path) -> None:
    srv = start_redis(tmp_path / "data", password="s3cret-pw")
    try:
        assert srv.url == f"redis://:s3cret-pw@127.0.0.1:{srv.port}/0"
        with client(srv) as c:
            assert c.ping() is True
        with redis_sync.Redis(port=srv.port) as anonymous:
            with pytest.raises(redis_sync.AuthenticationError):
                anonymous.ping()
        with redis_sync.Redis(port=srv.port, password="wrong") as wrong:
            with pytest.raises(redis_sync.AuthenticationError):
                wrong.ping()
        cmdline = Path(f"/proc/{srv.pid}/cmdline").read_bytes()
        assert b"s3cret-pw" not in cmdline
        conf = srv.data_dir / "redis.conf"
        assert conf.stat().st_mode & 0o777 == 0o600
    finally:
        srv.stop()
