"""gRPC shell of the tool gateway: convert, delegate, convert."""

from __future__ import annotations

import json

from libra import types as t
from libra.errors import InvalidArgument
from libra.proto.toolgateway.v1 import toolgateway_pb2 as pb
from libra.proto.toolgateway.v1 import toolgateway_pb2_grpc as pb_grpc
from libra.tool_deadline import gateway_budget_ms
from libra.wire.toolgateway import (
    score_input_from_proto,
    score_output_to_proto,
    tool_result_to_proto,
)
from services.toolgateway import metrics as tool_metrics
from services.toolgateway.core import ScoreRequest, ToolCall, ToolGatewayCore


def _json_object(field: str, text: str) -> dict:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise InvalidArgument(field, f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be a JSON object")
    return value


def score_request(req: t.ScoreInput, extra_json: str = "") -> ScoreRequest:
    """The core's request for a wire Score request (JSON fields checked, named)."""
    return ScoreRequest(req.trajectory_id, req.reward, req.final_text, req.reference,
                        _json_object("extra_json", extra_json), req.messages,
                        _json_object("metadata_json", req.metadata_json), req.num_turns,
                        _json_object("options_json", req.options_json))


class ToolGatewayServicer(pb_grpc.ToolGatewayServiceServicer):
    def __init__(self, core: ToolGatewayCore) -> None:
        self._core = core

    async def ExecuteToolCall(self, request, context):  # noqa: N802, ANN001
        # The caller's RPC deadline bounds the tool too, less the time to answer.
        deadline_ms = gateway_budget_ms(request.deadline_ms or None, context.time_remaining(),
                                        self._core.backstop_grace_s)
        result = await self._core.execute(ToolCall(
            request.trajectory_id, request.call_id, request.tool,
            _json_object("args_json", request.args_json), deadline_ms,
            _json_object("options_json", request.options_json)))
        tool_metrics.record_call(request.tool, result)
        return tool_result_to_proto(result)

    async def Score(self, request, context):  # noqa: N802, ANN001
        # The caller's RPC deadline bounds the reward too, less the time to answer (no
        # backstop grace: the reward's timeout cancels it).
        deadline_ms = gateway_budget_ms(None, context.time_remaining(), 0.0)
        result = await self._core.score(score_request(score_input_from_proto(request),
                                                      request.extra_json),
                                        deadline_ms=deadline_ms)
        return score_output_to_proto(t.ScoreOutput(result.reward, result.components),
                                     json.dumps(result.details))

    async def ListRewards(self, request, context):  # noqa: N802, ANN001
        return pb.ListRewardsResponse(rewards=[
            pb.RewardInfo(name=r.name, description=r.description)
            for r in self._core.list_rewards()])

    async def ListTools(self, request, context):  # noqa: N802, ANN001
        return pb.ListToolsResponse(tools=[
            pb.ToolSpec(name=s.name, description=s.description,
                        args_schema_json=json.dumps(s.args_schema), idempotent=s.idempotent)
            for s in self._core.list_tools()])
