"""Eval rounds in SchedulerCore (services/scheduler/evaluation.py) against a real Redis:
admitted when the job's step reaches them, tagged, outside the staleness budget and the
training counters, never twice (a restarted scheduler included), the prompts the same
every round; an overtaken round is skipped."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra.clock import FakeClock
from libra.jobspec import JobSpec, job_spec_from_dict
from libra.wire.common import decode_trajectory
from services.scheduler.core import SchedulerCore
from services.scheduler.store import RedisSchedulerStore
from tests.unit.scheduler.test_scheduler_core import JOB, add_instance, add_job, counters


def eval_spec(cap: int = 16, **task: object) -> JobSpec:
    return job_spec_from_dict({
        "name": "t",
        "task": {"num_prompts": 40, "eval_fraction": 0.25, "eval_interval": 2,
                 "eval_max_prompts": 3, "eval_samples_per_prompt": 2,
                 "eval_temperature": 0.5, **task},
        "algorithm": {"num_steps": 5, "prompts_per_step": 2, "samples_per_prompt": 2,
                      "max_staleness": 0},
        "layout": {"policy": "least_loaded", "buckets": [
            {"name": "short", "max_tokens": 96, "max_trajectories_per_instance": cap}]}})


@pytest.fixture
async def core(redis_bytes: aioredis.Redis) -> SchedulerCore:
    await add_instance(redis_bytes, "rollout-0", "short")
    return await start(redis_bytes, eval_spec())


async def start(r: aioredis.Redis, spec: JobSpec) -> SchedulerCore:
    await add_job(r, spec)
    core = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    await core.start_job(JOB)
    return core


async def tick(core: SchedulerCore, r: aioredis.Redis, step: int | None = None) -> None:
    if step is not None:
        await r.hset(keys.job(JOB), "step", step)
    await core._tick(core._jobs[JOB])


async def inbox_evals(r: aioredis.Redis) -> list:
    entries = await r.xrange(keys.inbox("rollout-0"))
    return [tr for tr in (decode_trajectory(f[b"task"]) for _, f in entries) if tr.is_eval]


async def test_round_one_runs_before_training_beside_the_first_groups(
        core: SchedulerCore, redis_bytes: aioredis.Redis) -> None:
    await tick(core, redis_bytes)
    c = await counters(redis_bytes)
    assert (c["eval_rounds"], c["eval_size:1"]) == (1, 3 * 2)
    # The training budget and counters are untouched by the round.
    assert (c["admitted_groups"], c["admitted"]) == (2, 2 * 2)
    evals = await inbox_evals(redis_bytes)
    assert len(evals) == 6 and {tr.eval_round for tr in evals} == {1}
    assert len({tr.group_id for tr in evals}) == 3
    assert all(":e1:" in tr.group_id for tr in evals)


async def test_a_round_is_admitted_once_and_the_next_at_its_step(
        core: SchedulerCore, redis_bytes: aioredis.Redis) -> None:
    await tick(core, redis_bytes)
    await tick(core, redis_bytes, step=1)
    assert (await counters(redis_bytes))["eval_rounds"] == 1
    await tick(core, redis_bytes, step=2)
    c = await counters(redis_bytes)
    assert (c["eval_rounds"], c["eval_size:2"]) == (2, 6)
    rounds = {}
    for tr in await inbox_evals(redis_bytes):
        rounds.setdefault(tr.eval_round, set()).add(tr.prompt_id)
    assert rounds[1] == rounds[2] and len(rounds[1]) == 3  # the same prompts every round


async def test_overtaken_rounds_are_skipped_and_the_final_one_runs(
        core: SchedulerCore, redis_bytes: aioredis.Redis) -> None:
    await tick(core, redis_bytes)
    await tick(core, redis_bytes, step=5)  # rounds after steps 2 and 4 were overtaken
    c = await counters(redis_bytes)
    assert c["eval_rounds"] == 4 and "eval_size:2" not in c and c["eval_size:4"] == 6


async def test_a_restarted_scheduler_does_not_admit_a_round_again(
        core: SchedulerCore, redis_bytes: aioredis.Redis) -> None:
    await tick(core, redis_bytes)
    again = SchedulerCore(RedisSchedulerStore(redis_bytes), FakeClock())
    await again.start_job(JOB)
    await tick(again, redis_bytes)
    assert len(await inbox_evals(redis_bytes)) == 6


async def test_a_round_beyond_capacity_waits_in_the_queue(redis_bytes: aioredis.Redis) -> None:
    await add_instance(redis_bytes, "rollout-0", "short")
    core = await start(redis_bytes, eval_spec(cap=4))
    await tick(core, redis_bytes)
    assert len(await inbox_evals(redis_bytes)) == 4
    assert len(await redis_bytes.hkeys(keys.pending(JOB))) == 2
    # Training waits behind the queued round: no group was admitted yet.
    assert "admitted_groups" not in await counters(redis_bytes)


async def test_no_round_without_eval_interval(redis_bytes: aioredis.Redis) -> None:
    await add_instance(redis_bytes, "rollout-0", "short")
    core = await start(redis_bytes, eval_spec(eval_interval=0))
    await tick(core, redis_bytes)
    assert "eval_rounds" not in await counters(redis_bytes)
    assert await inbox_evals(redis_bytes) == []
