"""Shared fixtures. Redis is a real server started once per session (never an imitation)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before anything imports grpc: its fork handlers crash the tool gateway's sandboxed
# children (see services/toolgateway/__main__.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from libra.redis_server import EmbeddedRedis, start_redis  # noqa: E402


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A real redis-server on a free loopback port, stopped by pid at the end."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
async def redis(redis_server: EmbeddedRedis) -> AsyncIterator[aioredis.Redis]:
    """A client on a flushed database, so tests never see each other's keys."""
    client = aioredis.from_url(redis_server.url, decode_responses=True)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
async def redis_bytes(redis_server: EmbeddedRedis) -> AsyncIterator[aioredis.Redis]:
    """A bytes-mode client (the services' stores use one) on a flushed database."""
    client = aioredis.from_url(redis_server.url, decode_responses=False)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """``hf_model_dir(family)``: a tiny random HF model directory of ``llama``, ``qwen2``
    or ``qwen3`` (tests/fixtures/hf_models.py), built once per family and session.
    Treat it as read-only: copy it before changing anything in it."""
    from tests.fixtures.hf_models import make_model_dir

    built: dict[str, Path] = {}

    def get(family: str = "llama") -> Path:
        if family not in built:
            built[family] = make_model_dir(family, tmp_path_factory.mktemp(f"hf-{family}"))
        return built[family]

    return get
