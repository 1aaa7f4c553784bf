"""Chunked, checksummed weight manifests: what is loaded is exactly what was checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra.weight_sync import WeightSyncError, read_verified, write_manifest


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
