"""Versioned weight files with a chunked, checksummed manifest (pure: hashlib, json, os).

The trainer writes ``vNNNNNN.safetensors`` and then :func:`write_manifest` writes
``vNNNNNN.safetensors.manifest.json`` beside it (atomically: temp file + rename) with the
sha256 of every ``chunk_bytes`` chunk and of the whole file. The policy pointer in Redis
names the manifest and carries the manifest's own sha256. A rollout instance calls
:func:`read_verified`, which returns the weight bytes only when the manifest and every
chunk match, so what it loads is exactly what was checked: a mismatch names the file
and the chunk, and the old weights keep serving.

Verified once: the pointer pins the manifest, the manifest pins every chunk, and
:func:`parse_manifest` refuses chunks that do not tile the file end to end. Every byte
is then covered by exactly one pinned chunk hash, so readers check the chunks and the
size, not the whole-file sha256 as well (a second pass over every byte, 0.29 CPU s per
538 MB here, that could refuse nothing the chunks let through). The manifest keeps the
whole-file sha256 for tools that check a file without its chunks.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

MANIFEST_SUFFIX = ".manifest.json"
# 1 MiB: also the message size of the gRPC weight stream (services/trainer/weight_server.py),
# where grpc.aio moved 1 MiB messages at 400-560 MB/s and 4 MiB ones at 75-170 MB/s on one
# loopback stream (benchmarks/bench_weight_fetch.py, docs/weights.md).
CHUNK_BYTES = 1 << 20


class WeightSyncError(RuntimeError):
    """Published weights that must not be loaded; the message names the file."""


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """One chunk of a weights file: where it lies and its sha256."""

    offset: int
    length: int
    sha256: str


@dataclass(frozen=True, slots=True)
class WeightManifest:
    """A published version's manifest (the JSON :func:`write_manifest` writes)."""

    version: int
    file: str
    size_bytes: int
    sha256: str
    chunks: tuple[ChunkSpec, ...]


@dataclass(frozen=True, slots=True)
class WeightChunk:
    """One chunk of a version's weights file as served over gRPC (``index`` counts from
    0 in the manifest's order)."""

    index: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ModelFile:
    """One file of a job's model directory (config, tokenizer, starting weights)."""

    name: str
    size_bytes: int
    sha256: str


def parse_manifest(body: bytes) -> WeightManifest:
    """The manifest in ``body`` (checked against its sha256 by the caller first).

    Raises:
        WeightSyncError: ``body`` is not a manifest.
    """
    try:
        raw = json.loads(body)
        manifest = WeightManifest(
            version=int(raw["version"]), file=str(raw["file"]),
            size_bytes=int(raw["size_bytes"]), sha256=str(raw["sha256"]),
            chunks=tuple(ChunkSpec(int(c["offset"]), int(c["length"]), str(c["sha256"]))
                         for c in raw["chunks"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise WeightSyncError(f"not a weights manifest: {exc}") from exc
    _check_tiling(manifest)
    return manifest


def _check_tiling(manifest: WeightManifest) -> None:
    """Chunks back to back from offset 0 to ``size_bytes``: then the chunk hashes cover
    every byte once, and verifying them verifies the file."""
    offset = 0
    for index, chunk in enumerate(manifest.chunks):
        if chunk.offset != offset or chunk.length <= 0:
            raise WeightSyncError(f"weights manifest of {manifest.file}: chunk {index} at "
                                  f"offset {chunk.offset} (length {chunk.length}) does not "
                                  f"follow the previous chunk (offset {offset})")
        offset += chunk.length
    if offset != manifest.size_bytes:
        raise WeightSyncError(f"weights manifest of {manifest.file}: chunks cover {offset} "
                              f"bytes, size_bytes is {manifest.size_bytes}")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(weights_path: Path, version: int,
                   chunk_bytes: int = CHUNK_BYTES) -> tuple[Path, str]:
    """Describe ``weights_path`` chunk by chunk; returns the manifest path and its sha256."""
    whole = hashlib.sha256()
    chunks = []
    with weights_path.open("rb") as fh:
        offset = 0
        for block in iter(lambda: fh.read(chunk_bytes), b""):
            whole.update(block)
            chunks.append({"offset": offset, "length": len(block),
                           "sha256": hashlib.sha256(block).hexdigest()})
            offset += len(block)
    body = json.dumps({"version": version, "file": weights_path.name, "size_bytes": offset,
                       "sha256": whole.hexdigest(), "chunks": chunks}, indent=1).encode()
    manifest = weights_path.with_name(weights_path.name + MANIFEST_SUFFIX)
    tmp = manifest.with_name(manifest.name + ".tmp")
    tmp.write_bytes(body)
    os.replace(tmp, manifest)
    return manifest, hashlib.sha256(body).hexdigest()


def read_verified(manifest_path: Path, manifest_sha256: str) -> bytes:
    """The weight file's bytes, after checking the manifest, the size and every chunk
    (one sha256 pass: the chunks tile the file, see the module docstring).

    Raises:
        WeightSyncError: The manifest or weight file is missing, unreadable or does not
            match its checksum.
    """
    try:
        body = manifest_path.read_bytes()
    except OSError as exc:
        raise WeightSyncError(f"weights manifest {manifest_path} unreadable: {exc}") from exc
    if hashlib.sha256(body).hexdigest() != manifest_sha256:
        raise WeightSyncError(f"weights manifest {manifest_path}: sha256 mismatch")
    manifest = parse_manifest(body)
    weights_path = manifest_path.with_name(manifest.file)
    try:
        data = weights_path.read_bytes()
    except OSError as exc:
        raise WeightSyncError(f"weights file {weights_path} unreadable: {exc}") from exc
    if len(data) != manifest.size_bytes:
        raise WeightSyncError(f"weights file {weights_path}: {len(data)} bytes, the manifest "
                              f"says {manifest.size_bytes} (size mismatch)")
    view = memoryview(data)  # slices without copies
    for index, chunk in enumerate(manifest.chunks):
        block = view[chunk.offset: chunk.offset + chunk.length]
        if hashlib.sha256(block).hexdigest() != chunk.sha256:
            raise WeightSyncError(f"weights file {weights_path}: chunk {index} "
                                  f"(offset {chunk.offset}) sha256 mismatch")
    return data
