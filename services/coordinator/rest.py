"""REST shell of the coordinator (FastAPI; OpenAPI at /docs). Delegates to the same core
as the gRPC servicer, so both APIs validate and fail identically."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from libra import types as t
from libra.access import Access, Tokens
from libra.errors import LibraError
from services.coordinator.core import CoordinatorCore

_HTTP_STATUS = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "ALREADY_EXISTS": 409,
                "FAILED_PRECONDITION": 409, "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503,
                "DEADLINE_EXCEEDED": 504}


class CreateJobBody(BaseModel):
    """A job spec document and its format."""

    spec: str = Field(description="the job spec document (see docs/jobspec.md)")
    format: str = Field("toml", description="toml, json or yaml")
    priority: int = Field(0, description="queue priority in [-1000, 1000]: higher starts "
                          "first, FIFO among equals (used while another job runs)")


class ResumeJobBody(BaseModel):
    """Options of a resume."""

    priority: int = Field(0, description="queue priority, as for a new job")


_PRIORITY_QUERY = Query(None, description="queue priority (overrides the body's)")


def _job_json(job: t.Job) -> dict[str, Any]:
    out = dataclasses.asdict(job)
    out["state"] = job.state.value
    out["spec"] = json.loads(out.pop("spec_json"))
    return out


def _lease_json(lease: t.Lease) -> dict[str, Any]:
    out = dataclasses.asdict(lease)
    out["role"] = lease.role.value
    return out


_AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or invalid bearer token (`Authorization: Bearer <token>`)"},
}


# Module level: the dependency's annotation below is resolved in this module's globals.
_BEARER = HTTPBearer(auto_error=False, description="the api token (auth.api_token)")


def _require_token(tokens: Tokens) -> Any:
    """A dependency: every /v1 route is the public job API (api or service token)."""

    async def check(
            creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        presented = creds.credentials if creds is not None else ""
        if tokens.allows(presented, Access.PUBLIC) is not None:
            raise HTTPException(401, "missing or invalid bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    return check


def build_app(core: CoordinatorCore, tokens: Tokens | None = None) -> FastAPI:
    """The REST API: /v1/jobs (create, list, get, cancel) and /v1/workers.

    With ``tokens`` enabled every /v1 route needs ``Authorization: Bearer <token>``
    (401 otherwise, documented in the OpenAPI document); /healthz, /docs and
    /openapi.json stay open.
    """
    app = FastAPI(title="Libra coordinator", version="v1",
                  description="Create, inspect and cancel agentic RL jobs.")
    tokens = tokens or Tokens()
    v1 = APIRouter(dependencies=[Depends(_require_token(tokens))] if tokens.enabled else [],
                   responses=_AUTH_RESPONSES if tokens.enabled else None)

    @app.exception_handler(LibraError)
    async def _libra_error(_request: Request, exc: LibraError) -> JSONResponse:
        code = exc.grpc_status_name
        body: dict[str, Any] = {"error": code.lower(), "message": str(exc)}
        if field := getattr(exc, "field", None):
            body["field"] = field
        return JSONResponse(status_code=_HTTP_STATUS.get(code, 500), content=body)

    @v1.post("/v1/jobs", status_code=201,
              summary="Create and start a job (queued PENDING while another job runs)")
    async def create_job(body: CreateJobBody,
                         priority: int | None = _PRIORITY_QUERY) -> dict[str, Any]:
        return _job_json(await core.create_job(
            body.spec, body.format, body.priority if priority is None else priority))

    @v1.get("/v1/jobs", summary="List jobs")
    async def list_jobs() -> list[dict[str, Any]]:
        return [_job_json(j) for j in await core.list_jobs()]

    @v1.get("/v1/jobs/{job_id}",
             summary="A job with its step history, counters and events")
    async def get_job(job_id: str) -> dict[str, Any]:
        job, steps, counters = await core.get_job(job_id)
        return {**_job_json(job), "steps": steps, "counters": counters,
                "events": await core.job_events(job_id)}

    @v1.get("/v1/jobs/{job_id}/events",
             summary="A job's events (elastic plans, joins, releases, failures), oldest first")
    async def job_events(job_id: str) -> list[dict[str, Any]]:
        return await core.job_events(job_id)

    @v1.post("/v1/jobs/{job_id}/cancel", summary="Cancel a job")
    async def cancel_job(job_id: str) -> dict[str, Any]:
        return _job_json(await core.cancel_job(job_id))

    @v1.post("/v1/jobs/{job_id}/resume",
              summary="Restart a cancelled or failed job from its newest checkpoint")
    async def resume_job(job_id: str, body: ResumeJobBody | None = None,
                         priority: int | None = _PRIORITY_QUERY) -> dict[str, Any]:
        chosen = priority if priority is not None else (body.priority if body else 0)
        return _job_json(await core.resume_job(job_id, chosen))

    @v1.get("/v1/workers", summary="Live worker leases (worker_id, role, bucket, epoch, "
             "address, expires_at_ms, ttl_ms)")
    async def list_workers() -> list[dict[str, Any]]:
        return [_lease_json(lease) for lease in await core.list_workers()]

    app.include_router(v1)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
