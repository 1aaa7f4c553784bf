"""A whole-stack restart wedges nothing (real processes): `libra down` mid-job, then
`libra up` over the same Redis (AOF): the job found RUNNING is taken up again from its
checkpoint and succeeds; a later submit is accepted.

(kill -9 of the coordinator alone mid-job is a case of test_fault_matrix.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from libra import types as t
from libra_cli import stack
from tests.integration.stack_helpers import (
    assert_exact_accounting,
    event_kinds,
    small_job,
    wait_for_job,
    wait_for_step,
    write_stack,
)

pytestmark = pytest.mark.integration
NUM_STEPS_LONG = 60


async def test_a_job_running_when_the_stack_went_down_is_resumed_when_it_comes_up(
        tmp_path: Path) -> None:
    run_root = tmp_path / "runs"
    run_root.mkdir()
    stack_file = write_stack(run_root / "stack.toml", restart_limit=0)
    state = stack.up(run_root, stack_file, timeout_s=120)
    try:
        client = stack.coordinator_client(state, timeout_s=5.0)
        # Long enough (a step takes ~0.1 s here) to be mid-run when the stack stops.
        job = await client.create_job(small_job(num_steps=NUM_STEPS_LONG,
                                                checkpoint_interval=2), "json")
        reached = await wait_for_step(client, job.job_id, 3)
        assert reached.state is t.JobState.RUNNING, reached
        await client.close()
        assert stack.down(run_root)  # as Ctrl-C on an older `libra run` did
        state = stack.up(run_root, stack_file, timeout_s=120)  # the same Redis data
        client = stack.coordinator_client(state, timeout_s=5.0)
        job, steps, counters = await wait_for_job(client, job.job_id)
        assert job.state is t.JobState.SUCCEEDED, job.message
        # Steps redone from the checkpoint replaced their records: one per step.
        assert [s["step"] for s in steps] == list(range(1, NUM_STEPS_LONG + 1))
        assert "trainer_resumed" in event_kinds(state["redis_url"], job.job_id)
        assert_exact_accounting(state["redis_url"], job, steps, counters)
        # Nothing blocks the next submit.
        nxt = await client.create_job(small_job(num_steps=1), "json")
        assert nxt.state is t.JobState.RUNNING
        await client.cancel_job(nxt.job_id)
        await client.close()
    finally:
        stack.down(run_root)
