"""HTTP shell of the OpenAI-compatible agent endpoint (FastAPI router mounted on the
coordinator's REST app; the rules: episode_core.py, the operations: episode_endpoint.py).

``POST /v1/episodes`` is the job API (the api token, like /v1/jobs). The OpenAI routes
(``/v1/chat/completions``, ``/v1/models``, ``/v1/episodes/{id}/reward``) take the
episode's API key as the bearer token and answer errors in the OpenAI shape
(``{"error": {"message", "type", "param", "code"}}``), so the official ``openai``
client raises its usual ``BadRequestError``/``AuthenticationError``/``NotFoundError``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.params import Depends
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from libra.episodes import EpisodeReply
from libra.errors import LibraError
from services.coordinator.episode_core import completion_body, openai_error, stream_chunks
from services.coordinator.episode_endpoint import MAX_OPEN_WAIT_S, ClientGone, EpisodeEndpoint
from services.coordinator.rest_models import HTTP_STATUS, error_responses

# What a client that went away gets (nobody reads it; 499 as nginx logs it).
CLIENT_CLOSED_REQUEST = 499


class OpenEpisodeBody(BaseModel):
    """Which job's next admitted episode to take."""

    job_id: str = Field(description="a running job whose task.agent is 'external'")
    wait_s: float = Field(30.0, description=f"wait this long for an admitted episode, in "
                          f"(0, {MAX_OPEN_WAIT_S:g}] (503 when none comes)")


class EpisodeView(BaseModel):
    """An opened episode: point an OpenAI client at ``base_url`` with ``api_key``."""

    episode_id: str
    job_id: str
    api_key: str = Field(description="the episode's bearer token; expires with it")
    base_url: str = Field(description="OPENAI_BASE_URL for the agent program")
    model: str
    prompt: str = Field(description="the dataset prompt of this episode")
    prompt_messages: list[dict[str, Any]] | None = None
    idle_timeout_s: float


class RewardBody(BaseModel):
    """The episode's end."""

    reward: float | None = Field(None, description="the episode's reward; null: the job's "
                                 "reward scores the last reply")


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _openai_error(exc: LibraError) -> JSONResponse:
    status = HTTP_STATUS.get(exc.grpc_status_name, 500)
    body = openai_error(status, str(exc), getattr(exc, "field", None),
                        getattr(exc, "code", None) or exc.grpc_status_name.lower())
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def agent_router(endpoint: EpisodeEndpoint, job_api: Sequence[Depends]) -> APIRouter:
    """The endpoint's routes (``job_api``: the dependencies of the job API's routes)."""
    router = APIRouter(tags=["agent endpoint"])

    @router.post("/v1/episodes", status_code=201, response_model=EpisodeView,
                 dependencies=list(job_api),
                 responses=error_responses(400, 404, 409, 503),
                 summary="Open the next admitted episode of an external-agent job")
    async def open_episode(body: OpenEpisodeBody, request: Request) -> EpisodeView:
        grant = await endpoint.open_episode(body.job_id, body.wait_s)
        messages = json.loads(grant.prompt_messages_json) if grant.prompt_messages_json else None
        return EpisodeView(episode_id=grant.episode_id, job_id=grant.job_id,
                           api_key=grant.api_key, base_url=f"{request.base_url}v1",
                           model=grant.model, prompt=grant.prompt_text,
                           prompt_messages=messages, idle_timeout_s=grant.idle_timeout_s)

    @router.post("/v1/chat/completions", summary="OpenAI chat completions (episode key)")
    async def chat_completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"null")
        except json.JSONDecodeError as exc:
            return JSONResponse(openai_error(400, f"body is not JSON: {exc}", "body"), 400)
        try:
            chat, state, replies = await endpoint.complete(_bearer(request), body,
                                                           request.is_disconnected)
        except LibraError as exc:
            return _openai_error(exc)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if not chat.stream:
            (reply,) = [reply async for reply in replies]
            return JSONResponse(completion_body(reply, state.model, completion_id))
        return StreamingResponse(_sse(replies, state.model, completion_id),
                                 media_type="text/event-stream")

    @router.get("/v1/models", summary="The model this episode's job serves (episode key)")
    async def list_models(request: Request) -> Response:
        try:
            state = await endpoint.authenticate(_bearer(request))
        except LibraError as exc:
            return _openai_error(exc)
        return JSONResponse({"object": "list", "data": [
            {"id": state.model, "object": "model", "created": state.created_at_ms // 1000,
             "owned_by": "libra"}]})

    @router.post("/v1/episodes/{episode_id}/reward",
                 summary="Close an episode with its reward (episode key)")
    async def close_episode(episode_id: str, body: RewardBody, request: Request) -> Response:
        try:
            await endpoint.close(episode_id, _bearer(request), body.reward)
        except LibraError as exc:
            return _openai_error(exc)
        return JSONResponse({"episode_id": episode_id, "closed": True})

    return router


async def _sse(replies: AsyncIterator[EpisodeReply], model: str,
               completion_id: str) -> AsyncIterator[str]:
    """The replies as SSE events: the role first, each piece of text as it comes, then
    the final reply's rest, tool calls and finish reason."""
    first = True
    async for reply in replies:
        for chunk in stream_chunks(reply, model, completion_id, with_role=first):
            yield f"data: {json.dumps(chunk)}\n\n"
        first = False
    yield "data: [DONE]\n\n"
