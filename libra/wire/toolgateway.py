"""Tool gateway messages <-> ``libra.types``: a tool call's result, the Score request (the
whole trajectory) and its response. Used by the gateway's servicer and by its client."""

from __future__ import annotations

from libra import types as t
from libra.proto.toolgateway.v1 import toolgateway_pb2 as pb
from libra.wire.common import (
    tool_state_from_proto,
    tool_state_to_proto,
    tool_status_from_proto,
    tool_status_to_proto,
)


def tool_result_to_proto(result: t.ToolResult) -> pb.ExecuteToolCallResponse:
    """A tool call's result as the ExecuteToolCallResponse (the ids and the attempt count
    stay with the gateway: the caller holds the ids)."""
    return pb.ExecuteToolCallResponse(
        status=tool_status_to_proto(result.status), output=result.output, error=result.error,
        payload_tokens=result.payload_tokens, latency_ms=result.latency_ms,
        state=tool_state_to_proto(result.state), truncated=result.truncated)


def tool_result_from_proto(msg: pb.ExecuteToolCallResponse, call_id: str = "") -> t.ToolResult:
    """A tool call's result from the ExecuteToolCallResponse; ``call_id`` is the caller's
    (the tool's name comes back in the state)."""
    state = tool_state_from_proto(msg.state)
    return t.ToolResult(tool_status_from_proto(msg.status), msg.output, msg.error,
                        msg.payload_tokens, msg.latency_ms, state, msg.truncated,
                        call_id=call_id, tool=state.tool_type)


def score_input_to_proto(req: t.ScoreInput) -> pb.ScoreRequest:
    """A trajectory to score as the gateway's ScoreRequest."""
    return pb.ScoreRequest(
        trajectory_id=req.trajectory_id, reward=req.reward, final_text=req.final_text,
        reference=req.reference, metadata_json=req.metadata_json, num_turns=req.num_turns,
        options_json=req.options_json,
        messages=[pb.TranscriptMessage(
            role=m.role, content=m.content, name=m.name, tool_status=m.tool_status,
            tool_calls=[pb.TranscriptToolCall(name=c.name, arguments_json=c.arguments_json)
                        for c in m.tool_calls])
            for m in req.messages])


def score_input_from_proto(msg: pb.ScoreRequest) -> t.ScoreInput:
    """A trajectory to score from the gateway's ScoreRequest."""
    messages = tuple(
        t.TranscriptMessage(m.role, m.content,
                            tuple(t.TranscriptToolCall(c.name, c.arguments_json or "{}")
                                  for c in m.tool_calls),
                            m.name, m.tool_status)
        for m in msg.messages)
    return t.ScoreInput(msg.trajectory_id, msg.reward, msg.final_text, msg.reference, messages,
                        msg.metadata_json, msg.num_turns, msg.options_json)


def score_output_to_proto(out: t.ScoreOutput, details_json: str = "{}") -> pb.ScoreResponse:
    """A score as the ScoreResponse (``details_json``: the reward's own details)."""
    return pb.ScoreResponse(reward=out.reward, details_json=details_json,
                            components=out.components)


def score_output_from_proto(msg: pb.ScoreResponse) -> t.ScoreOutput:
    """A score from the ScoreResponse."""
    return t.ScoreOutput(msg.reward, dict(msg.components))
