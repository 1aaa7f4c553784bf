"""The live web view: ``/ui`` (job picker) and ``/ui/jobs/{job_id}`` (one job's panels).

No build step and no CDN: the pages are the hand-written files in ``ui_assets/``
(HTML, one script, one style sheet), read once and served from memory. The script
polls ``/ui/api/jobs/{job_id}/view``: the run view (``libra.run_view``) that
``GET /v1/jobs/{job_id}/view`` also answers, built by :class:`RunViews` from the core.

Access (docs/observability.md, "Live view", signing in): with tokens enabled, open
``/ui?token=<api token>`` once. The coordinator answers with a redirect to the same page
without the token (so it leaves the address bar and history) and an HttpOnly,
SameSite=Strict cookie holding it, valid on ``/ui`` only; every later page and data
request of the view carries the cookie. ``/ui/api`` also takes the usual bearer header.
Only reads live under ``/ui``, so the cookie cannot be used to change anything.
"""

from __future__ import annotations

import asyncio
import html
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Generic, TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from libra.access import Access, Tokens, TokenStore, bearer
from libra.errors import LibraError, Unauthenticated
from libra.run_view import RunView, build_run_view, job_line, run_view_to_dict
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest_models import HTTP_STATUS

logger = logging.getLogger(__name__)
T = TypeVar("T")

COOKIE = "libra_ui_token"
LIST_FRESH_S = 1.0
"""Leases and the job list younger than this are shown as they are (a second behind at
most: the page polls every second)."""
LIST_STALE_S = 10.0
"""Older than this (nobody polled for a while) they are read again before answering."""
_ASSETS_DIR = Path(__file__).with_name("ui_assets")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
# Everything from this origin only; the favicon is an inline data: URL (no request, so
# no 404 in the console).
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


class _Recent(Generic[T]):
    """The last value of a read that changes slowly (the live leases, the job list),
    kept off the view's critical path: younger than ``fresh_s`` it is used as it is;
    up to ``stale_s`` it is used while one background read refreshes it; older (or
    never read) it is read before answering. A failed background read keeps the old
    value (the next view tries again; the job's own reads report an outage)."""

    def __init__(self, read: Callable[[], Awaitable[T]], fresh_s: float, stale_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._fresh_s, self._stale_s, self._clock = read, fresh_s, stale_s, clock
        self._value: T | None = None
        self._at_s = 0.0
        self._refreshing: asyncio.Task[None] | None = None

    async def get(self) -> T:
        age_s = self._clock() - self._at_s
        if self._value is None or age_s > self._stale_s:
            await self._refresh()
        elif age_s > self._fresh_s and self._refreshing is None:
            self._refreshing = asyncio.create_task(self._refresh_in_background())
        assert self._value is not None
        return self._value

    async def _refresh(self) -> None:
        self._value, self._at_s = await self._read(), self._clock()

    async def _refresh_in_background(self) -> None:
        try:
            await self._refresh()
        except Exception:  # noqa: BLE001 - kept value; logged, never raised into a view
            logger.warning("[ui] background refresh failed; keeping the last value",
                           exc_info=True)
        finally:
            self._refreshing = None


class RunViews:
    """Builds run views from the core: the job's own reads every time; the leases and
    the job list (for the workers and queue panels) through :class:`_Recent`, at most
    ``LIST_FRESH_S`` old while someone polls, so a view costs the job's reads only."""

    def __init__(self, core: CoordinatorCore) -> None:
        self._core = core
        self._leases = _Recent(core.list_workers, LIST_FRESH_S, LIST_STALE_S)
        self._jobs = _Recent(core.list_jobs, LIST_FRESH_S, LIST_STALE_S)

    async def view(self, job_id: str) -> RunView:
        """The run view of ``job_id`` (NotFound for an unknown id)."""
        # Independent reads, sent together: a view costs about the slowest one.
        (job, steps, counters), events, leases, jobs = await asyncio.gather(
            self._core.get_job(job_id), self._core.job_events(job_id), self._leases.get(),
            self._jobs.get())
        return build_run_view(job, steps, counters, events, leases, jobs)


def _load_assets() -> dict[str, tuple[bytes, str]]:
    return {path.name: (path.read_bytes(), _TYPES[path.suffix])
            for path in sorted(_ASSETS_DIR.iterdir()) if path.suffix in _TYPES}


def _page(body: str, status: int, title: str) -> HTMLResponse:
    """A small server-written page (errors, sign-in hint) in the view's style."""
    text = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title>"
            "<link rel=icon href='data:,'><link rel=stylesheet href='/ui/static/ui.css'>"
            f"</head><body><main class=notice>{body}"
            "<p><a href='/ui'>all jobs</a></p></main></body></html>")
    return HTMLResponse(text, status_code=status, headers=_HEADERS)


class _Gate:
    """Who may read the view: the api (or service) token, from the cookie, the bearer
    header or (pages only) the ``token`` query parameter."""

    def __init__(self, tokens: Tokens | TokenStore) -> None:
        self._tokens = tokens

    def allows(self, presented: str) -> bool:
        tokens = self._tokens.current()
        return not tokens.enabled or tokens.allows(presented, Access.PUBLIC) is None

    def request_allowed(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        return self.allows(request.cookies.get(COOKIE, "")) or (
            bool(header) and self.allows(bearer(header)))

    def page_gate(self, request: Request) -> Response | None:
        """None when the page may be served; else the redirect that stores a presented
        token in the cookie, or a 401 page saying how to sign in."""
        presented = request.query_params.get("token")
        if presented is not None and self.allows(presented):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            url = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            response = RedirectResponse(url, status_code=303, headers=_HEADERS)
            response.set_cookie(COOKIE, presented, httponly=True, samesite="strict",
                                path="/ui", secure=request.url.scheme == "https")
            return response
        if presented is None and self.request_allowed(request):
            return None
        return _page("<h1>Sign in to the Libra view</h1><p>Open this page once as "
                     "<code>/ui?token=API_TOKEN</code> (the api token: "
                     "<code>runs/.secrets/api_token</code> under <code>libra up</code>). "
                     "The view then keeps it in a cookie.</p>", 401, "Libra: sign in")


def ui_router(core: CoordinatorCore, views: RunViews,
              tokens: Tokens | TokenStore) -> APIRouter:
    """The pages, their static files and their two data routes (not in /openapi.json:
    ``GET /v1/jobs/{job_id}/view`` is the documented form of the data)."""
    router = APIRouter(include_in_schema=False)
    assets = _load_assets()
    gate = _Gate(tokens)

    @router.get("/ui")
    async def picker(request: Request) -> Response:
        return gate.page_gate(request) or _asset(assets, "index.html")

    @router.get("/ui/jobs/{job_id}")
    async def job_page(request: Request, job_id: str) -> Response:
        if (refused := gate.page_gate(request)) is not None:
            return refused
        try:
            await core.job_events(job_id)  # one existence check (NotFound), no step read
        except LibraError as exc:
            return _error_page(exc, job_id)
        return _asset(assets, "job.html")

    @router.get("/ui/static/{name}")
    async def static(name: str) -> Response:
        if name not in assets:
            return _page(f"<h1>No file {html.escape(name)}</h1>", 404, "Libra: not found")
        return _asset(assets, name)

    @router.get("/ui/api/jobs")
    async def jobs(request: Request) -> JSONResponse:
        _check(gate, request)
        return JSONResponse([asdict(job_line(job)) for job in await core.list_jobs()],
                            headers=_HEADERS)

    @router.get("/ui/api/jobs/{job_id}/view")
    async def view(request: Request, job_id: str) -> JSONResponse:
        _check(gate, request)
        return JSONResponse(run_view_to_dict(await views.view(job_id)), headers=_HEADERS)

    return router


def _check(gate: _Gate, request: Request) -> None:
    if not gate.request_allowed(request):
        raise Unauthenticated("missing or invalid token: open /ui?token=API_TOKEN once, or "
                              "send Authorization: Bearer API_TOKEN")


def _asset(assets: dict[str, tuple[bytes, str]], name: str) -> Response:
    body, media_type = assets[name]
    return Response(body, media_type=media_type, headers=_HEADERS)


def _error_page(exc: LibraError, job_id: str) -> HTMLResponse:
    status = HTTP_STATUS.get(exc.grpc_status_name, 500)
    if status == 404:
        body = (f"<h1>No job {html.escape(repr(job_id))}</h1><p>This coordinator has no job "
                "with that id (a mistyped id, or one removed by retention).</p>")
    else:
        body = f"<h1>Job {html.escape(repr(job_id))}</h1><p>{html.escape(str(exc))}</p>"
    return _page(body, status, "Libra: job not found" if status == 404 else "Libra: error")
