"""The job queue and `resume` on the real stack (Redis + the five services as processes,
the tiny model, a few steps each).

1. Two jobs submitted back to back: the second waits PENDING (queue position 1) while
   the first runs, then starts by itself; both reach SUCCEEDED, in submit order, each
   with every step once and exact accounting.
2. A job with a checkpoint every step, cancelled after a couple of steps, resumed under
   its id: it reaches SUCCEEDED with ``num_steps`` steps, and the report's accounting
   identity holds over the whole job (both runs).
"""

from __future__ import annotations

import pytest

from libra import types as t
from libra_cli import stack
from tests.integration.stack_helpers import (
    assert_exact_accounting,
    event_kinds,
    small_job,
    wait_for_job,
    wait_for_step,
)

pytestmark = pytest.mark.integration
# Long enough that a cancel sent as soon as step 2 is seen lands mid-job: 28 steps of
# margin, each a checkpoint and a fraction of a second here (the client's poll-and-cancel
# takes milliseconds); a job that ended first fails the CANCELLED assertion, loudly. Short
# enough for seconds of work after the resume (100 steps took ~1 min on a loaded machine).
NUM_STEPS = 30


@pytest.fixture
def queue_stack(shared_stack: dict) -> dict:
    """The package's shared stack (conftest.py): this module's jobs only submit and read."""
    return shared_stack


async def test_two_jobs_submitted_back_to_back_both_succeed_in_order(
        queue_stack: dict) -> None:
    client = stack.coordinator_client(queue_stack)
    first = await client.create_job(small_job(num_steps=2), "json")
    second = await client.create_job(small_job(num_steps=2), "json")
    assert first.state is t.JobState.RUNNING
    assert (second.state, second.queue_position) == (t.JobState.PENDING, 1)

    done_first, steps_first, counters_first = await wait_for_job(client, first.job_id)
    assert done_first.state is t.JobState.SUCCEEDED, done_first.message
    done_second, steps_second, counters_second = await wait_for_job(client, second.job_id)
    assert done_second.state is t.JobState.SUCCEEDED, done_second.message
    # In order: the second job's run started only once the first had ended.
    assert done_first.updated_at_ms <= done_second.updated_at_ms
    assert [s["step"] for s in steps_first] == [1, 2]
    assert [s["step"] for s in steps_second] == [1, 2]
    for job, steps, counters in ((done_first, steps_first, counters_first),
                                 (done_second, steps_second, counters_second)):
        assert_exact_accounting(queue_stack["redis_url"], job, steps, counters)
    assert all(j.queue_position == 0 for j in await client.list_jobs())
    await client.close()


async def test_a_cancelled_job_resumed_from_its_checkpoint_succeeds_with_exact_accounting(
        queue_stack: dict) -> None:
    client = stack.coordinator_client(queue_stack)
    job = await client.create_job(small_job(num_steps=NUM_STEPS, checkpoint_interval=1),
                                  "json")
    reached = await wait_for_step(client, job.job_id, 2)
    assert reached.state is t.JobState.RUNNING, reached.message
    cancelled = await client.cancel_job(job.job_id, "pause for the test")
    assert cancelled.state is t.JobState.CANCELLED

    resumed = await client.resume_job(job.job_id)
    assert (resumed.job_id, resumed.num_resumes) == (job.job_id, 1)
    assert resumed.state is t.JobState.RUNNING
    done, steps, counters = await wait_for_job(client, job.job_id)
    assert done.state is t.JobState.SUCCEEDED, done.message
    assert [s["step"] for s in steps] == list(range(1, NUM_STEPS + 1))
    report = assert_exact_accounting(queue_stack["redis_url"], done, steps, counters)
    algo = {"prompts_per_step": 2, "samples_per_prompt": 2}
    # Every step trained a whole batch (steps redone after the checkpoint count again).
    assert report["trained"] >= NUM_STEPS * algo["prompts_per_step"] * algo[
        "samples_per_prompt"]
    print(f"\n[resume] cancelled at step {cancelled.step}; after the resume: "
          f"{len(steps)} steps, accounting {report}")
    kinds = event_kinds(queue_stack["redis_url"], job.job_id)
    assert "job_resumed" in kinds and "trainer_resumed" in kinds
    await client.close()
