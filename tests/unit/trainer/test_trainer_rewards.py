"""The trainer and trajectory failures: per-step means of the reward components, the
failure budget (``reward.max_failures``) that fails a job whose reward keeps failing, and
an agent unavailable on a rollout, which fails the job at once.

Same rig as test_trainer_core.py (trainer_rig.py): in-memory store, fake backend and
coordinator."""
# ruff: noqa: F811 - the imported ``rig`` fixture is a parameter of every test

from __future__ import annotations

from libra import types as t
from libra.agents import AGENT_FAILURE_PREFIX
from libra.jobspec import AlgorithmSpec, JobSpec, TaskSpec
from libra.rewardspec import REWARD_FAILURE_PREFIX, RewardSpec
from tests.unit.trainer.trainer_rig import (  # noqa: F401 - the rig fixture
    JOB,
    Rig,
    make_group,
    make_trajectory,
    rig,
)


async def set_spec(rig: Rig, reward: RewardSpec, num_steps: int = 1) -> None:
    spec = JobSpec(task=TaskSpec(num_prompts=64), reward=reward, algorithm=AlgorithmSpec(
        num_steps=num_steps, prompts_per_step=1, samples_per_prompt=2, sft_steps=0))
    await rig.put_spec(spec)


def reward_failed(group: int, index: int, error: str) -> t.Trajectory:
    traj = make_trajectory(group, index, status=t.TrajectoryStatus.FAILED)
    traj.failure_reason = f"{REWARD_FAILURE_PREFIX} my_verifier: {error}"
    return traj


async def test_step_record_averages_the_reward_components(rig: Rig) -> None:
    await set_spec(rig, RewardSpec())
    a, b = make_group(0, rewards=(1.0, 0.5))
    a.reward_components = {"exact_match": 1.0, "format": 1.0}
    b.reward_components = {"exact_match": 0.0, "format": 0.5}
    await rig.write(a, b)
    await rig.run_job()
    ((_, record),) = rig.coordinator.steps
    assert record["reward_components"] == {"exact_match": 0.5, "format": 0.75}


async def test_repeated_reward_failures_fail_the_job_naming_the_reward_and_last_error(
        rig: Rig) -> None:
    await set_spec(rig, RewardSpec(name="my_verifier", max_failures=3), num_steps=5)
    await rig.write(reward_failed(0, 0, "first"), reward_failed(1, 0, "second"),
                    reward_failed(2, 0, "ValueError: bad row 7"))
    core = await rig.run_job()
    ((job, state, message),) = rig.coordinator.done
    assert (job, state, core.phase) == (JOB, t.JobState.FAILED, "failed")
    assert message == ("reward 'my_verifier' failed 3 trajectories (reward.max_failures = 3);"
                       " last error: my_verifier: ValueError: bad row 7")


async def test_failures_below_the_budget_and_other_failures_do_not_fail_the_job(
        rig: Rig) -> None:
    await set_spec(rig, RewardSpec(max_failures=2))
    tool_failed = [make_trajectory(1, i, status=t.TrajectoryStatus.FAILED) for i in (0, 1)]
    for traj in tool_failed:
        traj.failure_reason = "tool gateway: down"  # not the reward's fault
    await rig.write(reward_failed(0, 0, "once"), *tool_failed, *make_group(2))
    await rig.run_job()
    assert rig.coordinator.done == [(JOB, t.JobState.SUCCEEDED, "trained 1 steps")]


async def test_an_agent_unavailable_on_a_rollout_fails_the_job_with_its_reason(
        rig: Rig) -> None:
    await set_spec(rig, RewardSpec(), num_steps=5)
    traj = make_trajectory(0, 0, status=t.TrajectoryStatus.FAILED)
    traj.failure_reason = f"{AGENT_FAILURE_PREFIX} unknown agent 'react' (available: arith)"
    await rig.write(traj)
    await rig.run_job()
    assert rig.coordinator.done == [(JOB, t.JobState.FAILED, traj.failure_reason)]
