"""Chunked, checksummed weight manifests: what is loaded is exactly what was checked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from libra.weight_sync import WeightSyncError, parse_manifest, read_verified, write_manifest


def _publish(tmp_path: Path, data: bytes = b"0123456789" * 10) -> tuple[Path, Path, str]:
    weights = tmp_path / "v000001.safetensors"
    weights.write_bytes(data)
    manifest, digest = write_manifest(weights, version=1, chunk_bytes=32)
    return weights, manifest, digest


def test_verified_read_returns_the_published_bytes(tmp_path: Path) -> None:
    weights, manifest, digest = _publish(tmp_path)
    assert manifest.name == "v000001.safetensors.manifest.json"
    assert read_verified(manifest, digest) == weights.read_bytes()


def test_a_flipped_byte_names_the_file_and_chunk(tmp_path: Path) -> None:
    weights, manifest, digest = _publish(tmp_path)
    data = bytearray(weights.read_bytes())
    data[70] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(WeightSyncError, match=r"v000001\.safetensors: chunk 2 \(offset 64\)"):
        read_verified(manifest, digest)


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    weights, manifest, digest = _publish(tmp_path, b"x" * 64)
    weights.write_bytes(b"x" * 32)
    with pytest.raises(WeightSyncError, match="mismatch"):
        read_verified(manifest, digest)


def test_a_manifest_not_matching_the_pointer_is_refused(tmp_path: Path) -> None:
    _, manifest, _ = _publish(tmp_path)
    with pytest.raises(WeightSyncError, match="manifest .* sha256 mismatch"):
        read_verified(manifest, "0" * 64)


def test_a_missing_weight_file_is_refused_naming_it(tmp_path: Path) -> None:
    weights, manifest, digest = _publish(tmp_path)
    weights.unlink()
    with pytest.raises(WeightSyncError, match=r"v000001\.safetensors unreadable"):
        read_verified(manifest, digest)


def _republish(manifest: Path, edit) -> str:  # noqa: ANN001
    """Rewrite ``manifest`` through ``edit`` (a pinned manifest from a faulty writer);
    returns the new body's sha256, which a pointer would then carry."""
    raw = json.loads(manifest.read_bytes())
    edit(raw)
    body = json.dumps(raw).encode()
    manifest.write_bytes(body)
    return hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize(("edit", "match"), [
    # A chunk dropped: its bytes would be covered by no hash.
    (lambda raw: raw["chunks"].pop(1), "chunk 1 at offset 64"),
    # A chunk repeated over the previous one's bytes.
    (lambda raw: raw["chunks"][1].update(offset=0), "chunk 1 at offset 0"),
    # The file claimed longer than its chunks.
    (lambda raw: raw.update(size_bytes=raw["size_bytes"] + 1), "chunks cover 100 bytes"),
])
def test_a_pinned_manifest_whose_chunks_do_not_tile_the_file_is_refused(
        tmp_path: Path, edit, match: str) -> None:  # noqa: ANN001
    _, manifest, _ = _publish(tmp_path)
    digest = _republish(manifest, edit)
    with pytest.raises(WeightSyncError, match=match):
        read_verified(manifest, digest)


def test_the_file_is_verified_by_its_chunks_and_size(tmp_path: Path) -> None:
    """The whole-file sha256 in the manifest is not what decides: a manifest whose
    chunks tile the file is enough, and a file of another size is refused first."""
    weights, manifest, _ = _publish(tmp_path)
    digest = _republish(manifest, lambda raw: raw.update(sha256="0" * 64))
    assert read_verified(manifest, digest) == weights.read_bytes()
    weights.write_bytes(weights.read_bytes() + b"!")
    with pytest.raises(WeightSyncError, match="101 bytes, the manifest says 100"):
        read_verified(manifest, digest)


def test_parse_manifest_refuses_a_gap(tmp_path: Path) -> None:
    _, manifest, _ = _publish(tmp_path)
    raw = json.loads(manifest.read_bytes())
    raw["chunks"][2]["offset"] += 1
    with pytest.raises(WeightSyncError, match="does not follow the previous chunk"):
        parse_manifest(json.dumps(raw).encode())
