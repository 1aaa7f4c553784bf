"""gRPC shell of the tool gateway: convert, delegate, convert."""

from __future__ import annotations

import json

from libra.errors import InvalidArgument
from libra.proto.toolgateway.v1 import toolgateway_pb2 as pb
from libra.proto.toolgateway.v1 import toolgateway_pb2_grpc as pb_grpc
from libra.wire.common import tool_state_to_proto, tool_status_to_proto
from services.toolgateway.core import ScoreRequest, ToolCall, ToolGatewayCore


def _json_object(field: str, text: str) -> dict:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise InvalidArgument(field, f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be a JSON object")
    return value


class ToolGatewayServicer(pb_grpc.ToolGatewayServiceServicer):
    def __init__(self, core: ToolGatewayCore) -> None:
        self._core = core

    async def ExecuteToolCall(self, request, context):  # noqa: N802, ANN001
        remaining = context.time_remaining()
        deadline_ms = request.deadline_ms or None
        if remaining is not None:  # the caller's gRPC deadline bounds the tool too
            deadline_ms = min(deadline_ms or int(remaining * 1000), int(remaining * 1000))
        result = await self._core.execute(ToolCall(
            request.trajectory_id, request.call_id, request.tool,
            _json_object("args_json", request.args_json), deadline_ms,
            _json_object("options_json", request.options_json)))
        return pb.ExecuteToolCallResponse(
            status=tool_status_to_proto(result.status), output=result.output,
            error=result.error, payload_tokens=result.payload_tokens,
            latency_ms=result.latency_ms, state=tool_state_to_proto(result.state),
            truncated=result.is_truncated)

    async def Score(self, request, context):  # noqa: N802, ANN001
        result = await self._core.score(ScoreRequest(
            request.trajectory_id, request.reward, request.final_text, request.reference,
            _json_object("extra_json", request.extra_json)))
        return pb.ScoreResponse(reward=result.reward, details_json=json.dumps(result.details))

    async def ListTools(self, request, context):  # noqa: N802, ANN001
        return pb.ListToolsResponse(tools=[
            pb.ToolSpec(name=s.name, description=s.description,
                        args_schema_json=json.dumps(s.args_schema), idempotent=s.idempotent)
            for s in self._core.list_tools()])
