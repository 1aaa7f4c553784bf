"""kill -9 the trainer mid-run on the real stack: the supervisor restarts it, it resumes
from its last checkpoint, the job completes and the accounting is exact, with no
trajectory trained twice."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest
import redis as redis_sync

from libra import redis_keys as keys
from libra import types as t
from libra_cli import stack
from tests.integration.stack_helpers import (
    assert_exact_accounting,
    small_job,
    stack_up,
    wait_for_job,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def restarting_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    yield from stack_up(tmp_path_factory.mktemp("runs"), restart_limit=1)


async def test_trainer_killed_mid_run_resumes_from_its_checkpoint(restarting_stack: dict) -> None:
    client = stack.coordinator_client(restarting_stack)
    job = await client.create_job(small_job(num_steps=6, checkpoint_interval=2), "json")
    for _ in range(1200):
        current, _, _ = await client.get_job(job.job_id)
        if current.step >= 3 or current.state.is_terminal:
            break
        await asyncio.sleep(0.05)
    assert current.step >= 3, current
    trainer = next(s for s in restarting_stack["services"] if s["name"] == "trainer")
    os.kill(trainer["pid"], signal.SIGKILL)

    job, steps, counters = await wait_for_job(client, job.job_id)
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert steps[-1]["step"] == 6
    r = redis_sync.from_url(restarting_stack["redis_url"])
    kinds = [e[b"kind"] for _, e in r.xrange(keys.events(job.job_id))]
    assert b"trainer_resumed" in kinds
    # Nothing trained or dropped twice: each consumed id is in the set exactly once.
    assert_exact_accounting(restarting_stack["redis_url"], job, steps, counters)
    # The versions keep increasing across the restart (none reused).
    versions = [s["policy_version"] for s in steps]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    await client.close()
