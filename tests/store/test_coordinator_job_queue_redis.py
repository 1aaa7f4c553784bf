"""The job-queue and resume tests of ``tests/unit/coordinator/test_job_queue.py`` again,
on ``RedisCoordinatorStore`` against the session's real redis-server (the unit module
runs them on the in-memory store): the queue's order, bounds and resume hold on both.
The tests are collected here by import; only the ``rig`` fixture differs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from libra.clock import FakeClock
from services.coordinator.store import RedisCoordinatorStore
from tests.unit.coordinator.test_job_queue import *  # noqa: F403 - the same tests, here
from tests.unit.coordinator.test_job_queue import Rig, _settled  # noqa: F401 - autouse


@pytest.fixture
def rig(redis: Any, tmp_path: Path) -> Rig:
    clock = FakeClock()
    return Rig(RedisCoordinatorStore(redis, clock), clock, tmp_path)
