"""Serving published policy versions (and the job's model directory) to rollout
instances without a shared filesystem.

A rollout instance that cannot read the trainer's run directory asks for a version's
manifest (:meth:`WeightServer.get_manifest`), then streams the weights file chunk by
chunk (:meth:`WeightServer.fetch_chunks`), from chunk 0 or from where a broken transfer
stopped. The server reads from the run directory only (read-only, by version), pins a
version while a stream reads it (``pinned``: the publisher does not prune it), and
bounds concurrent streams: one past ``max_streams`` is refused with ResourceExhausted
and the client retries after ``retry_after_ms``, so a hundred instances fetching at
once queue at their side instead of stalling the trainer's step loop.

Faults (``WeightFaults``) are real server options, for drills and tests: serve one chunk
corrupted, or stop sending after some chunks (a trainer that dies mid-transfer).

Pure, like the core: file reads run in threads; no grpc here (the servicer converts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from libra.errors import InvalidArgument, NotFound, ResourceExhausted
from libra.run_dir import MODEL_DIR, weights_file
from libra.weight_sync import (
    CHUNK_BYTES,
    MANIFEST_SUFFIX,
    ModelFile,
    WeightChunk,
    WeightSyncError,
    parse_manifest,
    sha256_file,
)

logger = logging.getLogger(__name__)

# How long a refused client waits before asking again: a few 1 MiB chunks on a
# loaded host, so a freed slot is taken soon without a storm of retries.
RETRY_AFTER_MS = 50


@dataclass
class WeightFaults:
    """Injected faults (config ``weights.fault_*``); the defaults inject none."""

    corrupt_chunk: int = -1
    """Serve this chunk index with one byte flipped (-1: none)."""
    corrupt_times: int = 1
    """How many times ``corrupt_chunk`` is served corrupted (then correctly)."""
    hold_after_chunks: int = -1
    """Each stream stops sending after this many chunks until ``release`` is set
    (-1: never): a transfer that hangs, or dies when the process is killed meanwhile."""
    release: asyncio.Event = field(default_factory=asyncio.Event)


class WeightServer:
    """Streams of one trainer's published versions and model directories (job id ->
    run directory)."""

    def __init__(self, run_dir_of: Callable[[str], Awaitable[str]], max_streams: int,
                 faults: WeightFaults | None = None) -> None:
        if max_streams < 1:
            raise ValueError(f"weights.max_streams must be >= 1, got {max_streams}")
        self._run_dir_of = run_dir_of
        self.max_streams = max_streams
        self.faults = faults or WeightFaults()
        self.num_streams = 0
        self.num_refused = 0
        self._pins: Counter[tuple[str, int]] = Counter()
        self._hashes: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256

    def pinned(self, job_id: str) -> set[int]:
        """Versions of ``job_id`` a stream is reading now (never pruned meanwhile)."""
        return {version for (job, version), n in self._pins.items() if job == job_id and n}

    async def get_manifest(self, job_id: str, version: int) -> bytes:
        """The exact bytes of ``version``'s published manifest."""
        path = await self._manifest_path(job_id, version)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError as exc:
            raise NotFound(f"job {job_id}: weights version {version} is not published "
                           "(or was pruned)") from exc

    async def fetch_chunks(self, job_id: str, version: int,
                           from_chunk: int) -> AsyncIterator[WeightChunk]:
        """The chunks of ``version`` from ``from_chunk`` on, read at the manifest's offsets
        (unhashed: the client checks each; a file shorter than its manifest fails)."""
        # Checked before the slot is taken: a bad request never holds one.
        manifest = parse_manifest(await self.get_manifest(job_id, version))
        if not 0 <= from_chunk < len(manifest.chunks):
            raise InvalidArgument("from_chunk", f"must be in [0, {len(manifest.chunks)}), "
                                  f"got {from_chunk}")
        path = (await self._manifest_path(job_id, version)).with_name(manifest.file)
        with self._stream_slot():
            self._pins[(job_id, version)] += 1
            try:
                with path.open("rb") as handle:
                    for index in range(from_chunk, len(manifest.chunks)):
                        await self._hold_if_asked(index - from_chunk)
                        spec = manifest.chunks[index]
                        data = await asyncio.to_thread(_read_at, handle, spec.offset,
                                                       spec.length)
                        yield WeightChunk(index, self._maybe_corrupt(index, data))
            finally:
                self._pins[(job_id, version)] -= 1

    async def list_model_files(self, job_id: str) -> list[ModelFile]:
        """The files of the job's model directory with their sizes and sha256 (hashed
        once per file version: a directory is written once per job)."""
        folder = await self._model_dir(job_id)
        return await asyncio.to_thread(self._describe, folder)

    async def fetch_model_file(self, job_id: str, name: str) -> AsyncIterator[WeightChunk]:
        """One file of the job's model directory in ``CHUNK_BYTES`` chunks (the caller
        checks the whole file against :meth:`list_model_files`)."""
        if not name or Path(name).name != name or name in (".", ".."):
            raise InvalidArgument("name", f"must be a file name in the model directory, "
                                  f"got {name!r}")
        path = await self._model_dir(job_id) / name
        if not path.is_file():
            raise NotFound(f"job {job_id}: no model file {name}")
        with self._stream_slot(), path.open("rb") as handle:
            index = 0
            while data := await asyncio.to_thread(handle.read, CHUNK_BYTES):
                yield WeightChunk(index, data)
                index += 1

    @contextlib.contextmanager
    def _stream_slot(self) -> Iterator[None]:
        """One of ``max_streams`` slots, or ResourceExhausted with a retry hint."""
        if self.num_streams >= self.max_streams:
            self.num_refused += 1
            raise ResourceExhausted(
                f"weight streams full ({self.max_streams}); retry after {RETRY_AFTER_MS} ms",
                retry_after_ms=RETRY_AFTER_MS)
        self.num_streams += 1
        try:
            yield
        finally:
            self.num_streams -= 1

    async def _model_dir(self, job_id: str) -> Path:
        manifest = await self._manifest_path(job_id, 0)
        folder = manifest.parent.parent / MODEL_DIR
        if not folder.is_dir():
            raise NotFound(f"job {job_id}: no model directory on this trainer")
        return folder

    def _describe(self, folder: Path) -> list[ModelFile]:
        files = []
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            stat = path.stat()
            key = (str(path), stat.st_size, stat.st_mtime_ns)
            if key not in self._hashes:
                self._hashes[key] = sha256_file(path)
            files.append(ModelFile(path.name, stat.st_size, self._hashes[key]))
        return files

    async def _manifest_path(self, job_id: str, version: int) -> Path:
        if not job_id:
            raise InvalidArgument("job_id", "required")
        if version < 0:
            raise InvalidArgument("version", f"must be >= 0, got {version}")
        try:
            run_dir = Path(await self._run_dir_of(job_id))
        except RuntimeError as exc:  # the store's "job has no run_dir"
            raise NotFound(f"job {job_id}: no run directory on this trainer") from exc
        weights = weights_file(run_dir, version)
        return weights.with_name(weights.name + MANIFEST_SUFFIX)

    async def _hold_if_asked(self, num_sent: int) -> None:
        if num_sent == self.faults.hold_after_chunks:
            logger.warning("[weights] fault: holding the stream after %d chunks", num_sent)
            await self.faults.release.wait()

    def _maybe_corrupt(self, index: int, data: bytes) -> bytes:
        faults = self.faults
        if index != faults.corrupt_chunk or faults.corrupt_times <= 0 or not data:
            return data
        faults.corrupt_times -= 1
        logger.warning("[weights] fault: serving chunk %d corrupted", index)
        return bytes([data[0] ^ 0xFF]) + data[1:]


def _read_at(handle, offset: int, length: int) -> bytes:  # noqa: ANN001
    handle.seek(offset)
    data = handle.read(length)
    if len(data) != length:
        raise WeightSyncError(f"weights file {handle.name} shorter than its manifest")
    return data
