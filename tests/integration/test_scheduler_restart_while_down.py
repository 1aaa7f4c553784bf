"""The scheduler is down while a rollout instance restarts; the job still finishes
(real processes: Redis, the five services, the supervisor).

The scheduler is frozen (SIGSTOP: it places and re-queues nothing), rollout-0 is killed
with SIGKILL and brought back by the supervisor under a new lease epoch (it reads only
new inbox entries: what it held is gone with the old process), then the frozen scheduler
is killed and restarted. The new scheduler never saw the old epoch; it finds it in Redis
(``keys.placement_epochs``), so rollout-0's old work is re-queued (its task's attempt
counted) unless it finished before the kill, and the job succeeds, every step recorded
once, the accounting exact. Before the fix that work stayed assigned to rollout-0 under
its first attempt and never ran: the job still ended (the staleness budget had room for
the groups it held), counting it "in flight" for ever.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from libra import redis_keys as keys
from libra import types as t
from libra.redis_connect import redis_client_sync
from libra.wire.common import decode_trajectory
from libra_cli import stack
from tests.integration.stack_helpers import (
    assert_exact_accounting,
    small_job,
    stack_up,
    wait_for_job,
    wait_for_step,
)

pytestmark = pytest.mark.integration
NUM_STEPS = 12
STOP_AFTER_STEP = 3
ROLLOUT = "rollout-0"


@pytest.fixture(scope="module")
def restart_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    yield from stack_up(tmp_path_factory.mktemp("runs"), restart_limit=3)


def pid_of(run_root: str, name: str) -> int:
    state = stack.read_state(Path(run_root))
    assert state is not None, "the supervisor is gone"
    return int(next(s for s in state["services"] if s["name"] == name)["pid"])


async def until(condition: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    """Poll ``condition`` until it is truthy; its value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"not seen in {timeout_s}s: {what}")


async def test_a_rollout_restarted_while_the_scheduler_was_down_does_not_wedge_the_job(
        restart_stack: dict) -> None:
    run_root, redis = restart_stack["run_root"], redis_client_sync(restart_stack["redis_url"])
    client = stack.coordinator_client(restart_stack, timeout_s=5.0)
    job = await client.create_job(small_job(num_steps=NUM_STEPS), "json")
    await wait_for_step(client, job.job_id, STOP_AFTER_STEP)

    def held() -> dict[str, int]:
        """What rollout-0 holds: trajectory id -> attempt."""
        ids = [k for k, v in redis.hgetall(keys.assignments(job.job_id)).items()
               if v == ROLLOUT.encode()]
        tasks = redis.hmget(keys.tasks(job.job_id), ids) if ids else []
        return {k.decode(): decode_trajectory(raw).attempt
                for k, raw in zip(ids, tasks, strict=True) if raw}

    def epoch() -> int | None:
        raw = redis.hget(keys.lease(ROLLOUT), "epoch")
        return int(raw) if raw else None

    await until(held, f"{ROLLOUT} holding work")
    scheduler_pid, rollout_pid = pid_of(run_root, "scheduler"), pid_of(run_root, ROLLOUT)
    os.kill(scheduler_pid, signal.SIGSTOP)
    try:
        held_at_kill, old_epoch = held(), epoch()
        os.kill(rollout_pid, signal.SIGKILL)
        await until(lambda: pid_of(run_root, ROLLOUT) not in (0, rollout_pid),
                    f"{ROLLOUT} restarted")
        await until(lambda: epoch() not in (None, old_epoch), f"{ROLLOUT}'s new lease")
    finally:
        os.kill(scheduler_pid, signal.SIGKILL)  # killed while stopped: never ran again
    await until(lambda: pid_of(run_root, "scheduler") not in (0, scheduler_pid),
                "the scheduler restarted")
    print(f"\n[restart] {ROLLOUT} held {len(held_at_kill)} at its restart (epoch "
          f"{old_epoch} -> {epoch()})")

    job, steps, counters = await wait_for_job(client, job.job_id, timeout_s=180.0)
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert [s["step"] for s in steps] == list(range(1, NUM_STEPS + 1))  # each once
    assert_exact_accounting(restart_stack["redis_url"], job, steps, counters)
    # What the old incarnation held finished before the kill, or was re-queued (a later
    # attempt): none of it is still waiting on an instance that will never run it.
    still = [tid for tid, attempt in held_at_kill.items()
             if held().get(tid) == attempt]
    assert not still, f"assigned to {ROLLOUT} since before its restart: {still}"
    await client.close()
