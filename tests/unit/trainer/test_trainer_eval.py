"""Held-out eval in the trainer (services/trainer/evaluation.py): eval trajectories met
in the stream go to their round, never into a training batch nor into the training
accounting; a round is recorded once all its trajectories are in; the job waits,
bounded by ``task.eval_timeout_s``, for the round after its last step.

In-memory store, fake backend and coordinator (tests/unit/trainer/trainer_rig.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from libra import types as t
from libra.evaluation import (
    EVAL_PRODUCED,
    EvalRecord,
    eval_consumed_counter,
    eval_size_counter,
)
from libra.jobspec import AlgorithmSpec, JobSpec, TaskSpec
from libra_cli.report import build_report
from services.trainer.core import TrainerCore
from tests.unit.trainer import trainer_rig
from tests.unit.trainer.trainer_rig import JOB, Rig, make_group
from tests.waiting import wait_until

rig = trainer_rig.rig  # the same fixture: in-memory store, fake backend and coordinator


async def set_eval_spec(rig: Rig, num_steps: int = 1, **task: Any) -> JobSpec:
    """eval_interval 1 over ``num_steps`` steps: rounds after steps 0..num_steps."""
    spec = JobSpec(task=TaskSpec(num_prompts=64, eval_interval=1, eval_fraction=0.25,
                                 eval_samples_per_prompt=2, eval_temperature=0.7, **task),
                   algorithm=AlgorithmSpec(num_steps=num_steps, prompts_per_step=1,
                                           samples_per_prompt=2, sft_steps=0,
                                           max_staleness=1, sync_interval=1))
    return await rig.put_spec(spec)


def eval_traj(eval_round: int, prompt: int, sample: int, reward: float,
              tools: tuple[t.ToolStatus, ...] = ()) -> t.Trajectory:
    states = [t.ToolReturnState("calculator", t.SizeClass.SMALL, s) for s in tools]
    return t.Trajectory(
        t.TrajectoryId(f"e{eval_round}-{prompt}-{sample}"), t.JobId(JOB),
        t.GroupId(f"e{eval_round}-{prompt}"), t.PromptId(f"ep-{prompt}"), "Q", "3",
        status=t.TrajectoryStatus.FINISHED, token_ids=[1, 2, 3], num_prompt_tokens=1,
        loss_mask=[0, 1, 1], logprobs=[0.0, -0.1, -0.2], token_versions=[-1, 0, 0],
        reward=reward, num_turns=1 + len(states), tool_states=states,
        created_at_ms=1_000, finished_at_ms=3_500, eval_round=eval_round)


async def admit_round(rig: Rig, eval_round: int, size: int) -> None:
    """What the scheduler writes with an admitted round."""
    rig.store.set_counters(JOB, **{"eval_rounds": eval_round,
                                   eval_size_counter(eval_round): size})


async def write_eval(rig: Rig, *trajs: t.Trajectory) -> None:
    """As the rollout store publishes an eval trajectory (its own counter)."""
    for traj in trajs:
        await rig.store.append(JOB, traj)
        rig.store.add_counters(JOB, **{EVAL_PRODUCED: 1})


async def consumed(rig: Rig, num: int) -> bool:
    return (await rig.counters()).get("eval_consumed", 0) == num


async def eval_records(rig: Rig) -> list[EvalRecord]:
    return [EvalRecord.from_json(e["record"]) for e in rig.store.events(JOB)
            if e.get("kind") == "eval"]


async def after_one_step(rig: Rig) -> TrainerCore:
    """A core started on the job, once it has reported its first step."""
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: len(rig.coordinator.steps) == 1)
    return core


async def test_eval_trajectories_never_reach_a_batch_and_rounds_are_recorded(rig: Rig) -> None:
    await set_eval_spec(rig)
    await admit_round(rig, 1, 4)
    round_1 = [eval_traj(1, 0, 0, 1.0, (t.ToolStatus.SUCCESS,)),
               eval_traj(1, 0, 1, 0.0, (t.ToolStatus.FAILURE,)),
               eval_traj(1, 1, 0, 0.0), eval_traj(1, 1, 1, 0.0)]
    # Interleaved with a training group, and one eval trajectory delivered twice.
    await write_eval(rig, *round_1[:2])
    await rig.write(*make_group(0))
    await write_eval(rig, round_1[1], *round_1[2:])
    core = await after_one_step(rig)
    await admit_round(rig, 2, 2)
    await write_eval(rig, eval_traj(2, 0, 0, 1.0), eval_traj(2, 0, 1, 1.0))
    await rig.run_job(core)
    assert rig.backend.trained_ids == ["tr-0-0", "tr-0-1"]
    first, final = await eval_records(rig)
    assert (first.eval_round, first.step, first.num_samples, first.num_prompts) == (1, 0, 4, 2)
    assert (first.reward_mean, first.accuracy, first.pass_at_k) == (
        0.25, 0.25, {"1": 0.25, "2": 0.5})
    assert (first.tool_error_rate, first.num_tool_calls, first.turns_mean) == (0.5, 2, 1.5)
    assert first.is_complete and first.duration_s == 2.5
    assert (final.eval_round, final.step, final.accuracy, final.is_complete) == (2, 1, 1.0, True)
    assert rig.coordinator.done[-1][1] is t.JobState.SUCCEEDED


async def test_eval_is_counted_apart_and_the_training_identity_holds(rig: Rig) -> None:
    await set_eval_spec(rig)
    await admit_round(rig, 1, 2)
    await write_eval(rig, eval_traj(1, 0, 0, 1.0), eval_traj(1, 0, 1, 0.0))
    await rig.write(*make_group(0), *make_group(1))  # group 1 is in flight at the end
    core = await after_one_step(rig)
    await admit_round(rig, 2, 2)
    await write_eval(rig, eval_traj(2, 0, 0, 1.0), eval_traj(2, 0, 1, 1.0))
    await rig.run_job(core)
    counters = await rig.counters()
    assert counters["eval_consumed"] == 4 and counters["trained"] == 2
    eval_ids = [f"e{r}-0-{s}" for r in (1, 2) for s in (0, 1)]
    assert await rig.num_consumed(["tr-0-0", "tr-0-1", *eval_ids]) == 2  # eval ids are not
    spec_json = await rig.store.job_spec_json(JOB)  # in the set
    assert spec_json is not None
    job = t.Job(t.JobId(JOB), "j", t.JobState.SUCCEEDED, spec_json, 0, 0)
    events = [{"kind": "eval", "record": r.to_json()} for r in await eval_records(rig)]
    report = build_report(job, [], counters, 0.0, events)
    acc = report["trajectories"]
    assert acc["produced"] == 4 and acc["in_flight_at_end"] == 2
    assert acc["produced"] == (acc["trained"] + acc["dropped_stale"] + acc["dropped_failed"]
                               + acc["in_flight_at_end"])
    assert report["eval_trajectories"] == {"admitted": 4, "produced": 4, "failed": 0,
                                           "consumed": 4}
    assert [e["eval_round"] for e in report["eval"]] == [1, 2]


async def test_job_waits_for_the_final_round_before_it_succeeds(rig: Rig) -> None:
    await set_eval_spec(rig)
    await rig.write(*make_group(0))
    core = await after_one_step(rig)
    await asyncio.sleep(0.1)  # several reads of the stream (block_ms=10) go by
    assert rig.coordinator.done == [] and not core._task.done()
    await admit_round(rig, 2, 2)
    await write_eval(rig, eval_traj(2, 0, 0, 0.0), eval_traj(2, 0, 1, 1.0))
    await rig.run_job(core)
    (final,) = await eval_records(rig)
    assert (final.eval_round, final.accuracy, final.pass_at_k) == (2, 0.5, {"1": 0.5, "2": 1.0})
    assert rig.coordinator.done[-1][1] is t.JobState.SUCCEEDED


async def test_job_waits_for_an_earlier_round_that_finishes_after_the_final_one(
        rig: Rig) -> None:
    """Round 1 (before training) is still running when the final round completes: the
    job waits for it too, rather than recording it short."""
    await set_eval_spec(rig)
    await admit_round(rig, 1, 2)
    await write_eval(rig, eval_traj(1, 0, 0, 1.0))
    await rig.write(*make_group(0))
    core = await after_one_step(rig)
    await admit_round(rig, 2, 2)
    await write_eval(rig, eval_traj(2, 0, 0, 0.0), eval_traj(2, 0, 1, 1.0))
    await wait_until(lambda: consumed(rig, 3))
    await asyncio.sleep(0.1)  # several reads of the stream (block_ms=10) go by
    assert rig.coordinator.done == [] and not core._task.done()
    await write_eval(rig, eval_traj(1, 0, 1, 0.0))
    await rig.run_job(core)
    records = await eval_records(rig)
    assert [(r.eval_round, r.num_samples, r.is_complete) for r in records] == [
        (2, 2, True), (1, 2, True)]
    assert rig.coordinator.done[-1][1] is t.JobState.SUCCEEDED


async def test_a_restarted_trainer_does_not_wait_for_rounds_taken_in_before(rig: Rig) -> None:
    """Round 1 was consumed (and recorded) by the trainer before a restart: the job's
    counters say so, and the new trainer ends once the final round is in."""
    await set_eval_spec(rig)
    rig.store.set_counters(JOB, **{eval_size_counter(1): 2, eval_consumed_counter(1): 2})
    await rig.write(*make_group(0))
    core = await after_one_step(rig)
    await admit_round(rig, 2, 2)
    await write_eval(rig, eval_traj(2, 0, 0, 1.0), eval_traj(2, 0, 1, 1.0))
    await rig.run_job(core)
    assert [r.eval_round for r in await eval_records(rig)] == [2]
    counters = await rig.counters()
    assert counters[eval_consumed_counter(2)] == 2 and counters["eval_consumed"] == 2
    assert rig.coordinator.done[-1][1] is t.JobState.SUCCEEDED


async def test_final_round_timeout_records_it_incomplete_and_the_job_succeeds(rig: Rig) -> None:
    await set_eval_spec(rig, eval_timeout_s=30.0)
    await rig.write(*make_group(0))
    core = await after_one_step(rig)
    await admit_round(rig, 2, 4)
    await write_eval(rig, eval_traj(2, 0, 0, 1.0))  # 1 of 4 ever arrives
    await wait_until(lambda: consumed(rig, 1))
    assert rig.coordinator.done == []
    rig.sleep.clock.advance(31.0)  # the core's clock: past eval_timeout_s
    await rig.run_job(core)
    (final,) = await eval_records(rig)
    assert (final.eval_round, final.num_samples, final.num_expected) == (2, 1, 4)
    assert not final.is_complete
    assert rig.coordinator.done[-1][1] is t.JobState.SUCCEEDED


@pytest.mark.parametrize("eval_round", [0, 7])
async def test_unknown_round_is_acked_and_ignored(rig: Rig, eval_round: int) -> None:
    """A tag outside the job's rounds (7 > the final round 2) is acked, never recorded
    nor trained; round 0 is a training trajectory (here a lone group member)."""
    await set_eval_spec(rig)
    await write_eval(rig, eval_traj(eval_round, 0, 0, 1.0))
    await rig.write(*make_group(0))
    core = await after_one_step(rig)
    rig.sleep.clock.advance(301.0)  # past the default eval_timeout_s: no round comes
    await rig.run_job(core)
    assert rig.backend.trained_ids == ["tr-0-0", "tr-0-1"]
    assert await eval_records(rig) == []
