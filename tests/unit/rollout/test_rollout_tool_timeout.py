"""A tool gateway that answers past the call's deadline: the model reads a timeout."""

from __future__ import annotations

import pytest

from libra import types as t
from libra.errors import DeadlineExceeded
from services.rollout.tool_calls import timed_out_result
from tests.unit.rollout.rig import Rig, make_task


async def test_a_late_gateway_answer_is_a_timeout_return_and_the_trajectory_goes_on(
        rig: Rig) -> None:
    # The gRPC client's deadline is the call's budget plus a margin; a loaded gateway
    # whose own timeout answer comes later makes the client raise DeadlineExceeded.
    async def late() -> None:
        raise DeadlineExceeded("deadline exceeded")

    rig.tools.on_execute = late
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.status is t.TrajectoryStatus.FINISHED
    assert [s.status for s in traj.tool_states] == [t.ToolStatus.TIMEOUT]
    assert len(rig.tools.calls) == 1  # the budget is spent: no retry


@pytest.mark.parametrize("budget_s", [0.5, 30.0])
def test_the_timeout_return_names_the_call_and_its_budget(budget_s: float) -> None:
    result = timed_out_result("tr-0:t0", "calculator", budget_s)
    assert (result.status, result.error, result.call_id, result.tool) == (
        t.ToolStatus.TIMEOUT, "timeout", "tr-0:t0", "calculator")
    assert result.state == t.ToolReturnState("calculator", t.SizeClass.SMALL,
                                             t.ToolStatus.TIMEOUT)
    assert result.latency_ms == int(budget_s * 1000)
