"""The ``rig`` fixtures: a RolloutCore over the in-memory store (see rig.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.rollout.rig import Rig, started_rig


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path) as rig:
        yield rig


@pytest.fixture
async def short_lease_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """A rig whose lease is renewed every 10 ms (lease-loss and re-registration tests)."""
    async with started_rig(tmp_path, lease_ttl_ms=30) as rig:
        yield rig
