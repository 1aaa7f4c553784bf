"""The live web view's HTTP side: pages, assets, the run view routes, sign-in, errors.

Real: the FastAPI app (with the api token), the core and ``RedisCoordinatorStore`` on the
session's redis-server; httpx over ASGITransport (what TestClient wraps). Fakes:
``FakeRunner`` replaces the trainer and the scheduler (steps are reported as the trainer
would). The page's script runs in a real browser in
tests/integration/test_ui_browser.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from libra import types as t
from libra.access import Tokens
from libra.clock import SystemClock
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.store import RedisCoordinatorStore
from services.coordinator.ui import COOKIE
from tests.fakes.runner import FakeRunner

API_TOKEN = "ui-api-token"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
SPEC = 'name = "ui"\n[algorithm]\nnum_steps = 5\n'


@pytest.fixture
async def core(redis: Any, tmp_path: Path) -> CoordinatorCore:
    return CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")


@pytest.fixture
async def http(core: CoordinatorCore) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(core, Tokens(api=API_TOKEN, service="ui-service-token"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://coordinator") as client:
        yield client


async def _job_with_steps(core: CoordinatorCore, num_steps: int = 2) -> str:
    job = await core.create_job(SPEC, "toml")
    for n in range(1, num_steps + 1):
        await core.report_step(job.job_id, t.StepRecord(
            step=n, reward_mean=0.1 * n, rollout_s=3.0, train_s=1.0, wall_s=4.0,
            num_trajectories=4, bucket_occupancy={"short": 4}))
    return job.job_id


async def test_the_view_route_answers_the_typed_run_view(core: CoordinatorCore,
                                                        http: httpx.AsyncClient) -> None:
    job_id = await _job_with_steps(core)
    resp = await http.get(f"/v1/jobs/{job_id}/view", headers=AUTH)
    assert resp.status_code == 200
    view = resp.json()
    assert (view["job"]["job_id"], view["job"]["step"], view["job"]["target_steps"]) == (
        job_id, 2, 5)
    assert [p["step"] for p in view["curve"]] == [1, 2]
    assert view["verdict"]["kind"] == "rollout-bound"
    assert view["buckets"] == [{"bucket": "short", "placed_total": 8, "placed_last_step": 4,
                                "share": 1.0}]


async def test_the_view_of_an_unknown_job_is_a_404_naming_it(http: httpx.AsyncClient) -> None:
    resp = await http.get("/v1/jobs/no-such-job/view", headers=AUTH)
    assert resp.status_code == 404
    assert resp.json() == {"error": "not_found", "message": "job 'no-such-job' not found"}


async def test_the_view_route_is_in_the_openapi_document(http: httpx.AsyncClient) -> None:
    doc = (await http.get("/openapi.json")).json()
    op = doc["paths"]["/v1/jobs/{job_id}/view"]["get"]
    assert set(op["responses"]) >= {"200", "400", "401", "404"}
    assert not any(path.startswith("/ui") for path in doc["paths"])


async def test_a_page_without_a_token_says_how_to_sign_in(http: httpx.AsyncClient) -> None:
    resp = await http.get("/ui")
    assert resp.status_code == 401
    assert "/ui?token=API_TOKEN" in resp.text


async def test_a_wrong_token_is_refused_and_sets_no_cookie(http: httpx.AsyncClient) -> None:
    resp = await http.get("/ui?token=wrong")
    assert resp.status_code == 401 and COOKIE not in resp.cookies


async def test_the_token_moves_from_the_url_into_a_strict_http_only_cookie(
        core: CoordinatorCore, http: httpx.AsyncClient) -> None:
    job_id = await _job_with_steps(core, 1)
    resp = await http.get(f"/ui/jobs/{job_id}?token={API_TOKEN}&interval_ms=500")
    assert resp.status_code == 303
    assert resp.headers["location"] == f"/ui/jobs/{job_id}?interval_ms=500"
    cookie = resp.headers["set-cookie"]
    assert f"{COOKIE}={API_TOKEN}" in cookie
    assert {"HttpOnly", "Path=/ui", "SameSite=strict"} <= {p.strip() for p in
                                                           cookie.split(";")}
    page = await http.get(resp.headers["location"])  # the client keeps the cookie
    assert page.status_code == 200 and 'data-page="job"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    data = await http.get(f"/ui/api/jobs/{job_id}/view")
    assert data.status_code == 200 and data.json()["job"]["job_id"] == job_id


async def test_the_data_routes_take_the_bearer_header_and_refuse_without(
        core: CoordinatorCore, http: httpx.AsyncClient) -> None:
    job_id = await _job_with_steps(core, 1)
    refused = await http.get(f"/ui/api/jobs/{job_id}/view")
    assert refused.status_code == 401 and refused.json()["error"] == "unauthenticated"
    listed = await http.get("/ui/api/jobs", headers=AUTH)
    assert [j["job_id"] for j in listed.json()] == [job_id]


async def test_an_unknown_job_page_is_a_404_page_naming_the_job(
        http: httpx.AsyncClient) -> None:
    http.cookies.set(COOKIE, API_TOKEN)
    resp = await http.get("/ui/jobs/no-such-job")
    assert resp.status_code == 404
    assert resp.headers["content-type"].startswith("text/html")
    assert "No job &#x27;no-such-job&#x27;" in resp.text
    data = await http.get("/ui/api/jobs/no-such-job/view")
    assert data.status_code == 404 and "no-such-job" in data.json()["message"]


async def test_assets_are_served_from_the_package_and_unknown_ones_are_404(
        http: httpx.AsyncClient) -> None:
    for name, kind in (("ui.js", "text/javascript"), ("ui.css", "text/css"),
                       ("job.html", "text/html")):
        resp = await http.get(f"/ui/static/{name}")
        assert resp.status_code == 200 and resp.headers["content-type"].startswith(kind)
    assert (await http.get("/ui/static/../rest.py")).status_code == 404
    assert (await http.get("/ui/static/nothing.js")).status_code == 404


async def test_pages_reference_no_other_origin(http: httpx.AsyncClient) -> None:
    """No CDN: every script, style and image of the view comes from the coordinator."""
    for name in ("index.html", "job.html", "ui.js", "ui.css"):
        text = (await http.get(f"/ui/static/{name}")).text
        hosts = set(re.findall(r"(?:https?:)?//([\w-]+(?:\.[\w-]+)+)", text))
        assert hosts <= {"www.w3.org"}, (name, hosts)  # the SVG namespace is only a name
        assert "@import" not in text and "url(" not in text, name
