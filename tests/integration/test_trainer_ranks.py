"""A short job on the real stack with the trainer at num_ranks=2: a gloo group of two
ranks (auto parallelism: DDP on CPU) trains, publishes and checkpoints through the same
command protocol; the job succeeds with the accounting exact, and the worker rank is
stopped when the job ends."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from libra import types as t
from libra_cli import stack
from tests.integration.stack_helpers import (
    assert_exact_accounting,
    small_job,
    stack_up,
    wait_for_job,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

_RANKS_ENV = "LIBRA_TRAINER_NUM_RANKS"


@pytest.fixture(scope="module")
def two_rank_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    # The supervisor and the services inherit the environment: only the trainer reads this.
    previous = os.environ.get(_RANKS_ENV)
    os.environ[_RANKS_ENV] = "2"
    try:
        yield from stack_up(tmp_path_factory.mktemp("runs"), restart_limit=0)
    finally:
        if previous is None:
            os.environ.pop(_RANKS_ENV, None)
        else:
            os.environ[_RANKS_ENV] = previous


def _rank_workers(trainer_pid: int) -> list[int]:
    """The trainer's spawned rank processes (its children running multiprocessing.spawn)."""
    children = Path(f"/proc/{trainer_pid}/task/{trainer_pid}/children").read_text().split()
    workers = []
    for pid in children:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmdline:
            workers.append(int(pid))
    return workers


async def test_two_rank_trainer_runs_a_job_with_exact_accounting(two_rank_stack: dict) -> None:
    client = stack.coordinator_client(two_rank_stack)
    job = await client.create_job(small_job(checkpoint_interval=1), "json")
    job, steps, counters = await wait_for_job(client, job.job_id)
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert [s["policy_version"] for s in steps] == [1, 2, 3]
    for record in steps:
        assert record["is_skipped"] == 0.0
        assert math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])
        assert record["num_tokens"] > 0  # summed over both ranks' shards
        assert "publish_s" in record and "checkpoint_s" in record  # both ranks gathered
    assert counters["trained"] == 3 * 2 * 2
    assert_exact_accounting(two_rank_stack["redis_url"], job, steps, counters)

    trainer = next(row for row in stack.status(two_rank_stack) if row["name"] == "trainer")
    log = Path(trainer["log"]).read_text()
    assert "data-parallel group up ranks=2 parallelism=ddp device=cpu" in log
    await wait_until(lambda: not _rank_workers(trainer["pid"]), timeout_s=60.0)
    await client.close()
