"""The live web view: ``/ui`` (job picker) and ``/ui/jobs/{job_id}`` (one job's panels).

No build step and no CDN: the pages are the hand-written files in ``ui_assets/``
(HTML, one script, one style sheet), read once and served from memory. The script
polls ``/ui/api/jobs/{job_id}/view``: the run view (``libra.run_view``) that
``GET /v1/jobs/{job_id}/view`` also answers, built by :func:`job_view` from the core.

Access (docs/observability.md, "Web view"): with tokens enabled, open
``/ui?token=<api token>`` once. The coordinator answers with a redirect to the same page
without the token (so it leaves the address bar and history) and an HttpOnly,
SameSite=Strict cookie holding it, valid on ``/ui`` only; every later page and data
request of the view carries the cookie. ``/ui/api`` also takes the usual bearer header.
Only reads live under ``/ui``, so the cookie cannot be used to change anything.
"""

from __future__ import annotations

import asyncio
import html
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from libra.access import Access, Tokens, TokenStore, bearer
from libra.errors import LibraError, Unauthenticated
from libra.run_view import RunView, build_run_view, job_line, run_view_to_dict
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest_models import HTTP_STATUS

COOKIE = "libra_ui_token"
_ASSETS_DIR = Path(__file__).with_name("ui_assets")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
# Everything from this origin only; the favicon is an inline data: URL (no request, so
# no 404 in the console).
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


async def job_view(core: CoordinatorCore, job_id: str) -> RunView:
    """The run view of ``job_id`` (NotFound for an unknown id), from the core's reads."""
    # The four reads are independent: sent together, a view costs about the slowest one
    # (the 100 ms p99 budget of docs/observability.md), not their sum.
    (job, steps, counters), events, leases, jobs = await asyncio.gather(
        core.get_job(job_id), core.job_events(job_id), core.list_workers(),
        core.list_jobs())
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


def ui_router(core: CoordinatorCore, tokens: Tokens | TokenStore) -> APIRouter:
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
        return JSONResponse(run_view_to_dict(await job_view(core, job_id)), headers=_HEADERS)

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
