"""REST shell of the coordinator (FastAPI; OpenAPI at /docs). Delegates to the same core
as the gRPC servicer, so both APIs validate and fail identically."""

from __future__ import annotations

import math
from collections.abc import Sequence
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from libra.access import Access, Tokens, TokenStore
from libra.errors import (
    InvalidArgument,
    LibraError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    as_unavailable,
    unavailable_types,
)
from libra.run_view import RunView
from services.coordinator.agent_rest import agent_router
from services.coordinator.core import CoordinatorCore
from services.coordinator.episode_endpoint import EpisodeEndpoint
from services.coordinator.job_pages import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from services.coordinator.rest_models import (
    HTTP_STATUS,
    NEXT_PAGE_HEADER,
    CreateJobBody,
    ErrorBody,
    JobDetail,
    JobSummaryView,
    JobView,
    LeaseView,
    ResumeJobBody,
    error_responses,
    list_page_response,
)
from services.coordinator.ui import RunViews, ui_router

_PAGE_SIZE_QUERY = Query(0, description=f"jobs per page: 0 = {DEFAULT_PAGE_SIZE}, at most "
                         f"{MAX_PAGE_SIZE}")
_PAGE_TOKEN_QUERY = Query("", description=f"the `{NEXT_PAGE_HEADER}` header of the previous "
                          "page; empty = the first page")
_PRIORITY_QUERY = Query(None, description="queue priority in [-1000, 1000] (overrides "
                        "the body's)")


# Retry-After (seconds) of a 503: Redis comes back within ~1 s of a restart (AOF replay of
# a small stack), a restarted peer within a few; clients back off from there.
UNAVAILABLE_RETRY_AFTER_S = 1

# Module level: the dependency's annotation below is resolved in this module's globals.
_BEARER = HTTPBearer(auto_error=False, description="the api token (auth.api_token)")


def _require_token(tokens: Tokens | TokenStore) -> Any:
    """A dependency: every /v1 route is the public job API (api or service token); a
    TokenStore's tokens follow its files (rotation)."""

    async def check(
            creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        presented = creds.credentials if creds is not None else ""
        if tokens.current().allows(presented, Access.PUBLIC) is not None:
            raise Unauthenticated("missing or invalid bearer token")

    return check


def _error_response(status: int, body: ErrorBody,
                    headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=body.model_dump(exclude_none=True),
                        headers=headers)


async def _libra_error(_request: Request, exc: Exception) -> JSONResponse:
    """A domain error as its HTTP status and an ErrorBody."""
    assert isinstance(exc, LibraError)
    code = exc.grpc_status_name
    body = ErrorBody(error=code.lower(), message=str(exc), field=getattr(exc, "field", None))
    headers: dict[str, str] = {}
    if isinstance(exc, Unauthenticated):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, ResourceExhausted):
        body.retry_after_ms = exc.retry_after_ms
        headers["Retry-After"] = str(math.ceil(exc.retry_after_ms / 1000))
    if isinstance(exc, Unavailable):
        headers["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER_S)
    return _error_response(HTTP_STATUS.get(code, 500), body, headers)


async def _known_query_only(request: Request) -> None:
    """A dependency: a query parameter the route does not take is a 400 naming it (a
    misspelt ``page_sise`` must not silently list the first page)."""
    route = request.scope.get("route")
    known = {param.alias for param in getattr(getattr(route, "dependant", None),
                                              "query_params", [])}
    for name in request.query_params:
        if name not in known:
            takes = ", ".join(sorted(known)) or "none"
            raise InvalidArgument(name or "query", f"unknown query parameter {name!r} "
                                  f"(this route takes: {takes})")


def _field_of(loc: Sequence[int | str]) -> str:
    """The request field a validation error points at: ("body", "spec") -> "spec",
    ("query", "priority") -> "priority", ("body",) -> "body"."""
    inner = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else list(loc)
    name = ""
    for part in inner:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or (str(loc[0]) if loc else "body")


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's body/query validation as the project's 400 (not a 422 of another shape)."""
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid"}
    if first.get("type") == "json_invalid":  # its loc ends in a character offset
        reason = f"not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}"
        return await _libra_error(request, InvalidArgument("body", reason))
    return await _libra_error(request, InvalidArgument(_field_of(first["loc"]), first["msg"]))


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    """Routing errors (unknown path 404, wrong method 405) in the same ErrorBody."""
    assert isinstance(exc, StarletteHTTPException)
    name = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_").replace("-", "_")
    return _error_response(exc.status_code, ErrorBody(error=name, message=str(exc.detail)),
                           dict(exc.headers or {}))


async def _outage(request: Request, exc: Exception) -> JSONResponse:
    """A registered outage error (Redis unreachable) as 503 + ErrorBody, not logged as a
    crash: the store already logged its retries, and an outage may last a while."""
    outage = as_unavailable(exc)
    assert outage is not None
    return await _libra_error(request, outage)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """Anything else: a 503 when it is a registered outage (Redis unreachable: the store
    registers its errors, libra.errors.register_unavailable), else a 500 with an
    ErrorBody. A 500 is not logged here: Starlette re-raises the error after this
    response and the server logs its traceback once."""
    if (outage := as_unavailable(exc)) is not None:
        return await _libra_error(request, outage)
    return _error_response(500, ErrorBody(error="internal", message="internal error"))


# OpenAPI links: the created job's id feeds the routes that take one (shown in /docs;
# schemathesis' stateful run follows them to real jobs).
_JOB_LINKS = {
    name: {"operationId": name, "parameters": {"job_id": "$response.body#/job_id"}}
    for name in ("get_job", "job_events", "job_run_view", "cancel_job", "resume_job")
}


def _drop_422(app: FastAPI) -> None:
    """FastAPI documents a 422 on every route with parameters; this API answers body and
    query validation errors with its 400 ErrorBody instead (``_validation_error``), so
    the generated 422 responses and their schemas are removed from the document."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = generate()
            for ops in doc.get("paths", {}).values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
            schemas = doc.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build_app(core: CoordinatorCore, tokens: Tokens | TokenStore | None = None,
              episodes: EpisodeEndpoint | None = None) -> FastAPI:
    """The REST API: /v1/jobs (create, list, get, cancel, resume, events) and /v1/workers.

    With ``tokens`` enabled every /v1 route needs ``Authorization: Bearer <token>``
    (401 otherwise); /healthz, /docs and /openapi.json stay open. Every status a route
    can answer is in the OpenAPI document, each error with the ErrorBody model.
    """
    app = FastAPI(title="Libra coordinator", version="v1",
                  generate_unique_id_function=lambda route: route.name,
                  description="Create, inspect and cancel agentic RL jobs. Every error "
                  "is an ErrorBody; a bad input is 400 naming the field.")
    tokens = tokens or Tokens()
    enabled = tokens.current().enabled  # fixed at start-up; a rotation changes which tokens
    job_api = [Depends(_require_token(tokens))] if enabled else []
    v1 = APIRouter(dependencies=[*job_api, Depends(_known_query_only)],
                   responses=error_responses(*((400, 401, 500, 503) if enabled
                                               else (400, 500, 503))))
    app.add_exception_handler(LibraError, _libra_error)
    for outage_type in unavailable_types():  # registered by the store's module (Redis)
        app.add_exception_handler(outage_type, _outage)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    _drop_422(app)
    views = RunViews(core)  # shared by /v1/jobs/{id}/view and the /ui pages

    @v1.post("/v1/jobs", status_code=201, response_model=JobView,
             responses={201: {"description": "the job, RUNNING or queued PENDING",
                              "links": _JOB_LINKS},
                        **error_responses(400, 409, 429, 503, 504)},
             summary="Create and start a job (queued PENDING while another job runs)")
    async def create_job(body: CreateJobBody,
                         priority: int | None = _PRIORITY_QUERY) -> JobView:
        try:
            job = await core.create_job(
                body.spec, body.format, body.priority if priority is None else priority)
        except InvalidArgument as exc:
            if exc.field != "spec_format":
                raise
            raise InvalidArgument("format", exc.reason) from exc  # the body's name for it
        return JobView.of(job)

    @v1.get("/v1/jobs", response_model=list[JobSummaryView],
            responses={**list_page_response(), **error_responses(400)},
            summary="List jobs (summaries, oldest first, one page)")
    async def list_jobs(response: Response,
                        page_size: int = _PAGE_SIZE_QUERY,
                        page_token: str = _PAGE_TOKEN_QUERY) -> list[JobSummaryView]:
        jobs, next_token = await core.list_jobs_page(page_size, page_token)
        if next_token:
            response.headers[NEXT_PAGE_HEADER] = next_token
        return [JobSummaryView.summary_of(j) for j in jobs]

    @v1.get("/v1/jobs/{job_id}", response_model=JobDetail, responses=error_responses(400, 404),
            summary="A job with its step history, counters and events")
    async def get_job(job_id: str) -> JobDetail:
        job, steps, counters = await core.get_job(job_id)
        return JobDetail(**JobView.of(job).model_dump(), steps=steps, counters=counters,
                         events=await core.job_events(job_id))

    @v1.get("/v1/jobs/{job_id}/events", response_model=list[dict[str, Any]],
            responses=error_responses(400, 404),
            summary="A job's events (elastic plans, joins, releases, failures), oldest first")
    async def job_events(job_id: str) -> list[dict[str, Any]]:
        return await core.job_events(job_id)

    @v1.get("/v1/jobs/{job_id}/view", response_model=RunView,
            responses=error_responses(400, 404),
            summary="A job's live view: reward curve, step-time phases, throughput, bucket "
            "placements, workers, recent events, the bottleneck verdict (what /ui and "
            "`libra top` show)")
    async def job_run_view(job_id: str) -> RunView:
        return await views.view(job_id)

    @v1.post("/v1/jobs/{job_id}/cancel", response_model=JobView,
             responses=error_responses(400, 404), summary="Cancel a job")
    async def cancel_job(job_id: str) -> JobView:
        return JobView.of(await core.cancel_job(job_id))

    @v1.post("/v1/jobs/{job_id}/resume", response_model=JobView,
             responses=error_responses(400, 404, 409, 429, 503, 504),
             summary="Restart a cancelled or failed job from its newest checkpoint")
    async def resume_job(job_id: str, body: ResumeJobBody | None = None,
                         priority: int | None = _PRIORITY_QUERY) -> JobView:
        chosen = priority if priority is not None else (body.priority if body else 0)
        return JobView.of(await core.resume_job(job_id, chosen))

    @v1.get("/v1/workers", response_model=list[LeaseView],
            summary="Live worker leases (worker_id, role, bucket, epoch, address, "
            "expires_at_ms, ttl_ms)")
    async def list_workers() -> list[LeaseView]:
        return [LeaseView.of(lease) for lease in await core.list_workers()]

    app.include_router(v1)
    app.include_router(ui_router(core, views, tokens))  # the web view (coordinator/ui.py)
    if episodes is not None:  # the OpenAI-compatible agent endpoint (docs/agent-endpoint.md)
        app.include_router(agent_router(episodes, job_api))

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
