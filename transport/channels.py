"""The one place that makes gRPC servers and channels: options, message limits, keep-alive, credentials.

``security`` (a :class:`~fedhop.transport.credentials.Security`) says how: a plaintext one (``.plaintext``, e.g.
:data:`~fedhop.transport.credentials.PLAINTEXT`, the default) means plaintext, and this module holds the only
``add_insecure_port`` and ``insecure_channel`` calls of the code base; otherwise mutual TLS or tokens over TLS
(``transport/credentials.py``).
"""

from __future__ import annotations

import errno
import logging
import socket
from concurrent import futures
from typing import Any

import grpc

from fedhop.common.wire.framing import MAX_MESSAGE
from fedhop.transport.credentials import (
    PLAINTEXT,
    Security,
    channel_credentials,
    channel_options,
    server_credentials,
    server_interceptors,
)
from fedhop.transport.lane import note_listen_address

MESSAGE_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]
# What each stream may send a parent before the parent reads it (its HTTP/2 receive window), fixed instead of
# gRPC's auto-tuning, which grows it to 4 MiB or more per stream. A folding scatter leaves early replies
# waiting in their senders (transport/reply_gate.py), and a waiting stream still fills its window in the
# parent: with auto-tuning that was 0.4-1.9 models of gRPC buffers in the PS of the 25M-parameter FedAvg job
# (docs/benchmarks.md, issue 11). The cost: at most one window per round trip per stream towards a parent
# (1 MiB: 1 GB/s at 1 ms, 100 MB/s at 10 ms).
RECEIVE_WINDOW_BYTES = 1 << 20
SERVER_OPTIONS = [
    *MESSAGE_OPTIONS,
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", RECEIVE_WINDOW_BYTES),
]
# HTTP/2 pings find a half-open TCP connection (a peer host that vanished); a parent that is alive but
# stalled is found by the session's own keep-alive frames (transport.keepalive_timeout_s).
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
log = logging.getLogger("fedhop.channels")
HANDSHAKE_TIMEOUT_S = 5.0  # a listener that does not finish a gRPC handshake in this time is not a fedhop node


def server_settings(security: Security = PLAINTEXT, handshake_timeout_s: float | None = None,
                    ) -> tuple[list[tuple[str, Any]], list[grpc.ServerInterceptor]]:
    """A fedhop server's channel options (``handshake_timeout_s``: default transport.handshake_timeout_s's
    default) and, unless plaintext, the interceptors that refuse calls without good credentials (logged);
    shared by the threaded server here and the asyncio one (transport/aio_server.py)."""
    if handshake_timeout_s is None:
        from fedhop.common.spec import TransportSpec

        handshake_timeout_s = TransportSpec().handshake_timeout_s
    options = [*SERVER_OPTIONS, ("grpc.server_handshake_timeout_ms", max(1, int(handshake_timeout_s * 1000)))]
    interceptors: list[grpc.ServerInterceptor] = []
    if not security.plaintext:
        def refused(method: str, why: str) -> None:
            log.warning("%s: refused a call to %s: %s", security.node_id, method, why)

        interceptors = server_interceptors(security, refused)
    return options, interceptors


def make_server(max_workers: int, security: Security = PLAINTEXT,
                handshake_timeout_s: float | None = None) -> grpc.Server:
    """A gRPC server with fedhop's options (add services, then :func:`add_port`, then ``start()``); in token
    mode with the interceptor that refuses calls without a good token before any handler runs.
    ``handshake_timeout_s`` (default: transport.handshake_timeout_s's default): a connection that has not
    finished its TLS and HTTP/2 handshakes this long after it opened is closed (it holds no worker thread)."""
    options, interceptors = server_settings(security, handshake_timeout_s)
    return grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                       options=options, interceptors=interceptors)


def add_port(server: grpc.Server, listen: str, security: Security = PLAINTEXT) -> int:
    """Bind ``listen`` (HOST:PORT) in plaintext or with ``security``'s TLS credentials; returns the port, 0
    when it cannot be bound. The process's bulk lanes (transport/lane.py) listen on the same host."""
    note_listen_address(listen)
    if security.plaintext:
        return server.add_insecure_port(listen)
    return server.add_secure_port(listen, server_credentials(security))


def _client_options(keepalive: bool, own_connection: bool) -> list[tuple[str, Any]]:
    return [*MESSAGE_OPTIONS, *(KEEPALIVE_OPTIONS if keepalive else []),
            *([("grpc.use_local_subchannel_pool", 1)] if own_connection else [])]


def make_channel(address: str, *, security: Security = PLAINTEXT, keepalive: bool = False,
                 peer_id: str | None = None, own_connection: bool = False) -> grpc.Channel:
    """A channel to a fedhop node; ``keepalive``: HTTP/2 pings (long-lived session streams); ``peer_id``
    (with TLS): the server must present that node's certificate; ``own_connection``: a TCP connection of its
    own, never shared with this process's other channels to the same address (a client host's sessions: each
    id's link is as independent as a process's, and ~900 session streams on one shared connection stall)."""
    options = _client_options(keepalive, own_connection)
    if security.plaintext:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, channel_credentials(security),
                               options=[*options, *channel_options(security, peer_id)])


def make_aio_channel(address: str, *, security: Security = PLAINTEXT, keepalive: bool = False,
                     own_connection: bool = False) -> grpc.aio.Channel:
    """:func:`make_channel` for asyncio (``grpc.aio``; created on the loop that uses it): a client host's sessions
    (transport/aio_child.py), all on one event loop."""
    options = _client_options(keepalive, own_connection)
    if security.plaintext:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, channel_credentials(security),
                                   options=[*options, *channel_options(security, None)])


def listening(address: str, timeout_s: float = 2.0) -> bool | None:
    """Whether something accepts TCP connections at ``address``: True; False when the connection is refused
    (nothing listens yet); None when the answer is unknown (unreachable host, timeout, bad name)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except ConnectionRefusedError:
        return False
    except OSError as e:
        return False if e.errno == errno.ECONNREFUSED else None
    except ValueError:
        return None
