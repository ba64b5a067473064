"""``fedhop testbed up --http HOST:PORT``: the PS's web face (live page, JSON API, /metrics), reachable from the
host although the PS lives in its own network namespace.

The PS serves it inside its namespace (``fedhop server --http``) on :data:`INNER_PORT`: on 127.0.0.1 when HOST
is loopback, else on its testbed address with the bearer token. ``testbed up`` binds HOST:PORT in the host's
namespace itself (so a taken port or a missing token fails before anything is created) and hands that
listening socket to a forwarder (``deploy/delay_proxy.py`` without delays) started inside the PS's namespace:
a socket keeps the namespace it was made in, so the forwarder accepts on the host's side and dials the PS on
its own. The forwarder's bytes go over the namespace's loopback or its own address, never a testbed link, so
they are not in the wire counters.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from fedhop.deploy.netns import TestbedError

INNER_PORT = 8080


@dataclass
class HttpForward:
    """The host side of ``--http``: the bound socket, the URL, and what the PS is told to serve on."""

    sock: socket.socket
    host: str
    port: int
    token: str | None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def inner_address(self, ps_address: str) -> str:
        """The PS's ``--http``: loopback in its namespace, or its testbed address when a token guards it."""
        from fedhop.server.web.serve import is_loopback

        return f"127.0.0.1:{INNER_PORT}" if is_loopback(self.host) else f"{ps_address}:{INNER_PORT}"

    def close(self) -> None:
        self.sock.close()


def bind(address: str, token: str | None) -> HttpForward:
    """Check ``--http`` / ``--http-token`` like ``fedhop server`` does and bind HOST:PORT (port 0: a free one)."""
    from fedhop.server.web.serve import HttpConfigError, check_token, parse_address

    try:
        host, port = parse_address(address)
        check_token(host, token)
    except HttpConfigError as e:
        raise TestbedError(str(e)) from None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise TestbedError(f"--http {address}: cannot listen there: {e.strerror}") from None
    sock.listen(64)
    return HttpForward(sock=sock, host=host, port=int(sock.getsockname()[1]), token=token)
