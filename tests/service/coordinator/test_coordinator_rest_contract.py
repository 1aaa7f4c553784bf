"""The coordinator's REST API holds its OpenAPI contract under generated input.

Real: the FastAPI app served by uvicorn on a loopback socket (with the api token), the
core, ``RedisCoordinatorStore`` on the session's redis-server, and schemathesis
generating requests from the served /openapi.json and checking every response (no 5xx,
status codes, content types, headers and bodies as documented, invalid input refused,
401 without the token). Fakes: ``FakeRunner`` replaces the trainer and the scheduler
(the subject is the API contract; no model or dataset check). The job queue holds 2, so
generated creates start at most 3 jobs (1 running + 2 queued) and then get the
documented 429.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync
import redis.asyncio as aioredis
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import positive_data_acceptance

from libra import errors
from libra.access import Tokens
from libra.clock import SystemClock
from libra_cli.redis_server import EmbeddedRedis, free_port
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.rest_models import ErrorBody
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner

API_TOKEN = "contract-api-token"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
SEED = 24  # issue #24: fixed, so a run is reproducible
MAX_QUEUED_JOBS = 2
# Examples per operation and mode; the parameterless GETs exhaust their (tiny) input
# space after a few cases, the rest make up >= 1,000 in total.
EXAMPLES = {GenerationMode.POSITIVE: 110, GenerationMode.NEGATIVE: 60}
MIN_CASES = 1_000
SPEC = 'name = "contract"\n[algorithm]\nnum_steps = 2\n'
STATEFUL_EXAMPLES = 60  # scenarios of up to 8 linked calls
# positive_data_acceptance expects a 2xx for schema-valid input; a JSON string that
# is a valid spec *document* cannot be said in a schema, so a generated spec is a 400
# naming the spec's field (checked here to be an ErrorBody, as documented).
EXCLUDED_CHECKS = [positive_data_acceptance]


class LiveApi:
    """The REST app on a socket, run in its own thread and event loop (schemathesis'
    calls are blocking)."""

    def __init__(self, redis_url: str, run_root: Path,
                 max_queued_jobs: int = MAX_QUEUED_JOBS) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.runner = FakeRunner()
        self._redis_url = redis_url
        self._run_root = run_root
        self._max_queued_jobs = max_queued_jobs
        self._server: uvicorn.Server | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()),
                                        name="rest-contract", daemon=True)

    async def _serve(self) -> None:
        redis = aioredis.from_url(self._redis_url, decode_responses=True)
        await redis.flushdb()
        core = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), self.runner,
                               FakeRunner(), SystemClock(), self._run_root,
                               max_queued_jobs=self._max_queued_jobs)
        self._server = uvicorn.Server(uvicorn.Config(
            build_app(core, Tokens(api=API_TOKEN)), host="127.0.0.1", port=self.port,
            log_level="warning"))
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        task = asyncio.create_task(self._server.serve())
        while not self._server.started and not task.done():
            await asyncio.sleep(0.01)
        self._started.set()
        await task
        await core.settle()
        await redis.aclose()

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(30.0), "uvicorn did not start"
        assert self._server is not None and self._server.started, "uvicorn exited at start-up"

    def reset(self) -> None:
        """Forget every job (a fresh Redis database), between stateful scenarios."""
        client = redis_sync.Redis.from_url(self._redis_url)
        client.flushdb()
        client.close()

    def stop(self) -> None:
        assert self._server is not None
        self._server.should_exit = True
        self._thread.join(30.0)


@pytest.fixture
def live_api(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[LiveApi]:
    api = LiveApi(redis_server.url, tmp_path / "runs")
    api.start()
    yield api
    api.stop()


def _fuzz(operation: Any, mode: GenerationMode, base_url: str, statuses: Counter[str],
          failures: list[str], kinds: set[str]) -> None:
    """Run ``EXAMPLES[mode]`` generated cases of one operation; record each status and
    each failed check (collected, not raised, so one run reports every route) and its
    kind (operation, check, title: the distinct failures)."""

    @seed(SEED)
    @settings(max_examples=EXAMPLES[mode], deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        try:
            response = case.call_and_validate(base_url=base_url, headers=AUTH,
                                              excluded_checks=EXCLUDED_CHECKS, timeout=10)
            statuses[f"{operation.label} {response.status_code}"] += 1
        except (Exception, FailureGroup) as exc:  # a failed check: keep it, go on
            statuses[f"{operation.label} failed"] += 1
            failures.append(f"{operation.label} [{mode.value}]: {exc}")
            for sub in getattr(exc, "exceptions", [exc]):
                received = re.search(r"Received: (\d+)", str(sub))
                kinds.add(f"{operation.label}: {type(sub).__name__}"
                          f"{f' {received.group(1)}' if received else ''}")

    run()


def test_generated_requests_get_only_documented_responses(live_api: LiveApi) -> None:
    schema = schemathesis.openapi.from_url(f"{live_api.base_url}/openapi.json")
    statuses: Counter[str] = Counter()
    failures: list[str] = []
    kinds: set[str] = set()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 8  # + GET /v1/jobs/{job_id}/view (the live view)
    for operation in operations:
        for mode in EXAMPLES:
            _fuzz(operation, mode, live_api.base_url, statuses, failures, kinds)
    num_cases = sum(statuses.values())
    print(f"\n{num_cases} cases, {len(failures)} failures; statuses: {dict(statuses)}")
    print("distinct failures:\n" + "\n".join(sorted(kinds)))
    assert failures == [], "\n\n".join(failures[:10])
    assert num_cases >= MIN_CASES
    assert not any(key.split()[-1].startswith("5") for key in statuses)
    # Generated creates were bounded by the queue: never more than 1 + MAX_QUEUED_JOBS.
    assert len(live_api.runner.started) <= 1


def test_errors_are_error_bodies_and_documented(live_api: LiveApi) -> None:
    with httpx.Client(base_url=live_api.base_url, timeout=10.0) as http:
        doc = http.get("/openapi.json").json()
        unauth = http.get("/v1/jobs")
        bad = http.post("/v1/jobs", json={"spec": 3}, headers=AUTH)
        bad_json = http.post("/v1/jobs", content=b"{", headers={
            **AUTH, "Content-Type": "application/json"})
        bad_format = http.post("/v1/jobs", json={"spec": "", "format": "xml"}, headers=AUTH)
        bad_priority = http.post("/v1/jobs?priority=high", json={"spec": ""}, headers=AUTH)
        missing = http.get("/v1/jobs/no-such-job", headers=AUTH)
        wrong_method = http.delete("/v1/jobs", headers=AUTH)
        no_route = http.get("/v2/nothing", headers=AUTH)
    assert (unauth.status_code, unauth.json()["error"]) == (401, "unauthenticated")
    assert unauth.headers["www-authenticate"] == "Bearer"
    assert (bad.status_code, bad.json()["field"]) == (400, "spec")
    assert (bad_json.status_code, bad_json.json()["field"]) == (400, "body")
    assert bad_json.json()["message"].startswith("body: not valid JSON")
    assert (bad_format.status_code, bad_format.json()["field"]) == (400, "format")
    assert (bad_priority.status_code, bad_priority.json()["field"]) == (400, "priority")
    assert (wrong_method.status_code, wrong_method.json()["error"]) == (
        405, "method_not_allowed")
    assert (missing.status_code, missing.json()["error"]) == (404, "not_found")
    assert (no_route.status_code, no_route.json()["error"]) == (404, "not_found")
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (method, path)
            for status, response in op["responses"].items():
                if status.startswith(("4", "5")):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorBody"), (method, path, status)
    create = doc["paths"]["/v1/jobs"]["post"]["responses"]
    assert {"201", "400", "401", "409", "429"} <= set(create)
    assert "Retry-After" in create["429"]["headers"]



def test_linked_sequences_over_real_jobs_get_documented_responses(
        redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    """Stateful: create -> get / events / cancel / resume on the created job (the 201's
    OpenAPI links). Each scenario starts from an empty store, and the queue takes every
    create (the fake runner starts one job; the rest wait), so a scenario's statuses
    follow from its own calls only (hypothesis replays scenarios and needs that)."""
    live_api = LiveApi(redis_server.url, tmp_path / "runs", max_queued_jobs=100_000)
    live_api.start()
    try:
        _run_stateful(live_api)
    finally:
        live_api.stop()


def _run_stateful(live_api: LiveApi) -> None:
    schema = schemathesis.openapi.from_url(f"{live_api.base_url}/openapi.json")
    statuses: Counter[str] = Counter()

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            live_api.reset()

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"base_url": live_api.base_url, "headers": AUTH, "timeout": 10}

        def validate_response(self, response: Any, case: Any,
                              additional_checks: Any = None, **kwargs: Any) -> None:
            statuses[f"{case.operation.label} {response.status_code}"] += 1
            case.validate_response(response, excluded_checks=EXCLUDED_CHECKS,
                                   headers=AUTH, transport_kwargs=kwargs)

    Machine.run(settings=settings(max_examples=STATEFUL_EXAMPLES, stateful_step_count=8,
                                  deadline=None, database=None, derandomize=True,
                                  suppress_health_check=list(HealthCheck)))
    print(f"\nstateful: {sum(statuses.values())} calls; statuses: {dict(statuses)}")
    assert sum(statuses.values()) >= STATEFUL_EXAMPLES
    assert not any(key.split()[-1].startswith("5") for key in statuses)


def _write_checkpoint(run_dir: str, step: int = 1) -> None:
    folder = Path(run_dir) / "checkpoints" / f"step_{step:06d}"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"step": step, "policy_version": 0,
                                                  "files": {}}))


def test_a_job_walk_gets_each_documented_status(live_api: LiveApi) -> None:
    """Every route's success and each error it documents for a real job, each response
    checked against the served document (status listed, body and headers as declared)."""
    schema = schemathesis.openapi.from_url(f"{live_api.base_url}/openapi.json")
    seen: list[tuple[str, int]] = []

    def call(method: str, path: str, template: str = "", **kwargs: Any) -> httpx.Response:
        resp = http.request(method, path, **kwargs)
        operation = schema[template or path][method]
        assert str(resp.status_code) in operation.definition.raw["responses"], (
            method, path, resp.status_code, resp.text)
        operation.validate_response(resp)  # raises when the body breaks the schema
        seen.append((f"{method} {template or path}", resp.status_code))
        return resp

    one = "/v1/jobs/{job_id}"
    with httpx.Client(base_url=live_api.base_url, headers=AUTH, timeout=10.0) as http:
        running = call("POST", "/v1/jobs", json={"spec": SPEC}).json()
        queued = [call("POST", "/v1/jobs", json={"spec": SPEC, "priority": p}).json()
                  for p in (5, 1)]
        full = call("POST", "/v1/jobs", json={"spec": SPEC})
        call("POST", "/v1/jobs", json={"spec": "[algorithm]\nnum_steps = -1\n"})
        call("GET", "/v1/jobs")
        call("GET", "/v1/workers")
        jid = running["job_id"]
        detail = call("GET", f"/v1/jobs/{jid}", one).json()
        call("GET", f"/v1/jobs/{jid}/events", one + "/events")
        call("POST", f"/v1/jobs/{jid}/resume", one + "/resume")  # running: 409
        call("POST", f"/v1/jobs/{jid}/cancel", one + "/cancel")
        call("POST", f"/v1/jobs/{jid}/resume", one + "/resume")  # no checkpoint: 409
        _write_checkpoint(running["run_dir"])
        call("POST", f"/v1/jobs/{jid}/resume?priority=2", one + "/resume")
        call("GET", "/v1/jobs/no-such-job", one)
        call("POST", "/v1/jobs/no-such-job/cancel", one + "/cancel")
        call("GET", "/v1/jobs", headers={"Authorization": "Bearer wrong"})
    assert [state for state in (running["state"], *(q["state"] for q in queued))] == [
        "running", "pending", "pending"]
    assert (full.status_code, full.json()["retry_after_ms"] > 0) == (429, True)
    assert (detail["steps"], detail["queue_position"]) == ([], 0)
    assert [status for _, status in seen] == [
        201, 201, 201, 429, 400, 200, 200, 200, 200, 409, 200, 409, 200, 404, 404, 401]


# -- every domain error through the app ---------------------------------------------------

RAISED = [
    (errors.InvalidArgument("model.path", "no such file"), 400),
    (errors.Unauthenticated("no token"), 401),
    (errors.PermissionDenied(errors.PermissionDenied.MESSAGE_PREFIX + "internal"), 403),
    (errors.LeaseLost("fenced"), 403),
    (errors.NotFound("no job"), 404),
    (errors.AlreadyExists("job exists"), 409),
    (errors.FailedPrecondition("trainer busy"), 409),
    (errors.LeaseConflict("epoch moved"), 409),
    (errors.ResourceExhausted("full", retry_after_ms=1500), 429),
    (errors.Internal("broken"), 500),
    (errors.LibraError("unnamed"), 500),
    (errors.Unavailable("trainer unreachable"), 503),
    (errors.DeadlineExceeded("trainer slow"), 504),
    (RuntimeError("a bug"), 500),
]


@pytest.mark.parametrize(("raised", "status"), RAISED, ids=lambda v: type(v).__name__)
async def test_a_refused_start_answers_its_status_with_an_error_body(
        redis: Any, tmp_path: Path, raised: Exception, status: int) -> None:
    core = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()),
                           FakeRunner(start_error=raised), FakeRunner(), SystemClock(),
                           tmp_path / "runs")
    transport = httpx.ASGITransport(app=build_app(core), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as http:
        resp = await http.post("/v1/jobs", json={"spec": SPEC})
    body = resp.json()
    assert resp.status_code == status
    assert set(body) <= set(ErrorBody.model_fields) and body["message"]
    if isinstance(raised, errors.LibraError):
        assert body["error"] == raised.grpc_status_name.lower()
    else:
        assert (body["error"], body["message"]) == ("internal", "internal error")
    assert body.get("field") == getattr(raised, "field", None)
    if status == 429:
        assert (body["retry_after_ms"], resp.headers["retry-after"]) == (1500, "2")
