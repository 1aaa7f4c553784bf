"""The elastic hybrid pool on the real stack: the coordinator lends rollout-1 to training,
it joins without pausing the core, contributes gradients in lockstep; then kill -9 of it
mid-run: the step completes (its slice re-assigned), its lease expires, the job ends with
exact accounting."""

from __future__ import annotations

import asyncio
import json
import math
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

# One worker pinned in training: the test needs a join, not the planner's judgement.
ELASTIC = {"enabled": True, "force_hybrids": 1,
           "warmup_steps": 1, "plan_interval_steps": 1, "cooldown_steps": 1,
           "ttl_steps": 1000, "gradient_deadline_s": 5.0, "join_timeout_s": 60.0,
           "lockstep_check_interval": 1}


@pytest.fixture(scope="module")
def elastic_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    yield from stack_up(tmp_path_factory.mktemp("runs"), restart_limit=2)


def events(r: redis_sync.Redis, job_id: str) -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in r.xrange(keys.events(job_id))]


async def wait_for(predicate, timeout_s: float) -> bool:  # noqa: ANN001
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.1)
    return False


async def test_lend_join_lockstep_then_kill_the_hybrid(elastic_stack: dict) -> None:
    client = stack.coordinator_client(elastic_stack)
    spec = json.loads(small_job(num_steps=60, prompts_per_step=4))
    spec["elastic"] = ELASTIC
    job = await client.create_job(json.dumps(spec), "json")
    r = redis_sync.from_url(elastic_stack["redis_url"])
    kinds = lambda: {e["kind"] for e in events(r, job.job_id)}  # noqa: E731
    assert await wait_for(lambda: "hybrid_activated" in kinds(), 120), kinds()
    # Contributing: a step counted a hybrid slice.
    async def contributing() -> bool:
        _, steps, _ = await client.get_job(job.job_id)
        return any(s.get("hybrid_slices", 0) >= 1 for s in steps)
    for _ in range(300):
        if await contributing():
            break
        await asyncio.sleep(0.1)
    assert await contributing()
    rollout = next(s for s in elastic_stack["services"] if s["name"] == "rollout-1")
    os.kill(rollout["pid"], signal.SIGKILL)

    job, steps, counters = await wait_for_job(client, job.job_id, timeout_s=300)
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert all(math.isfinite(s["loss"]) for s in steps)
    after = events(r, job.job_id)
    detached = [e for e in after if e["kind"] == "hybrid_detached"]
    assert detached, [e["kind"] for e in after]
    assert any(e["kind"] == "slice_reassigned" for e in after) or detached
    assert any(s.get("hybrid_workers", 0) >= 1 for s in steps)
    assert_exact_accounting(elastic_stack["redis_url"], job, steps, counters)
    await client.close()
