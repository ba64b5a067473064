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
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from fedhop.server.web.feed import Cursor, next_message
from fedhop.server.web.metrics import make_registry
from fedhop.server.web.status import RunStatus

COOKIE = "fedhop_token"
KEEPALIVE_S = 15.0
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]


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


def create_app(status: RunStatus, *, token: str | None = None, loopback: bool = True) -> Starlette:
    """The ASGI app over ``status``. ``token``: require it on every route. ``loopback``: accept only loopback
    Host headers."""
    registry = make_registry(status)
    notifier = Notifier(status)
    static = resources.files("fedhop.server.web") / "static"
    index_html = (static / "index.html").read_text(encoding="utf-8")

    def since(request: Request) -> int:
        raw = request.query_params.get("since", "0")
        if not raw.isdigit():
            raise ValueError(f"since must be a non-negative integer, got {raw!r}")
        return int(raw)

    async def index(request: Request) -> Response:
        # the run's state as of now, in the page: it shows the run even if its event stream never connects (the
        # PS stops serving as the run ends; a proxy that keeps event streams out)
        snapshot = json.dumps(next_message(status, Cursor())[1]).replace("<", "\\u003c")  # no "</script>" inside
        html = index_html.replace("</body>", f'<script id="snapshot" type="application/json">{snapshot}</script>\n'
                                  "</body>", 1)
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    async def api_status(request: Request) -> Response:
        return JSONResponse(status.status())

    async def api_rounds(request: Request) -> Response:
        try:
            n = since(request)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse({"setup": status.setup_round(), "rounds": status.rounds(n)})

    async def api_links(request: Request) -> Response:
        out = status.links()
        if request.query_params.get("rows") == "1":
            out = {**out, "rows": status.link_rows()}
        return JSONResponse(out)

    async def api_topology(request: Request) -> Response:
        return JSONResponse(status.topology())

    async def api_missing(request: Request) -> Response:
        try:
            n = since(request)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse({"missing": status.missing(n)})

    async def api_timeline(request: Request) -> Response:
        try:
            n = since(request) if "since" in request.query_params else -1
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse(status.timeline(n))

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            cur = Cursor()
            yield "retry: 2000\n\n"
            while not notifier.closing or not cur.sent_any:  # closing: a page that connects now gets the state
                version, msg = next_message(status, cur)
                yield f"id: {version}\nevent: update\ndata: {json.dumps(msg)}\n\n"
                while not await notifier.wait_beyond(version, KEEPALIVE_S):
                    yield ": keep-alive\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        notifier.start()
        try:
            yield
        finally:
            notifier.stop()

    middleware = []
    if loopback:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS))
    if token is not None:
        middleware.append(Middleware(BearerAuth, token=token))
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
    ], middleware=middleware, lifespan=lifespan)
    app.state.notifier = notifier
    return app
