"""Scheduler messages <-> ``libra.types``: tool-return reports, placement decisions (or a
report's refusal) and the stats. Used by the scheduler's servicer and by its client.

A refusal travels on the ToolReturns stream as text, ``"<grpc status name>: <message>"``,
in a decision's or a batch's ``error``; ``error_from_text`` rebuilds the error class
(``libra.errors.error_from_status``), so a caller sees what a unary RPC would raise.
"""

from __future__ import annotations

import json
from typing import Any

from libra import types as t
from libra.errors import LibraError, error_from_status
from libra.proto.scheduler.v1 import scheduler_pb2 as pb
from libra.wire.common import tool_state_from_proto, tool_state_to_proto

_ACTION = {t.DecisionAction.STAY: pb.DECISION_ACTION_STAY,
           t.DecisionAction.MOVE: pb.DECISION_ACTION_MOVE}
_ACTION_IN = {v: k for k, v in _ACTION.items()}


def error_to_text(exc: LibraError) -> str:
    """An error as the stream carries it."""
    return f"{exc.grpc_status_name}: {exc}"


def error_from_text(text: str) -> LibraError:
    """An error from the stream's text, as the class its status names."""
    code, _, details = text.partition(": ")
    return error_from_status(code, details)


def report_to_proto(report: t.ToolReturnReport) -> pb.ToolReturnReport:
    """A tool return as one report of a ToolReturns batch."""
    return pb.ToolReturnReport(job_id=report.job_id, trajectory_id=report.trajectory_id,
                               state=tool_state_to_proto(report.state),
                               tokens_so_far=report.tokens_so_far)


def report_from_proto(msg: pb.ToolReturnReport | pb.ReportToolReturnRequest,
                      ) -> t.ToolReturnReport:
    """A tool return from a batch's report (or from the unary ReportToolReturn request,
    whose first four fields are the same)."""
    return t.ToolReturnReport(msg.job_id, msg.trajectory_id, tool_state_from_proto(msg.state),
                              msg.tokens_so_far)


def decision_to_proto(result: t.PlacementDecision | LibraError) -> pb.ToolReturnDecision:
    """A report's outcome in a batch's answer: its decision, or its refusal (a stay)."""
    if isinstance(result, LibraError):
        return pb.ToolReturnDecision(action=pb.DECISION_ACTION_STAY,
                                     error=error_to_text(result))
    return pb.ToolReturnDecision(action=_ACTION[result.action],
                                 target_bucket=result.target_bucket,
                                 target_instance=result.target_instance, reason=result.reason)


def decision_from_proto(msg: pb.ToolReturnDecision) -> t.PlacementDecision | LibraError:
    """A report's outcome from a batch's answer (an unknown action reads as a stay)."""
    if msg.error:
        return error_from_text(msg.error)
    return t.PlacementDecision(_ACTION_IN.get(msg.action, t.DecisionAction.STAY),
                               msg.target_bucket, msg.target_instance, msg.reason)


def decision_to_response(decision: t.PlacementDecision) -> pb.ReportToolReturnResponse:
    """A decision as the unary ReportToolReturn's response."""
    return pb.ReportToolReturnResponse(action=_ACTION[decision.action],
                                       target_bucket=decision.target_bucket,
                                       target_instance=decision.target_instance,
                                       reason=decision.reason)


def decision_from_response(msg: pb.ReportToolReturnResponse) -> t.PlacementDecision:
    """A decision from the unary ReportToolReturn's response."""
    return t.PlacementDecision(_ACTION_IN.get(msg.action, t.DecisionAction.STAY),
                               msg.target_bucket, msg.target_instance, msg.reason)


def stats_to_proto(stats: dict[str, Any]) -> pb.GetSchedulerStatsResponse:
    """A job's placement figures as the GetSchedulerStats response."""
    return pb.GetSchedulerStatsResponse(stats_json=json.dumps(stats))


def stats_from_proto(msg: pb.GetSchedulerStatsResponse) -> dict[str, Any]:
    """A job's placement figures from the GetSchedulerStats response."""
    return json.loads(msg.stats_json or "{}")
