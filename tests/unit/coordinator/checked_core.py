"""A CoordinatorCore with submit-time checks, for tests of what a refused submit leaves.

Real: the job spec parser, ``InMemoryCoordinatorStore``. Fakes: ``FakeRunner`` for the
trainer and scheduler clients, ``FakeClock``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from libra.clock import FakeClock
from libra.errors import InvalidArgument
from services.coordinator.core import CoordinatorCore
from services.coordinator.memory_store import InMemoryCoordinatorStore
from tests.fakes.runner import FakeRunner


class Built:
    """The core with the given checks (``model_check=``, ``dataset_check=``)."""

    def __init__(self, **checks: Any) -> None:
        clock = FakeClock()
        self.store = InMemoryCoordinatorStore(clock)
        self.trainer, self.scheduler = FakeRunner(), FakeRunner()
        self.core = CoordinatorCore(self.store, self.trainer, self.scheduler, clock,
                                    Path("/tmp/libra-test-runs"), **checks)


async def refused(built: Built, spec: str) -> InvalidArgument:
    """The InvalidArgument a submit of ``spec`` raises; asserts nothing was created."""
    with pytest.raises(InvalidArgument) as err:
        await built.core.create_job(spec, "toml")
    assert await built.store.list_jobs() == []
    assert built.trainer.started == [] and built.scheduler.started == []
    return err.value
