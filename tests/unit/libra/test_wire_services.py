"""Round trips of the per-service codecs in ``libra.wire`` (tool gateway, scheduler,
rollout): every field set to a non-default value goes to the message and comes back
equal. Everything is real (no I/O)."""

from __future__ import annotations

import pytest

from libra import errors
from libra import types as t
from libra.proto.scheduler.v1 import scheduler_pb2 as spb
from libra.wire.common import tool_state_to_proto
from libra.wire.rollout import (
    instance_status_from_proto,
    instance_status_to_proto,
    lend_result_from_proto,
    lend_result_to_proto,
    reclaimed_from_proto,
    reclaimed_to_proto,
)
from libra.wire.scheduler import (
    decision_from_proto,
    decision_from_response,
    decision_to_proto,
    decision_to_response,
    error_from_text,
    error_to_text,
    report_from_proto,
    report_to_proto,
    stats_from_proto,
    stats_to_proto,
)
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


# -- scheduler ------------------------------------------------------------------------------

STATE = t.ToolReturnState("search", t.SizeClass.LARGE, t.ToolStatus.TIMEOUT)


def test_tool_return_report_round_trips() -> None:
    report = t.ToolReturnReport("job-1", "job-1:g0:p0:s1", STATE, 1234)
    assert report_from_proto(report_to_proto(report)) == report


def test_unary_report_request_reads_as_the_same_report() -> None:
    msg = spb.ReportToolReturnRequest(job_id="j", trajectory_id="tr",
                                      state=tool_state_to_proto(STATE), tokens_so_far=7,
                                      instance_id="r0", lease_epoch=3)
    assert report_from_proto(msg) == t.ToolReturnReport("j", "tr", STATE, 7)


@pytest.mark.parametrize("decision", [
    t.PlacementDecision(t.DecisionAction.STAY, reason="tree_says_stay"),
    t.PlacementDecision(t.DecisionAction.MOVE, "long", "rollout-3", "tree_says_long"),
])
def test_placement_decision_round_trips_in_a_batch_and_alone(
        decision: t.PlacementDecision) -> None:
    assert decision_from_proto(decision_to_proto(decision)) == decision
    assert decision_from_response(decision_to_response(decision)) == decision


@pytest.mark.parametrize("error", [errors.InvalidArgument("job_id", "unknown job"),
                                   errors.LeaseLost("stale epoch 2"),
                                   errors.Unavailable("store down")])
def test_refused_report_comes_back_as_the_same_error_class(error: errors.LibraError) -> None:
    back = decision_from_proto(decision_to_proto(error))
    assert type(back) is type(error) and str(error) in str(back)


def test_refusal_text_round_trips() -> None:
    back = error_from_text(error_to_text(errors.FailedPrecondition("job not running")))
    assert isinstance(back, errors.FailedPrecondition) and "job not running" in str(back)


def test_unknown_action_reads_as_a_stay() -> None:
    assert decision_from_proto(spb.ToolReturnDecision(action=99)).action is t.DecisionAction.STAY


def test_scheduler_stats_round_trip_and_empty_reads_as_empty() -> None:
    stats = {"policy": "cmlfq", "pending": 3, "decisions": {"stay": 5, "move": 1}}
    assert stats_from_proto(stats_to_proto(stats)) == stats
    assert stats_from_proto(spb.GetSchedulerStatsResponse()) == {}


# -- rollout --------------------------------------------------------------------------------

LEASE = t.Lease(worker_id=t.WorkerId("rollout-2"), role=t.WorkerRole.HYBRID_JOINING,
                bucket="long", address="10.0.0.2:50061", epoch=4, expires_at_ms=99,
                ttl_ms=3000)


def test_instance_status_round_trips_with_every_field() -> None:
    status = t.InstanceStatus("rollout-2", "long", 5, 6, 7_000, "job-1", "rollout",
                              "joining", '[{"n": 1}]', '{"pull": 0.1}')
    assert instance_status_from_proto(instance_status_to_proto(status)) == status


def test_lend_result_and_reclaimed_lease_round_trip() -> None:
    result = t.LendResult(LEASE, 3)
    assert lend_result_from_proto(lend_result_to_proto(result)) == result
    assert reclaimed_from_proto(reclaimed_to_proto(LEASE)) == LEASE
