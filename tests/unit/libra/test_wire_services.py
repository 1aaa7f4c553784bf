"""Round trips of the per-service codecs in ``libra.wire`` (tool gateway, scheduler,
rollout): every field set to a non-default value goes to the message and comes back
equal. Everything is real (no I/O)."""

from __future__ import annotations

import pytest

from libra import types as t
from libra.wire.toolgateway import tool_result_from_proto, tool_result_to_proto


@pytest.mark.parametrize("status", list(t.ToolStatus))
def test_tool_result_round_trips_with_every_wire_field(status: t.ToolStatus) -> None:
    state = t.ToolReturnState("search", t.SizeClass.MEDIUM, status)
    result = t.ToolResult(status, "out", "err", 812, 37, state, truncated=True,
                          call_id="c7", tool="search")
    assert tool_result_from_proto(tool_result_to_proto(result), "c7") == result


def test_tool_result_from_the_wire_has_one_attempt_and_the_callers_id() -> None:
    state = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)
    sent = t.ToolResult(t.ToolStatus.SUCCESS, "4", "", 1, 2, state, call_id="gw-side",
                        tool="calculator", num_attempts=3)
    back = tool_result_from_proto(tool_result_to_proto(sent), "mine")
    assert (back.num_attempts, back.call_id, back.tool, back.size_class) == (
        1, "mine", "calculator", t.SizeClass.SMALL)
