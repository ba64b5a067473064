"""Address checks made before a role starts, so that a bad address fails in seconds with one clear line.

- :func:`check_listen`: the HOST:PORT a PS or edge is to serve on is free (a plain bind, without
  SO_REUSEPORT, so a port held by any listener, gRPC servers included, is reported).
- :func:`wait_for_parent`: the parent accepts TCP connections (retrying, each retry said), answers as a gRPC
  server, and serves ``fedhop.v1.Parent``; otherwise :class:`~fedhop.common.exit_codes.Fatal` with ``UNREACHABLE``.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable

from fedhop.common.exit_codes import ExitCode, Fatal
from fedhop.common.testhooks import mark
from fedhop.transport.credentials import PLAINTEXT, Security

SESSION_METHOD = "/fedhop.v1.Parent/Session"


def parse_address(addr: str, what: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); a clear USAGE error otherwise."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise Fatal(ExitCode.USAGE, f"{what} {addr!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def check_listen(addr: str) -> None:
    """Raise ``ADDRESS_IN_USE`` when ``addr`` cannot be bound now (port 0, any free port, always passes)."""
    host, port = parse_address(addr, "--listen")
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise Fatal(ExitCode.ADDRESS_IN_USE, f"cannot listen on {addr}: unknown host {host!r} ({e})") from None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free for gRPC too
        try:
            s.bind(sockaddr)
        except OSError as e:
            why = {errno.EADDRINUSE: f"port {port} is already in use by another process",
                   errno.EADDRNOTAVAIL: f"{host} is not an address of this machine",
                   errno.EACCES: f"no permission to bind port {port}"}.get(e.errno, e.strerror)
            raise Fatal(ExitCode.ADDRESS_IN_USE, f"cannot listen on {addr}: {why}") from None


def _tcp_error(host: str, port: int, timeout_s: float) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return "connection refused (nothing listens there yet?)"
    except TimeoutError:
        return f"no answer within {timeout_s:.0f}s"
    except OSError as e:
        return e.strerror or str(e)


def _fedhop_error(addr: str, timeout_s: float, security: Security = PLAINTEXT) -> str | None:
    """None when ``addr`` serves ``fedhop.v1.Parent``; otherwise what answers there instead.

    The probe opens a Session and closes it at once without a Hello: a fedhop parent ends such a session
    silently, a gRPC server without the service answers UNIMPLEMENTED, and a non-gRPC server never
    completes the HTTP/2 handshake."""
    import grpc

    from fedhop.transport.channels import make_channel

    with make_channel(addr, security=security) as ch:
        try:
            grpc.channel_ready_future(ch).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            if not security.plaintext:
                return (f"no TLS handshake within {timeout_s:.0f}s: the parent refused this node's certificate "
                        f"(another CA, expired), or its own is not trusted here or does not name {addr}, or it "
                        f"does not speak TLS ({security.describe()})")
            return f"it accepts TCP connections but does not speak gRPC within {timeout_s:.0f}s (not a fedhop node)"
        rpc = ch.stream_stream(SESSION_METHOD, request_serializer=bytes, response_deserializer=bytes)
        try:
            for _ in rpc(iter(()), timeout=timeout_s):
                pass
        except grpc.RpcError as e:  # only UNIMPLEMENTED says the service is not there; any other ending of an
            #                         empty session (a parent that wants a Hello first) means it is
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return "it is a gRPC server without the fedhop.v1.Parent service (not a fedhop PS or edge)"
    return None


def wait_for_parent(addr: str, timeout_s: float, say: Callable[[str], None],
                    security: Security = PLAINTEXT) -> None:
    """Return once ``addr`` is a reachable fedhop parent; retry refused connections until ``timeout_s``,
    saying each retry; raise ``UNREACHABLE`` with the last reason."""
    host, port = parse_address(addr, "--connect")
    end = time.monotonic() + timeout_s
    delay, attempt = 0.5, 0
    while True:
        attempt += 1
        left = end - time.monotonic()
        why = _tcp_error(host, port, max(0.5, min(3.0, left)))
        if why is None:
            bad = _fedhop_error(addr, max(1.0, min(5.0, left)), security)
            if bad is None:
                return
            raise Fatal(ExitCode.NOT_FEDHOP, f"parent {addr}: {bad}")
        left = end - time.monotonic()
        if left <= 0:
            raise Fatal(ExitCode.UNREACHABLE, f"parent {addr} unreachable after {attempt} attempts in "
                                              f"{timeout_s:g}s: {why}")
        wait = min(delay, left)
        say(f"parent {addr}: {why}; retry {attempt} in {wait:.1f}s ({left:.0f}s left of --connect-timeout)")
        mark("waiting-for-parent")  # a test hook (common/testhooks.py): the tests await this state
        time.sleep(wait)  # back-off between connection attempts
        delay = min(2 * delay, 5.0)
