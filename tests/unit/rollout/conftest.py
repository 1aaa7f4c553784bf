"""The ``rig`` fixture: a RolloutCore over a real Redis store (see rig.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.rollout.rig import Rig, started_rig


@pytest.fixture
async def rig(redis_server, tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(redis_server.url, tmp_path) as rig:
        yield rig
