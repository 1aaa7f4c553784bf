"""Where a rollout instance reads a published version from: the shared path, or a
local copy fetched from the trainer over gRPC (no shared filesystem).

:class:`WeightSource` decides (config ``weights_source``): ``filesystem`` reads the
path the policy pointer names; ``grpc`` always fetches; ``auto`` reads the path when it
is there and readable, else fetches. :class:`WeightFetcher` copies a version into the
instance's cache directory:

1. the manifest, checked against the sha256 the pointer in Redis carries (so every
   chunk hash in it is trusted);
2. the chunks, into ``<file>.part`` (preallocated, written at the chunks' offsets), each
   checked against its sha256 before it is written; a bad chunk is fetched once more,
   and a second bad copy fails the version loudly (WeightSyncError: the loader refuses
   it and the old weights keep serving);
3. a broken stream (the trainer died or restarted) is reopened from the last good
   chunk, with backoff, a bounded number of times; a full server (ResourceExhausted)
   is asked again after its hint, without limit but within the loader's deadline;
4. the size, then ``<file>.part`` -> ``<file>`` and the manifest beside it (temp file +
   rename): a copy under its final name is always complete.

Each byte is hashed once, in memory, as it arrives: the chunks tile the file and the
pointer pins their hashes (``libra.weight_sync``). The loader hands a copy verified here
to the engine by path (:func:`verified_weights`: safetensors maps it), not read or
hashed again; the shared path and a copy found in the cache it verifies itself. A
``.part`` left by an earlier attempt (this process or one before a restart) is
re-checked chunk by chunk and the transfer resumes after its last good chunk.

Pure, like the core: the trainer comes in as a WeightApi; file I/O runs in threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from libra.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from libra.run_dir import MODEL_DIR
from libra.weight_sync import (
    MANIFEST_SUFFIX,
    ModelFile,
    WeightManifest,
    WeightSyncError,
    parse_manifest,
    sha256_file,
)
from services.rollout.weight_cache import (
    install,
    open_part,
    prune_cache,
    resume_point,
    write_checked,
)

if TYPE_CHECKING:  # the client's type only: no grpc at run time
    from libra import types as t
    from libra.clients.api import WeightApi

logger = logging.getLogger(__name__)

WEIGHT_SOURCES = ("auto", "filesystem", "grpc")
PART_SUFFIX = ".part"
# Versions kept in the cache per job: the one serving and the one being loaded.
KEEP_CACHED_VERSIONS = 2
R = TypeVar("R")


@dataclass
class FetchStats:
    """What the last fetch did (tests and the benchmark read it)."""

    resumed_from_chunk: int = 0
    num_chunks_fetched: int = 0
    num_chunks_refetched: int = 0
    num_stream_retries: int = 0
    num_refused: int = 0


@dataclass(frozen=True, slots=True)
class FetchedVersion:
    """Where a version's weights are for the loader, and whether this process has
    verified them already."""

    manifest_path: Path
    manifest_sha256: str
    """The sha256 of the manifest (the policy pointer's) the copy was checked against."""
    verified: bool = False
    """True when this process checked every chunk of the copy as it wrote it, against
    the manifest pinned by ``manifest_sha256``; False when nothing was verified here (the
    shared path, a copy found in the cache): the loader verifies those itself."""
    size_bytes: int = 0


@dataclass
class _Transfer:
    """One version's transfer in progress: where it stands survives a broken stream."""

    manifest: WeightManifest
    fd: int  # the .part, written at the manifest's offsets
    next_chunk: int
    refetched: set[int] = field(default_factory=set)


class WeightFetcher:
    """Copies published versions from the trainer into ``cache_dir/<job_id>/``."""

    def __init__(self, client: WeightApi, cache_dir: Path, *, max_stream_retries: int = 5,
                 retry_backoff_s: float = 0.2) -> None:
        self._client = client
        self._cache_dir = cache_dir
        self._max_stream_retries = max_stream_retries
        self._retry_backoff_s = retry_backoff_s
        self.last = FetchStats()

    async def fetch(self, job_id: str, version: int, manifest_sha256: str) -> Path:
        """The local manifest path of ``version``, fetched and verified (see
        :meth:`fetch_version`)."""
        return (await self.fetch_version(job_id, version, manifest_sha256)).manifest_path

    async def fetch_version(self, job_id: str, version: int,
                            manifest_sha256: str) -> FetchedVersion:
        """``version`` copied into the cache and verified as it arrived; a copy already
        cached is returned unverified (the loader checks it).

        Raises:
            WeightSyncError: The manifest or a chunk (twice) does not match its sha256.
            Unavailable: The trainer stayed unreachable through every retry; the next
                call resumes from the last good chunk.
        """
        self.last = FetchStats()
        body = await self._manifest(job_id, version)
        if hashlib.sha256(body).hexdigest() != manifest_sha256:
            raise WeightSyncError(f"weights manifest of version {version} from the trainer: "
                                  "sha256 does not match the published pointer")
        manifest = parse_manifest(body)
        job_dir = self._cache_dir / _plain_name(job_id, "job_id")
        final = job_dir / _plain_name(manifest.file, "manifest file")
        local_manifest = final.with_name(final.name + MANIFEST_SUFFIX)
        if await asyncio.to_thread(_is_cached, local_manifest, body):
            return FetchedVersion(local_manifest, manifest_sha256)
        await asyncio.to_thread(job_dir.mkdir, parents=True, exist_ok=True)
        part = final.with_name(final.name + PART_SUFFIX)
        await self._fetch_file(job_id, manifest, part)
        await asyncio.to_thread(install, part, final, local_manifest, body)
        await asyncio.to_thread(prune_cache, job_dir, KEEP_CACHED_VERSIONS)
        return FetchedVersion(local_manifest, manifest_sha256, True, manifest.size_bytes)

    async def fetch_model_dir(self, job_id: str) -> Path:
        """A local copy of the job's model directory (config, tokenizer, starting
        weights): each file checked against the sha256 the trainer lists, files already
        here and equal kept."""
        files = await self._retrying(lambda: self._client.list_model_files(job_id),
                                     f"the model files of job {job_id}")
        folder = self._cache_dir / _plain_name(job_id, "job_id") / MODEL_DIR
        await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
        for file in files:
            target = folder / _plain_name(file.name, "model file")
            if not await asyncio.to_thread(_is_same, target, file):
                await self._retrying(lambda f=file, t=target: self._download(job_id, f, t),
                                     f"model file {file.name}")
        return folder

    async def _download(self, job_id: str, file: ModelFile, target: Path) -> None:
        part = target.with_name(target.name + PART_SUFFIX)
        whole = hashlib.sha256()
        with part.open("wb") as out:
            async for chunk in self._client.fetch_model_file(job_id, file.name):
                await asyncio.to_thread(_write_hashed, out, whole, chunk.data)
        if whole.hexdigest() != file.sha256 or part.stat().st_size != file.size_bytes:
            part.unlink(missing_ok=True)
            raise WeightSyncError(f"model file {file.name} from the trainer: size or sha256 "
                                  "mismatch")
        os.replace(part, target)

    async def _manifest(self, job_id: str, version: int) -> bytes:
        return await self._retrying(lambda: self._client.get_manifest(job_id, version),
                                    f"weights version {version}")

    async def _retrying(self, call: Callable[[], Awaitable[R]], what: str) -> R:
        """``call()``, again after a full server's hint or a broken connection."""
        attempt = 0
        while True:
            try:
                return await call()
            except ResourceExhausted as exc:
                self.last.num_refused += 1
                await asyncio.sleep(exc.retry_after_ms / 1000)
            except (Unavailable, DeadlineExceeded):
                attempt = await self._backoff(attempt, what)

    async def _fetch_file(self, job_id: str, manifest: WeightManifest, part: Path) -> None:
        next_chunk = await asyncio.to_thread(resume_point, part, manifest)
        self.last.resumed_from_chunk = next_chunk
        attempt = 0
        fd = await asyncio.to_thread(open_part, part, manifest.size_bytes)
        try:
            transfer = _Transfer(manifest, fd, next_chunk)
            while transfer.next_chunk < len(manifest.chunks):
                started_at = transfer.next_chunk
                try:
                    await self._stream(job_id, transfer)
                except ResourceExhausted as exc:
                    self.last.num_refused += 1
                    await asyncio.sleep(exc.retry_after_ms / 1000)
                except (Unavailable, DeadlineExceeded):
                    # Retries count breaks in a row: a stream that made progress
                    # before it broke starts the count again.
                    attempt = 0 if transfer.next_chunk > started_at else attempt
                    attempt = await self._backoff(
                        attempt, f"weights version {manifest.version}",
                        f"; the next attempt resumes from chunk {transfer.next_chunk}")
                except WeightSyncError:
                    part.unlink(missing_ok=True)  # a refused version leaves nothing behind
                    raise
            size_bytes = os.fstat(fd).st_size
        finally:
            os.close(fd)
        # Every chunk matched and they tile the file, so the size is all that is left
        # to check (a .part cut or grown by something else meanwhile would show here).
        if size_bytes != manifest.size_bytes:
            part.unlink(missing_ok=True)
            raise WeightSyncError(f"weights version {manifest.version} from the trainer: "
                                  f"{size_bytes} bytes written, the manifest says "
                                  f"{manifest.size_bytes}")

    async def _stream(self, job_id: str, transfer: _Transfer) -> None:
        """Append good chunks from one stream, advancing ``transfer.next_chunk`` (a bad
        chunk ends the stream early, to be asked for once more)."""
        manifest = transfer.manifest
        async for chunk in self._client.fetch_chunks(job_id, manifest.version,
                                                     transfer.next_chunk):
            index = transfer.next_chunk
            spec = manifest.chunks[index]
            # Hashing and writing run in a thread (hashlib releases the GIL): the event
            # loop keeps serving the instance's other work during a chunk.
            if chunk.index != index or not await asyncio.to_thread(write_checked, transfer.fd,
                                                                   spec, chunk.data):
                if index in transfer.refetched:
                    raise WeightSyncError(
                        f"weights version {manifest.version} from the trainer: chunk "
                        f"{index} (offset {spec.offset}) failed its sha256 twice")
                logger.warning("[weights] chunk %d of version %d failed its sha256; "
                               "fetching it again", index, manifest.version)
                transfer.refetched.add(index)
                self.last.num_chunks_refetched += 1
                return
            self.last.num_chunks_fetched += 1
            transfer.next_chunk = index + 1

    async def _backoff(self, attempt: int, what: str, note: str = "") -> int:
        """Wait before retrying a broken call; raise once the retries are spent."""
        attempt += 1
        self.last.num_stream_retries += 1
        if attempt > self._max_stream_retries:
            raise Unavailable(f"trainer unreachable while fetching {what} "
                              f"({self._max_stream_retries} retries){note}")
        logger.warning("[weights] fetch of %s broke; retry %d", what, attempt)
        await asyncio.sleep(self._retry_backoff_s * 2 ** (attempt - 1))
        return attempt


class WeightSource:
    """Resolves a published version to a manifest path this instance can read."""

    def __init__(self, mode: str, fetcher: WeightFetcher | None) -> None:
        if mode not in WEIGHT_SOURCES:
            raise ValueError(f"config weights_source: expected one of {WEIGHT_SOURCES}, "
                             f"got {mode!r}")
        if mode != "filesystem" and fetcher is None:
            raise ValueError(f"config weights_source={mode} needs a weight fetcher")
        self.mode = mode
        self._fetcher = fetcher

    async def manifest_path(self, job_id: str, policy: t.PolicyInfo) -> Path:
        """The shared path when allowed and readable, else a fetched local copy."""
        return (await self.weights(job_id, policy)).manifest_path

    async def weights(self, job_id: str, policy: t.PolicyInfo) -> FetchedVersion:
        """The shared path (unverified) when allowed and readable, else a fetched local
        copy (verified as it arrived)."""
        shared = Path(policy.weights_path)
        if self.mode == "filesystem" or (
                self.mode == "auto" and await asyncio.to_thread(_is_readable, shared)):
            return FetchedVersion(shared, policy.sha256)
        assert self._fetcher is not None  # checked in __init__
        return await self._fetcher.fetch_version(job_id, policy.version, policy.sha256)

    async def model_dir(self, job_id: str, policy: t.PolicyInfo) -> str:
        """The job's model directory: the shared one when allowed and readable, else a
        fetched local copy."""
        shared = Path(policy.model_dir)
        if self.mode == "filesystem" or (
                self.mode == "auto" and await asyncio.to_thread(_is_model_dir, shared)):
            return policy.model_dir
        assert self._fetcher is not None  # checked in __init__
        return str(await self._fetcher.fetch_model_dir(job_id))


def verified_weights(fetched: FetchedVersion) -> Path:
    """The weights file of a copy this process verified as it wrote it, for the engine
    to map (each byte was hashed on arrival against the pinned manifest): size checked,
    neither read nor hashed again.

    Raises:
        WeightSyncError: The copy is unverified, missing or not its verified size.
    """
    if not fetched.verified:
        raise WeightSyncError(f"weights copy {fetched.manifest_path} was not verified here")
    name = fetched.manifest_path.name.removesuffix(MANIFEST_SUFFIX)
    weights = fetched.manifest_path.with_name(name)
    try:
        size_bytes = weights.stat().st_size
    except OSError as exc:
        raise WeightSyncError(f"weights file {weights} unreadable: {exc}") from exc
    if size_bytes != fetched.size_bytes:
        raise WeightSyncError(f"weights file {weights}: {size_bytes} bytes, verified "
                              f"{fetched.size_bytes}")
    return weights


def _plain_name(name: str, what: str) -> str:
    """``name`` when it is one path component (it comes from the network)."""
    if not name or name in (".", "..") or Path(name).name != name:
        raise WeightSyncError(f"{what} {name!r} is not a plain file name")
    return name


def _is_readable(manifest: Path) -> bool:
    weights = manifest.with_name(manifest.name.removesuffix(MANIFEST_SUFFIX))
    return all(p.is_file() and os.access(p, os.R_OK) for p in (manifest, weights))


def _is_model_dir(folder: Path) -> bool:
    config = folder / "config.json"
    return config.is_file() and os.access(config, os.R_OK)


def _is_same(target: Path, file: ModelFile) -> bool:
    try:
        return target.stat().st_size == file.size_bytes and sha256_file(target) == file.sha256
    except OSError:
        return False


def _write_hashed(out: BinaryIO, whole: Any, data: bytes) -> None:
    out.write(data)
    whole.update(data)


def _is_cached(local_manifest: Path, body: bytes) -> bool:
    try:
        return local_manifest.read_bytes() == body and _is_readable(local_manifest)
    except OSError:
        return False
