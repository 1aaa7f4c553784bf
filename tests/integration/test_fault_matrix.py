"""Fault matrix: kill -9 of each process mid-job; every job still succeeds (real processes).

One stack serves every case (a stack start costs more than a case); the cases run in
order, one job each. For each target - the coordinator, the scheduler, the trainer, a
rollout instance, the tool gateway and the embedded Redis - a job is started, the
target's current pid is read from the stack state and killed with SIGKILL once the job
has recorded a step, and the test checks that

- the job SUCCEEDS with every step recorded exactly once,
- the accounting is exact, measured from Redis (`unaccounted == 0`; the trained-ids set
  holds as many ids as were consumed, so nothing was trained twice),
- the supervisor restarted the target (a new pid), and nothing else: no peer died of
  the target's death (the rollouts did when Redis was killed, before their Redis client
  retried).

Two targets have checks of their own (they were test_coordinator_restart.py's and
test_trainer_resume.py's, which ran the same kill on stacks of their own):

- coordinator: restarted exactly once, and the trainer's step report waited for it
  (retried, keyed): nothing needed resuming or ending (no ``job_reconciled`` event);
- trainer: it resumed from its last checkpoint (``trainer_resumed``), and the policy
  versions kept increasing across the restart (none reused).

The recovery time (kill -> next step recorded) is printed per target.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_sync

from libra import redis_keys as keys
from libra import types as t
from libra_cli import stack
from tests.integration.stack_helpers import (
    assert_exact_accounting,
    event_kinds,
    small_job,
    stack_up,
    wait_for_job,
    wait_for_step,
)

pytestmark = pytest.mark.integration
NUM_STEPS = 16  # steps take ~0.1-0.5 s here: the kill lands well before the end
KILL_AFTER_STEP = 3
# One restart per case at most; a margin so that one extra crash (a peer seeing the
# target die) shows as a failed assertion below, not as a dead stack for later cases.
RESTART_LIMIT = 3
TARGETS = ["coordinator", "scheduler", "trainer", "rollout-0", "toolgateway", "redis"]
KILLED: list[str] = []  # targets killed so far on the module's stack, in order


@pytest.fixture(scope="module")
def fault_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    yield from stack_up(tmp_path_factory.mktemp("runs"), restart_limit=RESTART_LIMIT)


def current_state(run_root: str) -> dict:
    state = stack.read_state(Path(run_root))
    assert state is not None, "the supervisor is gone"
    return state


def target_pid(state: dict, target: str) -> int:
    """The target's pid now (a restarted service has a new one)."""
    if target == "redis":
        return int(state["redis_pid"])
    return int(next(s for s in state["services"] if s["name"] == target)["pid"])


async def wait_for_restart(run_root: str, target: str, old_pid: int,
                           timeout_s: float = 60.0) -> int:
    """The supervisor's state shows a new pid for ``target``; returns it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = stack.read_state(Path(run_root))
        if state is not None and target_pid(state, target) not in (0, old_pid):
            return target_pid(state, target)
        await asyncio.sleep(0.1)
    raise AssertionError(f"{target} (pid {old_pid}) was not restarted in {timeout_s}s")


def recorded_step(redis_url: str, job_id: str) -> int:
    """The job's step as stored in Redis (read directly: the coordinator may be dead)."""
    with redis_sync.from_url(redis_url) as r:
        return int(r.hget(keys.job(job_id), "step") or 0)


@pytest.mark.parametrize("target", TARGETS)
async def test_kill_9_mid_job_the_job_succeeds_with_exact_accounting(
        fault_stack: dict, target: str) -> None:
    run_root = fault_stack["run_root"]
    client = stack.coordinator_client(fault_stack, timeout_s=5.0)
    job = await client.create_job(
        small_job(num_steps=NUM_STEPS, checkpoint_interval=2), "json")
    before = await wait_for_step(client, job.job_id, KILL_AFTER_STEP)
    assert before.state is t.JobState.RUNNING, before
    pid = target_pid(current_state(run_root), target)
    # The step recorded when the kill lands (one may have finished since the poll):
    # recovery counts from the kill to the next step after it.
    at_kill = recorded_step(fault_stack["redis_url"], job.job_id)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    after = await wait_for_step(client, job.job_id, at_kill + 1)
    recovery_s = time.monotonic() - killed_at
    print(f"\n[recovery] {target} kill -9 at step {at_kill}: step {after.step} "
          f"recorded {recovery_s:.1f}s later")
    job, steps, counters = await wait_for_job(client, job.job_id)
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert [s["step"] for s in steps] == list(range(1, NUM_STEPS + 1))  # each once
    # Also: the trained-ids set (SADD per consumed id) is as large as the consumed
    # counters, so no trajectory was trained twice.
    assert_exact_accounting(fault_stack["redis_url"], job, steps, counters)
    assert counters.get("trained", 0) > 0
    new_pid = await wait_for_restart(run_root, target, pid)
    KILLED.append(target)
    kinds = event_kinds(fault_stack["redis_url"], job.job_id)
    if target == "coordinator":
        restarted_row = next(s for s in current_state(run_root)["services"]
                             if s["name"] == "coordinator")
        assert (restarted_row["restarts"], restarted_row["pid"]) == (1, new_pid)
        assert "job_reconciled" not in kinds
    if target == "trainer":
        assert "trainer_resumed" in kinds
        versions = [s["policy_version"] for s in steps]
        assert versions == sorted(versions) and len(set(versions)) == len(versions)
    # Nothing else died of it: only the targets killed so far were ever restarted.
    state = current_state(run_root)
    restarted = {s["name"] for s in state["services"] if s["restarts"]}
    restarted |= {"redis"} if state["redis_restarts"] else set()
    assert restarted == set(KILLED), state
    await client.close()
