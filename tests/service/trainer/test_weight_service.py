"""The trainer's WeightService and the rollout's weight fetcher, over real gRPC (the model
directory's fetch is in test_model_dir_fetch.py).

Real parts: the grpc.aio server on a loopback port, the typed client, the fetcher writing
to a real cache directory, the manifest writer the trainer publishes with, the rollout's
memory store. Faults are the server's own options (WeightFaults), not mocks; the only
fake is the inference engine at the loader's edge.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest

from libra import types as t
from libra.clients.weights import GrpcWeightClient
from libra.errors import InvalidArgument, NotFound, ResourceExhausted
from libra.run_dir import weights_file
from libra.weight_sync import WeightSyncError, read_verified
from libra_cli.redis_server import free_ports
from services.rollout.memory_store import MemoryRolloutStore
from services.rollout.weight_fetcher import (
    FetchedVersion,
    WeightFetcher,
    WeightSource,
    verified_weights,
)
from services.rollout.weight_loader import WeightLoader
from services.trainer.weight_server import WeightFaults
from tests.fakes.engine import FakeEngine, make_tokenizer
from tests.service.trainer.weight_rig import (
    CHUNK_BYTES,
    JOB,
    NUM_CHUNKS,
    fetcher,
    first_chunk,
)
from tests.waiting import wait_until


async def test_fetch_copies_the_version_byte_exact(serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    fetch = fetcher(client, tmp_path)
    manifest = await fetch.fetch(JOB, 1, trainer.digest)
    assert read_verified(manifest, trainer.digest) == trainer.data
    assert fetch.last.num_chunks_fetched == NUM_CHUNKS
    assert not list((tmp_path / "cache" / JOB).glob("*.part"))


async def test_a_cached_version_is_not_fetched_again(serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    fetch = fetcher(client, tmp_path)
    await fetch.fetch(JOB, 1, trainer.digest)
    await fetch.fetch(JOB, 1, trainer.digest)
    assert fetch.last.num_chunks_fetched == 0


async def test_a_chunk_with_a_bad_checksum_is_fetched_again(serve, tmp_path: Path) -> None:
    trainer, client = await serve(faults=WeightFaults(corrupt_chunk=3, corrupt_times=1))
    fetch = fetcher(client, tmp_path)
    manifest = await fetch.fetch(JOB, 1, trainer.digest)
    assert read_verified(manifest, trainer.digest) == trainer.data
    assert (fetch.last.num_chunks_refetched, fetch.last.num_chunks_fetched) == (1, NUM_CHUNKS)


async def test_a_chunk_bad_twice_fails_loudly_naming_it(serve, tmp_path: Path) -> None:
    trainer, client = await serve(faults=WeightFaults(corrupt_chunk=3, corrupt_times=2))
    with pytest.raises(WeightSyncError, match="chunk 3 .* failed its sha256 twice"):
        await fetcher(client, tmp_path).fetch(JOB, 1, trainer.digest)
    assert not list((tmp_path / "cache" / JOB).glob("*.safetensors*"))  # no .part either


async def test_a_version_bad_twice_is_refused_and_the_old_weights_keep_serving(
        serve, tmp_path: Path) -> None:
    trainer, client = await serve(faults=WeightFaults(corrupt_chunk=0, corrupt_times=2))
    store = MemoryRolloutStore()
    engine = FakeEngine(make_tokenizer(), policy_version=0)
    loader = WeightLoader("rollout-w", store, 30.0,
                          WeightSource("grpc", fetcher(client, tmp_path)))
    policy = t.PolicyInfo(1, "/not/shared/v000001.safetensors.manifest.json", trainer.digest,
                          "/not/shared/model", 0)
    await loader.load_verified(JOB, engine, policy)
    assert engine.policy_version == 0 and loader.is_rejected(JOB, policy)
    (event,) = store.events(JOB, "weights_checksum_mismatch")
    assert "chunk 0" in event["error"]


async def test_auto_source_fetches_when_the_path_is_not_shared(serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    store = MemoryRolloutStore()
    engine = FakeEngine(make_tokenizer(), policy_version=0)
    loader = WeightLoader("rollout-w", store, 30.0,
                          WeightSource("auto", fetcher(client, tmp_path)))
    policy = t.PolicyInfo(1, str(tmp_path / "elsewhere" / "v000001.safetensors.manifest.json"),
                          trainer.digest, "", 0)
    await loader.load_verified(JOB, engine, policy)
    assert engine.policy_version == 1
    (event,) = store.events(JOB, "weights_loaded")
    assert event["size_bytes"] == str(len(trainer.data))
    # The engine maps the verified copy: its path, not bytes read back into memory.
    copy = tmp_path / "cache" / JOB / "v000001.safetensors"
    assert engine.loaded == [(str(copy), 1)] and copy.read_bytes() == trainer.data


async def test_auto_source_reads_a_shared_path_without_fetching(serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    source = WeightSource("auto", fetcher(client, tmp_path))
    shared = weights_file(trainer.run_dir, 1)
    manifest = shared.with_name(shared.name + ".manifest.json")
    policy = t.PolicyInfo(1, str(manifest), trainer.digest, "", 0)
    assert await source.manifest_path(JOB, policy) == manifest
    assert trainer.server.num_streams == 0 and not (tmp_path / "cache").exists()


async def test_a_manifest_not_matching_the_pointer_is_refused(serve, tmp_path: Path) -> None:
    _, client = await serve()
    with pytest.raises(WeightSyncError, match="does not match the published pointer"):
        await fetcher(client, tmp_path).fetch(JOB, 1, "0" * 64)


@pytest.mark.parametrize("rest", [
    b"torn write",
    # What a fetch killed after 4 chunks leaves: the .part is preallocated to full size.
    bytes(CHUNK_BYTES * NUM_CHUNKS - 123 - 4 * CHUNK_BYTES),
], ids=["torn", "preallocated"])
async def test_a_part_file_resumes_after_its_last_good_chunk(serve, tmp_path: Path,
                                                             rest: bytes) -> None:
    trainer, client = await serve()
    part = tmp_path / "cache" / JOB / "v000001.safetensors.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(trainer.data[:4 * CHUNK_BYTES] + rest)
    fetch = fetcher(client, tmp_path)
    manifest = await fetch.fetch(JOB, 1, trainer.digest)
    assert read_verified(manifest, trainer.digest) == trainer.data
    assert (fetch.last.resumed_from_chunk, fetch.last.num_chunks_fetched) == (4, 6)


async def test_a_pinned_manifest_whose_chunks_skip_bytes_is_refused(
        serve, tmp_path: Path) -> None:
    """Chunk hashes verify the file only when the chunks tile it: a manifest (pinned by
    the pointer, from a faulty writer) that leaves a chunk's bytes unhashed is refused
    before any chunk is fetched."""
    trainer, client = await serve()
    shared = weights_file(trainer.run_dir, 1)
    manifest = shared.with_name(shared.name + ".manifest.json")
    raw = json.loads(manifest.read_bytes())
    del raw["chunks"][3]
    body = json.dumps(raw).encode()
    manifest.write_bytes(body)
    fetch = fetcher(client, tmp_path)
    with pytest.raises(WeightSyncError, match="chunk 3 at offset 262144"):
        await fetch.fetch(JOB, 1, hashlib.sha256(body).hexdigest())
    assert fetch.last.num_chunks_fetched == 0


async def test_a_resumed_copy_is_verified_byte_exact(serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    part = tmp_path / "cache" / JOB / "v000001.safetensors.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(trainer.data[:4 * CHUNK_BYTES] + b"torn write")
    fetched = await fetcher(client, tmp_path).fetch_version(JOB, 1, trainer.digest)
    assert fetched.verified
    assert verified_weights(fetched).read_bytes() == trainer.data


async def test_a_fetched_copy_is_verified_on_arrival_and_a_cached_one_is_not(
        serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    fetch = fetcher(client, tmp_path)
    fetched = await fetch.fetch_version(JOB, 1, trainer.digest)
    assert fetched.verified
    assert (fetched.size_bytes, fetched.manifest_sha256) == (len(trainer.data), trainer.digest)
    assert verified_weights(fetched).read_bytes() == trainer.data
    cached = await fetch.fetch_version(JOB, 1, trainer.digest)
    assert cached.manifest_path == fetched.manifest_path and not cached.verified
    with pytest.raises(WeightSyncError, match="not verified here"):
        verified_weights(cached)


async def test_a_verified_copy_cut_short_since_is_refused(serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    fetched = await fetcher(client, tmp_path).fetch_version(JOB, 1, trainer.digest)
    weights = fetched.manifest_path.with_name("v000001.safetensors")
    os.truncate(weights, len(trainer.data) - 1)
    with pytest.raises(WeightSyncError, match="bytes, verified"):
        verified_weights(fetched)
    weights.unlink()
    with pytest.raises(WeightSyncError, match="unreadable"):
        verified_weights(fetched)


async def test_a_tampered_cached_copy_is_verified_by_the_loader_and_not_loaded(
        serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    fetched = await fetcher(client, tmp_path).fetch_version(JOB, 1, trainer.digest)
    weights = fetched.manifest_path.with_name("v000001.safetensors")
    weights.write_bytes(bytes([trainer.data[0] ^ 0xFF]) + trainer.data[1:])
    store = MemoryRolloutStore()
    engine = FakeEngine(make_tokenizer(), policy_version=0)
    loader = WeightLoader("rollout-w", store, 30.0,
                          WeightSource("grpc", fetcher(client, tmp_path)))
    policy = t.PolicyInfo(1, "/not/shared/v000001.safetensors.manifest.json", trainer.digest,
                          "", 0)
    await loader.load_verified(JOB, engine, policy)
    assert engine.policy_version == 0
    (event,) = store.events(JOB, "weights_checksum_mismatch")
    assert "chunk 0" in event["error"]


def test_a_shared_path_is_never_taken_as_verified(tmp_path: Path) -> None:
    with pytest.raises(WeightSyncError, match="not verified here"):
        verified_weights(FetchedVersion(tmp_path / "v000001.safetensors.manifest.json", "ab"))


async def test_a_stream_past_the_limit_is_refused_with_a_retry_hint(serve) -> None:
    faults = WeightFaults(hold_after_chunks=1)
    trainer, client = await serve(max_streams=2, faults=faults)
    held = [client.fetch_chunks(JOB, 1, 0) for _ in range(2)]
    assert [await first_chunk(s) for s in held] == [0, 0]  # both slots taken and held
    with pytest.raises(ResourceExhausted) as refused:
        await first_chunk(client.fetch_chunks(JOB, 1, 0))
    assert refused.value.retry_after_ms > 0 and trainer.server.num_refused == 1
    assert trainer.server.pinned(JOB) == {1}  # never pruned while streamed
    faults.release.set()
    rest = [[c.index async for c in s] for s in held]
    assert rest == [list(range(1, NUM_CHUNKS))] * 2
    assert trainer.server.num_streams == 0 and trainer.server.pinned(JOB) == set()


async def test_a_refused_fetcher_waits_for_a_free_slot(serve, tmp_path: Path) -> None:
    faults = WeightFaults(hold_after_chunks=1)
    trainer, client = await serve(max_streams=1, faults=faults)
    held = client.fetch_chunks(JOB, 1, 0)
    await first_chunk(held)
    fetch = fetcher(client, tmp_path)
    task = asyncio.create_task(fetch.fetch(JOB, 1, trainer.digest))
    await wait_until(lambda: trainer.server.num_refused >= 2)  # asked, waited, asked again
    faults.hold_after_chunks = -1  # the next stream is not held
    faults.release.set()
    [c async for c in held]
    manifest = await task
    assert read_verified(manifest, trainer.digest) == trainer.data
    assert fetch.last.num_refused >= 2 and fetch.last.num_stream_retries == 0


@pytest.mark.parametrize(("job_id", "version", "from_chunk", "error", "field"), [
    ("", 1, 0, InvalidArgument, "job_id"),
    (JOB, -1, 0, InvalidArgument, "version"),
    (JOB, 1, NUM_CHUNKS, InvalidArgument, "from_chunk"),
    (JOB, 7, 0, NotFound, None),
    ("job-other", 1, 0, NotFound, None),
])
async def test_bad_requests_are_refused_naming_the_field(serve, job_id: str, version: int,
                                                         from_chunk: int, error: type,
                                                         field: str | None) -> None:
    trainer, client = await serve()
    with pytest.raises(error) as raised:
        await first_chunk(client.fetch_chunks(job_id, version, from_chunk))
    if field is not None:
        assert raised.value.field == field
    assert trainer.server.num_streams == 0



async def test_an_unreachable_trainer_is_reported_and_the_version_is_not_refused(
        tmp_path: Path) -> None:
    (port,) = free_ports(1)  # nothing serves there
    client = GrpcWeightClient(f"127.0.0.1:{port}", 5.0)
    store = MemoryRolloutStore()
    engine = FakeEngine(make_tokenizer(), policy_version=0)
    source = WeightSource("grpc", WeightFetcher(client, tmp_path, max_stream_retries=0))
    loader = WeightLoader("rollout-w", store, 30.0, source)
    policy = t.PolicyInfo(1, "/not/shared/v000001.safetensors.manifest.json", "ab" * 32, "",
                          0)
    try:
        await loader.load_verified(JOB, engine, policy)
    finally:
        await client.close()
    (event,) = store.events(JOB, "weights_fetch_failed")
    assert "trainer unreachable" in event["error"]
    assert engine.policy_version == 0 and not loader.is_rejected(JOB, policy)


