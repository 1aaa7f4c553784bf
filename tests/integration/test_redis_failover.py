"""Redis failover under a running job: the master is killed (SIGKILL) mid-job, Sentinel
promotes the replica, and the job succeeds with exact accounting (real processes).

The stack (`libra up`) is given a redis+sentinel:// URL instead of its embedded Redis:
a master, one replica and three sentinels (tests/fixtures/redis_sentinel.py). Every
service finds the master through the sentinels and follows the promotion by itself; no URL changes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from libra import errors
from libra import types as t
from libra_cli import stack
from tests.fixtures.redis_sentinel import sentinel_group
from tests.integration.stack_helpers import (
    assert_exact_accounting,
    small_job,
    wait_for_job,
    wait_for_step,
    write_stack,
)

pytestmark = [
    pytest.mark.integration,
    # The failover outlasts the coordinator store's 1.5 s of retries; the trainer rides it
    # out only if the coordinator then answers UNAVAILABLE (retried for 600 s), not the
    # UNKNOWN an unmapped redis error gives: that mapping comes with branch wt-rel
    # ("Redis unreachable -> UNAVAILABLE"). With it applied the test passes (20 s, here).
    pytest.mark.skipif(not hasattr(errors, "as_unavailable"),
                       reason="needs Redis-unreachable -> UNAVAILABLE (branch wt-rel)"),
]
NUM_STEPS = 12
KILL_AFTER_STEP = 3


async def test_master_killed_mid_job_the_job_succeeds_on_the_promoted_replica(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    group = sentinel_group(tmp_path / "redis")
    monkeypatch.setenv("REDIS_URL", group.url)  # the launcher's external Redis
    run_root = tmp_path / "runs"
    run_root.mkdir()
    try:
        state = stack.up(run_root, write_stack(run_root / "stack.toml", restart_limit=3),
                         timeout_s=120)
        assert state["redis_url"] == group.url and state["redis_pid"] is None
        client = stack.coordinator_client(state, timeout_s=5.0)
        job = await client.create_job(
            small_job(num_steps=NUM_STEPS, checkpoint_interval=2), "json")
        before = await wait_for_step(client, job.job_id, KILL_AFTER_STEP)
        assert before.state is t.JobState.RUNNING, before
        old = group.data_ports[0]
        killed_at = time.monotonic()
        group.kill_server(old)
        new = group.wait_for_master(not_port=old)
        promoted_s = time.monotonic() - killed_at
        after = await wait_for_step(client, job.job_id, before.step + 2)
        print(f"\n[failover] master {old} killed at step >= {before.step}: replica {new} "
              f"promoted {promoted_s:.1f}s later, step {after.step} recorded "
              f"{time.monotonic() - killed_at:.1f}s after the kill")
        job, steps, counters = await wait_for_job(client, job.job_id)
        assert job.state is t.JobState.SUCCEEDED, job.message
        assert [s["step"] for s in steps] == list(range(1, NUM_STEPS + 1))  # each once
        assert_exact_accounting(group.url, job, steps, counters)
        assert counters.get("trained", 0) > 0
        # Restarts are reported, not asserted: in 2 of 7 runs on a loaded machine both
        # rollout instances were restarted once by the supervisor (the job still
        # succeeded, exactly accounted); in the others none was.
        services = stack.read_state(run_root)["services"]
        print(f"[failover] restarts: {({s['name']: s['restarts'] for s in services})}")
        await client.close()
    finally:
        stack.down(run_root)
        group.stop()
