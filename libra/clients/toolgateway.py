"""Typed client of the tool gateway."""

from __future__ import annotations

import json
from typing import Any

from libra import types as t
from libra.clients.api import ToolGatewayApi as ToolGatewayApi
from libra.clients.base import GrpcClientBase
from libra.grpc_auth import ClientAuth
from libra.proto.toolgateway.v1 import toolgateway_pb2 as pb
from libra.proto.toolgateway.v1 import toolgateway_pb2_grpc as pb_grpc
from libra.tool_deadline import rpc_timeout_s
from libra.wire.toolgateway import (
    score_input_to_proto,
    score_output_from_proto,
    tool_result_from_proto,
)


class GrpcToolGatewayClient(GrpcClientBase):
    """The tool gateway over gRPC: tool calls, scoring and the tool and reward registries."""

    def __init__(self, address: str, timeout_s: float = 10.0, max_attempts: int = 3, *,
                 auth: ClientAuth | None = None) -> None:
        super().__init__(address, timeout_s, max_attempts, auth=auth)
        self._stub = pb_grpc.ToolGatewayServiceStub(self._channel)

    async def execute(self, trajectory_id: str, call_id: str, tool: str, args: dict[str, Any],
                      deadline_ms: int, options: dict[str, Any] | None = None
                      ) -> t.ToolResult:
        """Run one tool call; a tool that fails comes back as a result with a failure state,
        only a refusal (unknown tool, bad arguments, busy) raises."""
        # Idempotent by call_id: the gateway's outcome is a function of the call id. The
        # gateway answers by the budget plus its answer margin (libra/tool_deadline.py):
        # the RPC deadline only catches one that never answers.
        resp = await self._call(self._stub.ExecuteToolCall, pb.ExecuteToolCallRequest(
            trajectory_id=trajectory_id, call_id=call_id, tool=tool,
            args_json=json.dumps(args), deadline_ms=deadline_ms,
            options_json=json.dumps(options or {})),
            idempotent=True, timeout_s=rpc_timeout_s(deadline_ms))
        return tool_result_from_proto(resp, call_id)

    async def score(self, request: t.ScoreInput, timeout_s: float | None = None
                    ) -> t.ScoreOutput:
        """Score a finished trajectory (``timeout_s``: the RPC deadline; give the job's
        ``reward.timeout_s`` plus a margin so the gateway's own timeout answers first)."""
        resp = await self._call(self._stub.Score, score_input_to_proto(request),
                                idempotent=True, timeout_s=timeout_s)
        return score_output_from_proto(resp)

    async def list_rewards(self) -> list[dict[str, str]]:
        """``[{"name", "description"}, ...]`` of the gateway's registered rewards."""
        resp = await self._call(self._stub.ListRewards, pb.ListRewardsRequest(),
                                idempotent=True)
        return [{"name": r.name, "description": r.description} for r in resp.rewards]

    async def list_tools(self) -> list[dict[str, Any]]:
        """The gateway's tool registry: name, description, JSON schema of the arguments,
        idempotent."""
        resp = await self._call(self._stub.ListTools, pb.ListToolsRequest(), idempotent=True)
        return [{"name": s.name, "description": s.description,
                 "args_schema": json.loads(s.args_schema_json or "{}"),
                 "idempotent": s.idempotent} for s in resp.tools]
