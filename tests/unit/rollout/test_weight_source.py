"""WeightSource: which source a weights_source setting allows (bad settings are refused
naming the option)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra import types as t
from services.rollout.weight_fetcher import WeightSource


def test_an_unknown_source_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="config weights_source: expected one of"):
        WeightSource("nfs", None)


@pytest.mark.parametrize("mode", ["auto", "grpc"])
def test_a_source_that_may_fetch_needs_a_fetcher(mode: str) -> None:
    with pytest.raises(ValueError, match=f"weights_source={mode} needs a weight fetcher"):
        WeightSource(mode, None)


async def test_filesystem_source_returns_the_published_path_as_is(tmp_path: Path) -> None:
    policy = t.PolicyInfo(2, str(tmp_path / "v000002.safetensors.manifest.json"), "ab" * 32,
                          "", 0)
    path = await WeightSource("filesystem", None).manifest_path("job", policy)
    assert path == tmp_path / "v000002.safetensors.manifest.json"
