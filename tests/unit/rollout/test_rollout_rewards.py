"""RolloutCore and rewards: the Score request carries the whole trajectory (transcript,
row metadata, the job's reward options), the components come back onto the trajectory,
a failing reward fails the trajectory with the reason the trainer counts, and a custom
agent loop installed as a ``libra.agents`` entry point runs in the batched loop.

The rig (rig.py): real Redis store and tiny-model tokenizer; fakes for the engine, the
tool gateway, the scheduler and the coordinator."""

from __future__ import annotations

import json
import sys

import pytest

from libra import types as t
from libra.errors import Internal
from libra.jobspec import JobSpec, TaskSpec, ToolsSpec
from libra.plugins import AGENTS_GROUP
from libra.rewardspec import REWARD_FAILURE_PREFIX, RewardComponent, RewardSpec
from libra.tool_deadline import score_rpc_timeout_s
from tests.fakes.toolgateway import tool_result
from tests.fixtures.plugin_dist import install_plugin_dist
from tests.unit.rollout.rig import Rig, make_task, started_rig

COMPOSITE = RewardSpec(name="composite", timeout_s=7.0, components=[
    RewardComponent(name="exact_match"), RewardComponent(name="format", weight=0.5)])


@pytest.fixture
async def composite_rig(tmp_path):
    spec = JobSpec(task=TaskSpec(max_turns=4), tools=ToolsSpec(call_timeout_s=5.0),
                   reward=COMPOSITE)
    async with started_rig(tmp_path, spec=spec) as rig:
        yield rig


async def test_the_score_request_carries_the_whole_trajectory(composite_rig: Rig) -> None:
    rig = composite_rig
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    rig.tools.results.append(tool_result("3"))
    task = make_task()
    task.metadata_json = '{"source": "unit"}'
    await rig.place(task)
    await rig.run_until_published()
    (score,) = rig.tools.scores
    request: t.ScoreInput = score["request"]
    assert [(m.role, m.content) for m in request.messages] == [
        ("user", "Q:1+2="), ("assistant", "<calc>1+2</calc>"), ("tool", "<res>3</res>"),
        ("assistant", "<ans>3</ans>")]
    call = request.messages[1].tool_calls[0]
    assert (call.name, json.loads(call.arguments_json)) == ("calculator", {"expression": "1+2"})
    assert (request.messages[2].name, request.messages[2].tool_status) == (
        "calculator", "success")
    assert (request.reward, request.final_text, request.reference, request.num_turns) == (
        "composite", "3", "3", 2)
    assert request.metadata_json == '{"source": "unit"}'
    assert json.loads(request.options_json)["components"] == [
        {"name": "exact_match", "weight": 1.0}, {"name": "format", "weight": 0.5}]
    assert score["timeout_s"] == score_rpc_timeout_s(7.0)  # the reward's time + the answer's


async def test_the_reward_components_are_recorded_on_the_trajectory(
        composite_rig: Rig) -> None:
    rig = composite_rig
    rig.engine.queue("<ans>3</ans>")
    rig.tools.reward, rig.tools.components = 1.5, {"exact_match": 1.0, "format": 1.0}
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert (traj.reward, traj.reward_components) == (1.5, {"exact_match": 1.0, "format": 1.0})


async def test_a_failing_reward_fails_the_trajectory_with_the_counted_reason(
        rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    rig.tools.score_error = Internal("reward 'exact_match' returned nan, not a finite number")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.status is t.TrajectoryStatus.FAILED
    assert traj.failure_reason.startswith(f"{REWARD_FAILURE_PREFIX} exact_match: ")
    assert "returned nan" in traj.failure_reason


# -- a custom agent loop ------------------------------------------------------------------

STOP_AFTER_TOOL = """
from services.rollout.agent import ArithAgent


class StopAfterTool(ArithAgent):
    '''The arith loop, ended at the first tool return (no answer: not scored).'''

    def next_request(self, traj, seed, num_turn_tokens=0):
        if traj.tool_states:
            return None
        return super().next_request(traj, seed, num_turn_tokens)
"""


@pytest.fixture
def stop_after_tool(tmp_path, monkeypatch):
    install_plugin_dist(tmp_path / "dist", monkeypatch, "libra_agent_plugin", STOP_AFTER_TOOL,
                        {AGENTS_GROUP: {"stop_after_tool": "libra_agent_plugin:StopAfterTool"}})
    yield
    sys.modules.pop("libra_agent_plugin", None)


async def test_a_plugin_agent_runs_inside_the_batched_loop(tmp_path,
                                                          stop_after_tool) -> None:
    spec = JobSpec(task=TaskSpec(max_turns=4, agent="stop_after_tool"),
                   tools=ToolsSpec(call_timeout_s=5.0))
    async with started_rig(tmp_path, spec=spec) as rig:
        # One scripted turn per row of the first engine call; the loop would ask for more.
        rig.engine.queue("<calc>1+2</calc>", "<calc>2+2</calc>", "<ans>3</ans>", "<ans>4</ans>")
        await rig.place(make_task(0))
        await rig.place(make_task(1))
        trajs = await rig.run_until_published(2)
    assert rig.engine.batch_sizes == [2]  # one engine call for both; none after the tools
    assert len(rig.tools.calls) == 2 and len(rig.scheduler.tool_returns) == 2
    for traj in trajs:
        assert (traj.status, traj.num_turns, len(traj.tool_states)) == (
            t.TrajectoryStatus.FINISHED, 1, 1)
    assert rig.tools.scores == []  # ended without an answer: nothing to score


@pytest.mark.parametrize("agent_name, reason", [
    ("not_installed", "agent unavailable: unknown agent 'not_installed' (available: arith, "
                      "chat, external, broken)"),
    ("broken", "agent unavailable: entry point 'broken' = 'libra_broken_agent:Agent' (group "
               "libra.agents) failed to load: ImportError: needs gym"),
])
async def test_an_agent_this_rollout_cannot_build_fails_the_jobs_trajectories(
        tmp_path, monkeypatch, agent_name, reason) -> None:
    install_plugin_dist(tmp_path / "dist", monkeypatch, "libra_broken_agent",
                        "raise ImportError('needs gym')\n",
                        {AGENTS_GROUP: {"broken": "libra_broken_agent:Agent"}})
    spec = JobSpec(task=TaskSpec(agent=agent_name), tools=ToolsSpec(call_timeout_s=5.0))
    async with started_rig(tmp_path, spec=spec) as rig:
        await rig.place(make_task(0))
        (traj,) = await rig.run_until_published()
        assert rig.core.num_active == 0  # the loop goes on: no crash
    assert (traj.status, traj.failure_reason) == (t.TrajectoryStatus.FAILED, reason)
    assert rig.engine.requests == []
