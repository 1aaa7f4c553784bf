"""Eval rounds in SchedulerCore (services/scheduler/evaluation.py) on the in-memory store:
admitted when the job's step reaches them, tagged, outside the staleness budget and the
training counters, never twice (a restarted scheduler included), the prompts the same
every round; an overtaken round is skipped."""

from __future__ import annotations

import pytest

from libra.clock import FakeClock
from libra.jobspec import JobSpec, job_spec_from_dict
from services.scheduler.core import SchedulerCore
from services.scheduler.memory_store import MemorySchedulerStore
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
def store() -> MemorySchedulerStore:
    return MemorySchedulerStore()


@pytest.fixture
async def core(store: MemorySchedulerStore) -> SchedulerCore:
    await add_instance(store, "rollout-0", "short")
    return await start(store, eval_spec())


async def start(store: MemorySchedulerStore, spec: JobSpec) -> SchedulerCore:
    await add_job(store, spec)
    core = SchedulerCore(store, FakeClock())
    await core.start_job(JOB)
    return core


async def tick(core: SchedulerCore, store: MemorySchedulerStore, step: int | None = None) -> None:
    if step is not None:
        store.set_job_step(JOB, step)
    await core._tick(core._jobs[JOB])


async def inbox_evals(store: MemorySchedulerStore) -> list:
    return [tr for tr in store.inbox("rollout-0") if tr.is_eval]


async def test_round_one_runs_before_training_beside_the_first_groups(
        core: SchedulerCore, store: MemorySchedulerStore) -> None:
    await tick(core, store)
    c = await counters(store)
    assert (c["eval_rounds"], c["eval_size:1"]) == (1, 3 * 2)
    # The training budget and counters are untouched by the round.
    assert (c["admitted_groups"], c["admitted"]) == (2, 2 * 2)
    evals = await inbox_evals(store)
    assert len(evals) == 6 and {tr.eval_round for tr in evals} == {1}
    assert len({tr.group_id for tr in evals}) == 3
    assert all(":e1:" in tr.group_id for tr in evals)


async def test_a_round_is_admitted_once_and_the_next_at_its_step(
        core: SchedulerCore, store: MemorySchedulerStore) -> None:
    await tick(core, store)
    await tick(core, store, step=1)
    assert (await counters(store))["eval_rounds"] == 1
    await tick(core, store, step=2)
    c = await counters(store)
    assert (c["eval_rounds"], c["eval_size:2"]) == (2, 6)
    rounds = {}
    for tr in await inbox_evals(store):
        rounds.setdefault(tr.eval_round, set()).add(tr.prompt_id)
    assert rounds[1] == rounds[2] and len(rounds[1]) == 3  # the same prompts every round


async def test_overtaken_rounds_are_skipped_and_the_final_one_runs(
        core: SchedulerCore, store: MemorySchedulerStore) -> None:
    await tick(core, store)
    await tick(core, store, step=5)  # rounds after steps 2 and 4 were overtaken
    c = await counters(store)
    assert c["eval_rounds"] == 4 and "eval_size:2" not in c and c["eval_size:4"] == 6


async def test_a_restarted_scheduler_does_not_admit_a_round_again(
        core: SchedulerCore, store: MemorySchedulerStore) -> None:
    await tick(core, store)
    again = SchedulerCore(store, FakeClock())
    await again.start_job(JOB)
    await tick(again, store)
    assert len(await inbox_evals(store)) == 6


async def test_a_round_beyond_capacity_waits_in_the_queue(store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    core = await start(store, eval_spec(cap=4))
    await tick(core, store)
    assert len(await inbox_evals(store)) == 4
    assert len(await store.pending(JOB)) == 2
    # Training waits behind the queued round: no group was admitted yet.
    assert "admitted_groups" not in await counters(store)


async def test_no_round_without_eval_interval(store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    core = await start(store, eval_spec(eval_interval=0))
    await tick(core, store)
    assert "eval_rounds" not in await counters(store)
    assert await inbox_evals(store) == []
