"""The PS's web face: a Starlette app over a RunStatus (read-only JSON API, /metrics, the live page, SSE).

Routes:
    /                 the live page (static files shipped inside the package; no build step, no CDN)
    /api/status       run id, spec, phase, round, elapsed, ETA, nodes joined / lost / waiting
    /api/rounds       round records so far (metrics, duration, elapsed, cumulative bytes); ?since=N skips N
    /api/links        bytes per link and per (link, kind, phase), totals; ?rows=1 adds the raw meter rows
    /api/topology     PS, edges, clients, edge graph, node states, the model's route so far
    /api/missing      the missing log
    /api/timeline     where each round's time went: compute / encode / wait per node, transfer per link
                      (timeline.csv's rows so far), the slowest link and node; ?since=N: rounds >= N (0-based)
    /api/events       server-sent events: one JSON message per change (see feed.py)
    /metrics          Prometheus exposition format

With a token, every route answers 401 unless the request carries ``Authorization: Bearer TOKEN`` (or the
cookie that ``/?token=TOKEN`` sets, for a browser: EventSource cannot send headers). Bound to loopback, only
loopback Host headers are accepted (a page elsewhere cannot read the API through DNS rebinding).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from fedhop.server.web.feed import Cursor, next_message
from fedhop.server.web.guard import CachedStatus, Guard, RateLimiter, ResponseCache, WebLimits
from fedhop.server.web.metrics import make_registry
from fedhop.server.web.status import RunStatus

COOKIE = "fedhop_token"
KEEPALIVE_S = 15.0
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]
DEFAULT_LIMITS = WebLimits()
WORKER_THREADS = 2  # threads the web face may use beside its event loop's (static files' reads)
SINCE = re.compile(r"[0-9]{1,9}")


class Notifier:
    """Wakes the SSE streams (on the server's event loop) when the RunStatus changes (in the run's thread)."""

    def __init__(self, status: RunStatus) -> None:
        self.status = status
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closing = False
        self._event: asyncio.Event | None = None
        self._unwatch: Any = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._unwatch = self.status.watch(self._changed)

    def stop(self) -> None:
        if self._unwatch is not None:
            self._unwatch()

    def _changed(self, _version: int) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        assert self._event is not None
        ev, self._event = self._event, asyncio.Event()
        ev.set()

    def close(self) -> None:
        """End every stream (thread-safe): the server is about to stop."""
        def close() -> None:
            self.closing = True
            self._wake()
        if self.loop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(close)

    async def wait_beyond(self, version: int, timeout: float) -> bool:
        """Wait until the status is past ``version`` (True) or ``timeout`` s passed (False)."""
        assert self._event is not None
        ev = self._event
        if self.closing or self.status.version > version:
            return True
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            return False
        return True


class BearerAuth:
    """ASGI middleware: 401 unless the request carries the token (header or cookie), compared in constant time."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        header = request.headers.get("authorization", "")
        given = header[7:] if header[:7].lower() == "bearer " else request.cookies.get(COOKIE, "")
        query = request.query_params.get("token") if scope["path"] == "/" else None
        if query is not None and hmac.compare_digest(query.encode(), self.token):
            response: Response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, query, httponly=True, samesite="strict")
        elif hmac.compare_digest(given.encode(), self.token):
            await self.app(scope, receive, send)
            return
        else:
            response = JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                                    headers={"WWW-Authenticate": 'Bearer realm="fedhop"'})
        await response(scope, receive, send)


def web_middleware(limits: WebLimits | None, loopback: bool, token: str | None,
                   rates: RateLimiter | None = None) -> list[Middleware]:
    """What stands before every route of a web face (the PS's, ``fedhop ui``'s): the request bounds
    (:class:`Guard`, when ``limits``; ``rates``: its token buckets, shared with the server's protocol), the
    loopback Host check, the bearer token."""
    middleware = []
    if limits is not None:
        middleware.append(Middleware(Guard, limits=limits, rates=rates))
    if loopback:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS))
    if token is not None:
        middleware.append(Middleware(BearerAuth, token=token))
    return middleware


def create_app(status: RunStatus, *, token: str | None = None, loopback: bool = True,
               limits: WebLimits | None = DEFAULT_LIMITS) -> Starlette:
    """The ASGI app over ``status``. ``token``: require it on every route. ``loopback``: accept only loopback
    Host headers. ``limits``: the bounds on requests, rates and streams and how often reads are computed (see
    guard.py); None = unbounded, every read computed per request (an app mounted inside another that guards)."""
    view: Any = CachedStatus(status, limits.status_cache_s) if limits is not None else status
    rates = RateLimiter(limits.rate_per_s, limits.burst, limits.max_clients) if limits is not None else None
    bodies = ResponseCache(limits.status_cache_s if limits is not None else 0.0)
    interval = limits.stream_interval_s if limits is not None else 0.0
    registry = make_registry(view)
    notifier = Notifier(status)
    static = resources.files("fedhop.server.web") / "static"
    index_html = (static / "index.html").read_text(encoding="utf-8")

    def since(request: Request) -> int:
        raw = request.query_params.get("since", "0")
        if not SINCE.fullmatch(raw):
            raise ValueError(f"since must be a non-negative integer (at most 9 digits), got {raw[:40]!r}")
        return int(raw)

    def cached(request: Request, render: Callable[[], Any]) -> Response:
        """The JSON of ``render()``, shared by identical requests for ``limits.status_cache_s`` while no event
        changed the run (a request after an event sees it)."""
        key = (request.url.path, request.scope.get("query_string", b""))
        return Response(bodies.get(key, lambda: _json(render()), version=status.version),
                        media_type="application/json")

    async def index(request: Request) -> Response:
        # the run's state as of now, in the page: it shows the run even if its event stream never connects (the
        # PS stops serving as the run ends; a proxy that keeps event streams out)
        snapshot = json.dumps(next_message(view, Cursor())[1]).replace("<", "\\u003c")  # no "</script>" inside
        html = index_html.replace("</body>", f'<script id="snapshot" type="application/json">{snapshot}</script>\n'
                                  "</body>", 1)
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    async def api_status(request: Request) -> Response:
        return cached(request, view.status)

    async def api_rounds(request: Request) -> Response:
        try:
            n = since(request)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return cached(request, lambda: {"setup": view.setup_round(), "rounds": view.rounds(n)})

    async def api_links(request: Request) -> Response:
        rows = request.query_params.get("rows") == "1"
        return cached(request, lambda: {**view.links(), "rows": view.link_rows()} if rows else view.links())

    async def api_topology(request: Request) -> Response:
        return cached(request, view.topology)

    async def api_missing(request: Request) -> Response:
        try:
            n = since(request)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return cached(request, lambda: {"missing": view.missing(n)})

    async def api_timeline(request: Request) -> Response:
        try:
            n = since(request) if "since" in request.query_params else -1
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return cached(request, lambda: view.timeline(n))

    async def metrics(request: Request) -> Response:
        return Response(bodies.get(("/metrics", b""), lambda: generate_latest(registry)),
                        media_type=CONTENT_TYPE_LATEST)

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            cur = Cursor()
            yield "retry: 2000\n\n"
            while not notifier.closing or not cur.sent_any:  # closing: a page that connects now gets the state
                version, msg = next_message(view, cur)
                yield f"id: {version}\nevent: update\ndata: {json.dumps(msg)}\n\n"
                while not await notifier.wait_beyond(version, KEEPALIVE_S):
                    yield ": keep-alive\n\n"
                if interval > 0 and not notifier.closing:
                    await asyncio.sleep(interval)  # the events of the next interval go out as one update
        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def http_error(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        return JSONResponse({"error": str(detail)}, status_code=code, headers=getattr(exc, "headers", None))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        notifier.start()
        with contextlib.suppress(Exception):  # the web face's own thread budget: static files' reads
            anyio.to_thread.current_default_thread_limiter().total_tokens = WORKER_THREADS
        try:
            yield
        finally:
            notifier.stop()

    app = Starlette(routes=[
        Route("/", index),
        Route("/api/status", api_status),
        Route("/api/rounds", api_rounds),
        Route("/api/links", api_links),
        Route("/api/topology", api_topology),
        Route("/api/missing", api_missing),
        Route("/api/timeline", api_timeline),
        Route("/api/events", events),
        Route("/metrics", metrics),
        Mount("/static", StaticFiles(packages=[("fedhop.server.web", "static")]), name="static"),
    ], middleware=web_middleware(limits, loopback, token, rates), lifespan=lifespan,
        exception_handlers={HTTPException: http_error})
    app.state.notifier = notifier
    app.state.rates = rates  # the Guard's token buckets: the server's protocol screens connections with them
    return app


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
