"""The REST API's typed bodies (pydantic, at the edge only) and its error contract.

Every response a route can return is declared here, so /openapi.json (and /docs) list
them all: each error is an :class:`ErrorBody`, whatever produced it (a domain error from
the core, a body that fails validation, the bearer check, an unknown path). The status
of a domain error comes from one table keyed by its gRPC status name (``HTTP_STATUS``),
the same name the gRPC interceptor uses, so both APIs fail alike.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pydantic import BaseModel, Field

from libra import types as t

# gRPC status name of a LibraError (libra/errors.py) -> HTTP status. Every subclass's
# name must be here (tests/unit/coordinator/test_rest_models.py enumerates them);
# an unknown name answers 500.
HTTP_STATUS: dict[str, int] = {
    "INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "FAILED_PRECONDITION": 409, "ABORTED": 409,
    "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500, "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


class ErrorBody(BaseModel):
    """Every error response: what failed, why, and for a bad input which field."""

    error: str = Field(description="the status in snake case: invalid_argument, "
                       "unauthenticated, not_found, failed_precondition, "
                       "resource_exhausted, unavailable, internal, ...",
                       examples=["invalid_argument"])
    message: str = Field(description="what went wrong, for a person",
                         examples=["priority: must be an integer in [-1000, 1000], got 5000"])
    field: str | None = Field(None, description="the offending field (400 only), as "
                              "named in the request: `spec`, `priority`, `algorithm.lr`, ...")
    retry_after_ms: int | None = Field(None, description="429 only: when a retry may help")


class CreateJobBody(BaseModel):
    """A job spec document and its format."""

    spec: str = Field(description="the job spec document (see docs/jobspec.md)")
    format: str = Field("toml", description="toml, json or yaml")
    # Strict: a JSON true is not the integer 1 (the gRPC field is an int32 too).
    priority: int = Field(0, strict=True, description="queue priority in [-1000, 1000]: "
                          "higher starts first, FIFO among equals (used while another "
                          "job runs)")


class ResumeJobBody(BaseModel):
    """Options of a resume."""

    priority: int = Field(0, strict=True, description="queue priority, as for a new job")


class JobSummaryView(BaseModel):
    """A job without its spec (``GET /v1/jobs``; ``GET /v1/jobs/{job_id}`` has the spec);
    ``message`` cut to 1,024 characters."""

    job_id: str
    name: str
    state: t.JobState
    created_at_ms: int
    updated_at_ms: int
    message: str = Field(description="why the job is in its state (end reason, ...)")
    step: int = Field(description="the last step reported")
    policy_version: int
    run_dir: str
    priority: int
    queue_position: int = Field(description="1 = next to start, ...; 0 = not queued")
    num_resumes: int

    @classmethod
    def summary_of(cls, job: t.Job) -> JobSummaryView:
        fields = dataclasses.asdict(job)
        fields.pop("spec_json")
        return cls(**fields)


class JobView(JobSummaryView):
    """A job (``libra.types.Job``; its stored spec JSON as the ``spec`` object)."""

    spec: dict[str, Any] = Field(description="the validated, normalised job spec")

    @classmethod
    def of(cls, job: t.Job) -> JobView:
        fields = dataclasses.asdict(job)
        fields["spec"] = json.loads(fields.pop("spec_json"))
        return cls(**fields)


class JobDetail(JobView):
    """A job with its step records, counters and events."""

    steps: list[dict[str, Any]] = Field(description="step records, oldest first "
                                        "(docs/report.md)")
    counters: dict[str, int] = Field(description="trajectory accounting and the measured "
                                     "backlog (in_flight_*)")
    events: list[dict[str, Any]] = Field(description="elastic plans, joins, releases, "
                                         "failures, ..., oldest first")


class LeaseView(BaseModel):
    """A live worker lease (``libra.types.Lease``)."""

    worker_id: str
    role: t.WorkerRole
    bucket: str
    address: str
    epoch: int
    expires_at_ms: int
    ttl_ms: int

    @classmethod
    def of(cls, lease: t.Lease) -> LeaseView:
        return cls(**dataclasses.asdict(lease))


_WHY: dict[int, str] = {
    400: "invalid input; `field` names it (the spec's field, `priority`, a body field)",
    401: "missing or invalid bearer token (`Authorization: Bearer <token>`)",
    404: "no such job, or no such path",
    409: "the job's state does not allow it (failed_precondition: running, no checkpoint, "
         "...)",
    429: "the job queue is full (`max_queued_jobs`); retry after `retry_after_ms` "
         "(also the `Retry-After` header, seconds)",
    500: "an unexpected server error",
    503: "a collaborator is unreachable (tool gateway, trainer, scheduler, Redis); retry",
    504: "a collaborator did not answer in time; retry",
}
NEXT_PAGE_HEADER = "Next-Page-Token"
_NEXT_PAGE_HEADERS = {NEXT_PAGE_HEADER: {
    "description": "present when more jobs follow: pass it as `page_token` for the next page",
    "schema": {"type": "string"}}}
_RETRY_AFTER_HEADER = {"Retry-After": {"description": "seconds until a retry may help",
                                       "schema": {"type": "integer", "minimum": 0}}}


def list_page_response() -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entry of the 200 of ``GET /v1/jobs`` (its paging header)."""
    return {200: {"headers": _NEXT_PAGE_HEADERS}}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error statuses, each with the ErrorBody model."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        out[status] = {"model": ErrorBody, "description": _WHY[status]}
        if status in (429, 503):
            out[status]["headers"] = _RETRY_AFTER_HEADER
        if status == 401:
            out[status]["headers"] = {"WWW-Authenticate": {
                "description": "`Bearer`", "schema": {"type": "string"}}}
    return out
