"""The REST error table and views (services/coordinator/rest_models.py): every domain
error has an HTTP status, and the views carry every field of the dataclasses they show."""

from __future__ import annotations

import dataclasses

from libra import errors
from libra import types as t
from services.coordinator.rest_models import HTTP_STATUS, JobDetail, JobView, LeaseView

# The status each domain error answers over REST (a new LibraError subclass must be
# added here, with its status, before this test passes).
EXPECTED = {
    errors.LibraError: 500, errors.InvalidArgument: 400, errors.Unauthenticated: 401,
    errors.PermissionDenied: 403, errors.LeaseLost: 403, errors.NotFound: 404,
    errors.AlreadyExists: 409, errors.FailedPrecondition: 409, errors.LeaseConflict: 409,
    errors.ResourceExhausted: 429, errors.Internal: 500, errors.Unavailable: 503,
    errors.DeadlineExceeded: 504,
}


def _subclasses(cls: type) -> set[type]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _subclasses(sub)
    return found


def test_every_libra_error_subclass_has_its_http_status() -> None:
    classes = {c for c in _subclasses(errors.LibraError) if c.__module__ == errors.__name__}
    assert classes == set(EXPECTED)
    assert {c: HTTP_STATUS[c.grpc_status_name] for c in classes} == EXPECTED
    # Subclasses elsewhere (RowError, UnknownTool, ...) inherit a status in the table.
    assert all(c.grpc_status_name in HTTP_STATUS for c in _subclasses(errors.LibraError))


def test_job_view_has_every_job_field_with_the_spec_as_an_object() -> None:
    job_fields = {f.name for f in dataclasses.fields(t.Job)} - {"spec_json"} | {"spec"}
    assert set(JobView.model_fields) == job_fields
    assert set(JobDetail.model_fields) == job_fields | {"steps", "counters", "events"}
    job = t.Job(job_id=t.JobId("j-1"), name="j", state=t.JobState.RUNNING,
                spec_json='{"name": "j"}', created_at_ms=1, updated_at_ms=2, priority=3)
    view = JobView.of(job).model_dump(mode="json")
    assert (view["state"], view["spec"], view["priority"]) == ("running", {"name": "j"}, 3)


def test_lease_view_has_every_lease_field() -> None:
    assert set(LeaseView.model_fields) == {f.name for f in dataclasses.fields(t.Lease)}
    lease = t.Lease(t.WorkerId("w"), t.WorkerRole.CORE_ROLLOUT, "b", "a:1", 2, 3, 4)
    assert LeaseView.of(lease).model_dump(mode="json")["role"] == "core-rollout"
