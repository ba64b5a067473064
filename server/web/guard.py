"""What keeps the web face beside training rather than in its way: bounded requests, rates and event streams, and
cached reads of the RunStatus.

- :class:`WebLimits`: the bounds (per-client request rate, URL and body sizes, open event streams, how often a
  status is computed and a stream is updated).
- :class:`Guard`: ASGI middleware that enforces them: 414 for a long URL, 413 for a request body (the API reads
  none), 429 with ``Retry-After`` beyond a client address' token bucket, 503 with ``Retry-After`` beyond the cap
  on open event streams, and a stream whose reader stops reading for ``stream_send_timeout_s`` is ended (dropped,
  never buffered: a stream holds a cursor, not a queue of messages). The server's protocol (serve.py) answers a
  new connection from an address over its rate with the same 429 (:func:`canned_429`) before parsing it.
- :class:`CachedStatus`: the RunStatus reads the API, the feed and ``/metrics`` make, each computed at most every
  ``status_cache_s`` (the status, the link tables, the topology), so a flood of requests costs the run's lock a
  few reads a second instead of one per request.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fedhop.server.web.status import RunStatus

EVENTS_PATH = "/api/events"


@dataclass(frozen=True)
class WebLimits:
    """The web face's bounds. The defaults let a page, a Prometheus scraper and a few scripts through untouched
    and turn a flood away cheaply."""

    rate_per_s: float = 50.0  # requests per second and client address (a token bucket), sustained
    burst: int = 100  # requests one client address may make at once
    max_clients: int = 4096  # client addresses tracked (the least recent are forgotten beyond it)
    max_url_bytes: int = 4096  # path + query string
    max_body_bytes: int = 1024  # every route is a GET: a declared body beyond this is refused
    max_streams: int = 16  # open /api/events streams at once (all clients)
    stream_interval_s: float = 0.25  # a stream sends at most one update per interval (events in between merge)
    stream_send_timeout_s: float = 30.0  # a stream whose reader takes longer than this to accept a write ends
    status_cache_s: float = 0.25  # a status / link table / topology is computed at most this often

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.burst < 1 or self.max_streams < 0 or self.max_clients < 1:
            raise ValueError(f"WebLimits: rates, burst and client counts must be positive: {self}")
        if self.stream_interval_s < self.status_cache_s:
            # a stream woken by an event must find a status at least as new as the event (see CachedStatus)
            raise ValueError("WebLimits: stream_interval_s must be >= status_cache_s")


class RateLimiter:
    """A token bucket per client address: ``burst`` tokens, refilled at ``rate_per_s``. Thread-safe."""

    def __init__(self, rate_per_s: float, burst: int, max_clients: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.max_clients = max_clients
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, when)

    def peek(self, client: str) -> float:
        """0.0 if ``client`` may make a request now, else the seconds until it may; takes no token (the server's
        protocol screens a connection with it before parsing a request, which the Guard then counts)."""
        now = self._clock()
        with self._lock:
            tokens, when = self._buckets.get(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def take(self, client: str) -> float:
        """0.0 if ``client`` may make a request now (a token is taken), else the seconds until it may."""
        now = self._clock()
        with self._lock:
            tokens, when = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - when) * self.rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.rate
            self._buckets[client] = (tokens, now)  # most recent last
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
            return wait


TOO_MANY = "too many requests from this address: slow down"


def _retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def _error(status: int, text: str, retry_after: float | None = None) -> JSONResponse:
    headers = {"Retry-After": _retry_after(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": text}, status_code=status, headers=headers)


def canned_429(retry_after: float) -> bytes:
    """The Guard's 429 as the bytes of a whole HTTP/1.1 response that closes its connection: what the server's
    protocol sends a client address over its rate before parsing the request (serve.py)."""
    body = json.dumps({"error": TOO_MANY}).encode()
    return (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
            b"retry-after: " + _retry_after(retry_after).encode() + b"\r\ncontent-length: " + str(len(body)).encode()
            + b"\r\nconnection: close\r\n\r\n" + body)


class Guard:
    """ASGI middleware enforcing :class:`WebLimits` (see the module's docstring). Runs before authentication, so
    a client guessing tokens is rate-limited too."""

    def __init__(self, app: ASGIApp, limits: WebLimits, clock: Callable[[], float] = time.monotonic,
                 rates: RateLimiter | None = None) -> None:
        self.app = app
        self.limits = limits
        self.rates = rates if rates is not None else RateLimiter(limits.rate_per_s, limits.burst,
                                                                 limits.max_clients, clock)
        self.open_streams = 0  # touched only on the server's event loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lim = self.limits
        client = scope.get("client")
        wait = self.rates.take(str(client[0]) if client else "?")
        if wait > 0:
            await _error(429, TOO_MANY, wait)(scope, receive, send)
            return
        if len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b"")) \
                > lim.max_url_bytes:
            await _error(414, f"the URL is longer than {lim.max_url_bytes} bytes")(scope, receive, send)
            return
        if self._body_too_large(scope):
            await _error(413, f"request bodies are limited to {lim.max_body_bytes} bytes (every route is a "
                         "GET)")(scope, receive, send)
            return
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):  # an app mounted under a prefix (fedhop ui's run pages)
            path = path[len(root):]
        if path != EVENTS_PATH:
            await self.app(scope, receive, send)
            return
        if self.open_streams >= lim.max_streams:
            await _error(503, f"{lim.max_streams} event streams are open already: try again later",
                         lim.stream_interval_s * 4)(scope, receive, send)
            return
        self.open_streams += 1
        try:
            await self.app(scope, receive, self._timed(send))
        except TimeoutError:
            pass  # a reader that stopped reading: its stream ends (the connection is closed by the server)
        finally:
            self.open_streams -= 1

    def _body_too_large(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    return int(value) > self.limits.max_body_bytes
                except ValueError:
                    return True
            if name == b"transfer-encoding":
                return True  # a chunked body of undeclared size
        return False

    def _timed(self, send: Send) -> Send:
        timeout = self.limits.stream_send_timeout_s

        async def timed_send(message: Message) -> None:
            await asyncio.wait_for(send(message), timeout)
        return timed_send


class CachedStatus:
    """A :class:`RunStatus` as the web face reads it: :meth:`status`, :meth:`links` and :meth:`topology` computed
    at most every ``max_age_s`` between two events (the status; links and topology: again only when their change
    counter moved), everything else read through. Results are shared: callers
    must not change them (:meth:`status` returns a shallow copy, which they may)."""

    def __init__(self, status: RunStatus, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.raw = status
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, int, Any]] = {}  # name -> (computed at, version, value)
        self.computed = 0  # how many times a cached read was computed (tests, benchmarks)

    def __getattr__(self, name: str) -> Any:  # rounds, missing, route, versions, counts, ...
        return getattr(self.raw, name)

    def _get(self, name: str, version: int, compute: Callable[[], Any], *, timed: bool = False,
             at_least: int | None = None) -> Any:
        """The cached ``name`` if it is of the current ``version`` (a request after an event sees the event) and,
        when ``timed`` (it changes with the clock too), younger than ``max_age_s``, and of at least version
        ``at_least``; else ``compute()``. A flood of requests between two events computes it once per
        ``max_age_s``."""
        now = self._clock()
        with self._lock:
            hit = self._cache.get(name)
        if hit is not None:
            when, v, value = hit
            fresh_enough = at_least is None or v >= at_least
            if fresh_enough and v == version and (not timed or now - when < self.max_age_s):
                return value
        value = compute()
        with self._lock:
            self.computed += 1
            self._cache[name] = (now, version, value)
        return value

    def status(self) -> dict[str, Any]:
        """The run's status, at most ``max_age_s`` old."""
        return dict(self._get("status", self.raw.version, self.raw.status, timed=True))

    def status_at_least(self, version: int) -> dict[str, Any]:
        """The run's status, at most ``max_age_s`` old and at least as new as ``version`` (for a stream woken
        by that event)."""
        return dict(self._get("status", self.raw.version, self.raw.status, timed=True, at_least=version))

    def links(self) -> dict[str, Any]:
        return self._get("links", self.raw.versions()["links"], self.raw.links)

    def topology(self) -> dict[str, Any]:
        return self._get("topology", self.raw.versions()["nodes"], self.raw.topology)


class ResponseCache:
    """Rendered JSON bodies of the API's GET routes by (path, query string), reused for ``max_age_s``: a flood
    of the same request renders it a few times a second. At most ``size`` entries (the oldest go first)."""

    def __init__(self, max_age_s: float, size: int = 64, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.size = size
        self._clock = clock
        self._bodies: OrderedDict[tuple[str, bytes], tuple[float, bytes, int]] = OrderedDict()

    def get(self, key: tuple[str, bytes], render: Callable[[], bytes], version: int = 0) -> bytes:
        """The body of ``key`` rendered less than ``max_age_s`` ago at the run's ``version`` (its event count),
        else ``render()``."""
        now = self._clock()
        hit = self._bodies.get(key)
        if hit is not None and hit[2] == version and now - hit[0] < self.max_age_s:
            return hit[1]
        body = render()
        self._bodies.pop(key, None)
        self._bodies[key] = (now, body, version)
        while len(self._bodies) > self.size:
            self._bodies.popitem(last=False)
        return body
