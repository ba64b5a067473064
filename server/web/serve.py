"""Serve the web face with uvicorn in a background thread: of the web face's own process (server/web/proc.py,
a run's ``--http``), or of the calling process (:func:`start_http`: tests, benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from fedhop.server.web.app import create_app
from fedhop.server.web.guard import RateLimiter, canned_429
from fedhop.server.web.status import RunStatus

log = logging.getLogger("fedhop.http")

MIN_TOKEN_CHARS = 16
START_TIMEOUT_S = 10.0
NICE = 10  # the server thread's scheduling priority below the run's (Linux: per thread)
MAX_CONNECTIONS = 256  # open connections and requests at once beyond which uvicorn answers 503


class _Quiet(logging.Filter):
    """Drops uvicorn's line per connection refused beyond MAX_CONNECTIONS: a flood must not flood the log too."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Exceeded concurrency limit")


logging.getLogger("uvicorn.error").addFilter(_Quiet())


def page_url(host: str, port: int) -> str:
    """The page's URL on ``host:port`` (a wildcard host: this machine's name)."""
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = socket.gethostname()
    return f"http://{shown}:{port}/"


class HttpConfigError(ValueError):
    """An --http / --http-token setting that cannot be served (names the setting and why)."""


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6; port 0 = a free port) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise HttpConfigError(f"--http wants HOST:PORT (e.g. 127.0.0.1:8080, or 127.0.0.1:0 for a free port), "
                              f"got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise HttpConfigError(f"--http {text}: the port must be a number from 0 to 65535, got {port!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_token(host: str, token: str | None) -> None:
    """A server bound beyond loopback needs a bearer token; a token must be long enough to be one."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise HttpConfigError(f"--http-token must be at least {MIN_TOKEN_CHARS} characters "
                              f"(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe())')")
    if token is None and not is_loopback(host):
        raise HttpConfigError(f"--http {host}: the live page and API would be reachable beyond this machine, so "
                              f"a bearer token is required: add --http-token TOKEN (or set FEDHOP_HTTP_TOKEN), "
                              f"or bind to 127.0.0.1")


class ScreeningH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol that screens a new connection's client address before parsing its first
    request: an address over its rate (the Guard's token bucket, ``rates``, is empty) gets the Guard's 429 as
    canned bytes and the connection closes, without h11 parsing or the app's middleware. A flood's refusals,
    most of its requests, then cost the server thread little beyond the accept. The Guard still counts and
    bounds every request that passes (and those after the first on a kept-alive connection)."""

    rates: RateLimiter | None = None  # set on the subclass that start_http makes for its app

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._screened = self.rates is None

    def data_received(self, data: bytes) -> None:
        if not self._screened:
            self._screened = True
            assert self.rates is not None
            wait = self.rates.peek(str(self.client[0]) if self.client else "?")
            if wait > 0:
                self.transport.write(canned_429(wait))
                self.transport.close()  # after the write buffer is flushed; the request's bytes were read
                return
        super().data_received(data)


@dataclass
class HttpServer:
    """A running web face: its address and how to stop it."""

    host: str
    port: int
    token: str | None
    _server: uvicorn.Server
    _thread: threading.Thread
    _app: object

    @property
    def url(self) -> str:
        return page_url(self.host, self.port)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the live streams, stop serving and join the thread."""
        self._app.state.notifier.close()  # type: ignore[attr-defined]
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout_s)


def start_http(status: RunStatus, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> HttpServer:
    """Serve ``status`` on ``host:port`` (0 = a free port) in a daemon thread of this process; returns once it
    answers. (A run's ``--http`` serves from its own process instead: server/web/proc.py, the same app.)

    Raises :class:`HttpConfigError` for a non-loopback host without a token, and ``OSError`` (with the
    address in the message) when the address cannot be bound."""
    check_token(host, token)
    return serve_socket(status, bind_socket(host, port), host, token)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0 = a free port); ``OSError`` naming the address if it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot serve the live page on {host}:{port}: {e.strerror}") from None
    sock.listen(128)
    return sock


def serve_socket(status: RunStatus, sock: socket.socket, host: str, token: str | None) -> HttpServer:
    """Serve ``status`` on the listening ``sock`` (bound to ``host``; :func:`bind_socket`) in a daemon thread;
    returns once it answers. The caller has checked the token (:func:`check_token`)."""
    sock.setblocking(False)
    actual = int(sock.getsockname()[1])
    app = create_app(status, token=token, loopback=is_loopback(host))
    # one thread (an asyncio loop) serves every request, below the run's priority, with bounded connections
    # (guard.py bounds rates, sizes and streams; the run's lock is taken a few times a second, not per request)
    protocol = type("ScreeningH11ForApp", (ScreeningH11,), {"rates": app.state.rates})
    config = uvicorn.Config(app, host=host, port=actual, loop="asyncio", http=protocol, ws="none", lifespan="on",
                            log_config=None, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                            limit_concurrency=MAX_CONNECTIONS, backlog=128, h11_max_incomplete_event_size=16384)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=_serve, args=(server, sock), name="fedhop-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the live page's server on {host}:{actual} did not start (see the log)")
        thread.join(0.01)
    log.info("live page on %s:%d", host, actual)
    return HttpServer(host, actual, token, server, thread, app)


def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
    """The server thread: lower its priority (best effort: Linux sets it per thread), then serve."""
    if hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    server.run(sockets=[sock])


def stop_http(handle: HttpServer | None) -> None:
    if handle is not None:
        handle.stop()
