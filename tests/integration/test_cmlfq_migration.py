"""C-MLFQ end to end: a trajectory migrates between two real rollout processes mid-run.

`libra up` starts Redis and the five services (rollout-0 serves `short`, rollout-1
`long`). The job uses C-MLFQ with `short.max_tokens = 1`: once the first trajectory
with a tool call has finished, the prefix tree holds evidence for the tool-return
state, and any evidence maps to `long` (whatever remains after a tool return is more
than one token), so the next tool return in `short` is a MOVE. The move is a handoff
through Redis (tokens, masks, log-probs, versions), and the trajectory finishes on
rollout-1 and is trained on.
"""

from __future__ import annotations

import pytest
import redis as redis_sync

from libra import redis_keys as keys
from libra import types as t
from libra.wire.common import decode_trajectory
from libra_cli import stack
from tests.integration.stack_helpers import migrating_cmlfq_job, wait_for_job

pytestmark = pytest.mark.integration

NUM_STEPS = 8


@pytest.fixture
def running_stack(shared_stack: dict) -> dict:
    """The package's shared stack (conftest.py): this module's jobs only submit and read."""
    return shared_stack


async def test_trajectory_migrates_to_long_and_finishes_there(running_stack: dict) -> None:
    client = stack.coordinator_client(running_stack)
    job = await client.create_job(migrating_cmlfq_job(NUM_STEPS), "json")
    job, steps, counters = await wait_for_job(client, job.job_id, timeout_s=180)
    await client.close()
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert counters["migrations"] >= 1, counters
    assert counters["placed:long"] >= 1, counters
    # Per-step report keys: deltas of the cumulative counters.
    assert len(steps) == NUM_STEPS
    assert sum(s["migrations"] for s in steps) <= counters["migrations"]
    assert all(set(s["bucket_occupancy"]) <= {"short", "long"} for s in steps)
    r = redis_sync.from_url(running_stack["redis_url"])
    published = [decode_trajectory(fields[b"data"])
                 for _id, fields in r.xrange(keys.trajectories(job.job_id))]
    migrated = [tr for tr in published if tr.num_migrations >= 1]
    assert migrated, "no migrated trajectory was published"
    for traj in migrated:
        assert traj.status is t.TrajectoryStatus.FINISHED, traj.failure_reason
        assert traj.check_aligned() is None
        assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
        assert traj.tool_states, "a move happens only at a tool return"
        # Two buckets, entered at `short`: an odd number of moves ends on `long`.
        on_long = traj.num_migrations % 2 == 1
        assert (traj.instance_id, traj.bucket) == (
            ("rollout-1", "long") if on_long else ("rollout-0", "short"))
    assert any(tr.instance_id == "rollout-1" for tr in migrated)
    print(f"migrations={counters['migrations']} migrated_published={len(migrated)} "
          f"occupancy={[s['bucket_occupancy'] for s in steps]}")
