"""The standard gRPC health-checking protocol (``grpc.health.v1``) for every role, via ``grpcio-health-checking``.

- :func:`add_health` puts the health service on a role's existing ``grpc.Server`` (the PS's, an edge's) and
  returns a :class:`Health` handle through which the role marks itself SERVING or NOT_SERVING.
- :func:`serve_health` starts a small health-only server, for a client, which otherwise listens on nothing
  (``fedhop client --health ADDR``), so that container orchestrators can check clients too.
- :func:`probe` asks an address once (``fedhop health ADDRESS``); :func:`wait_until_gone` blocks until a
  server stops serving (a child that must outlive its own run until its parent has finished).

The overall status (service name ``""``) is what ``fedhop health`` and the compose healthchecks probe;
:data:`SERVICE` names fedhop's own entry, kept in step with it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedhop.transport.credentials import PLAINTEXT, Security, open_channel

SERVICE = "fedhop.v1"
_Status = health_pb2.HealthCheckResponse.ServingStatus


class Probe(enum.IntEnum):
    """What a probe found; the values are ``fedhop health``'s exit codes."""

    SERVING = 0
    NOT_SERVING = 1
    UNREACHABLE = 2


@dataclass(frozen=True)
class ProbeResult:
    outcome: Probe
    detail: str


class Health:
    """The health service of one gRPC server; flips the overall and fedhop's status together."""

    def __init__(self, servicer: health.HealthServicer) -> None:
        self._servicer = servicer

    def serving(self) -> None:
        self._set(_Status.SERVING)

    def not_serving(self) -> None:
        self._set(_Status.NOT_SERVING)

    def _set(self, status: Any) -> None:
        for name in ("", SERVICE):
            self._servicer.set(name, status)


def add_health(server: grpc.Server, *, serving: bool = True) -> Health:
    """Serve ``grpc.health.v1.Health`` on ``server`` (before ``server.start()``); SERVING unless ``serving``
    is false. A role that is up but cannot take work calls ``not_serving()`` on the returned handle."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    h = Health(servicer)
    h.serving() if serving else h.not_serving()
    return h


class HealthServer:
    """A health-only gRPC server on its own address (started by :func:`serve_health`)."""

    def __init__(self, server: grpc.Server, health_: Health, port: int) -> None:
        self.server = server
        self.health = health_
        self.port = port

    def stop(self, grace_s: float = 0.5) -> None:
        self.health.not_serving()
        self.server.stop(grace_s).wait(grace_s + 1.0)


def serve_health(address: str) -> HealthServer:
    """Start a health-only server on ``address`` (``HOST:PORT``; port 0 picks one), SERVING."""
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"))
    h = add_health(server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as e:  # grpcio >= 1.5x raises where older versions returned 0
        raise OSError(f"cannot listen on {address} for health checks: {e}") from e
    if port == 0:
        raise OSError(f"cannot listen on {address} for health checks")
    server.start()
    return HealthServer(server, h, port)


def _channel(address: str, security: Security) -> grpc.Channel:
    """Plaintext, or with ``security``'s credentials (a :class:`~fedhop.transport.credentials.Security`: mutual
    TLS presents its node's certificate, token mode its node's token over TLS). Not transport.channels: that
    imports the tensor codec (torch), seconds a healthcheck cannot spare."""
    if security.plaintext:
        return grpc.insecure_channel(address)
    return open_channel(address, security)


def probe(address: str, timeout_s: float = 3.0, service: str = "", security: Security = PLAINTEXT) -> ProbeResult:
    """Ask ``address`` once for its health (waiting up to ``timeout_s`` for the connection); ``security``: how
    to reach a node whose links are TLS or tokens (default: plaintext)."""
    with _channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s,
                               wait_for_ready=True)
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.NOT_FOUND:
                return ProbeResult(Probe.NOT_SERVING, f"{address} does not know the service {service!r}")
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return ProbeResult(Probe.NOT_SERVING, f"{address} serves no grpc.health.v1 service")
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return ProbeResult(Probe.UNREACHABLE, f"{address} refused the probe's credentials ({e.details()})")
            reason = "no answer" if code == grpc.StatusCode.DEADLINE_EXCEEDED else code.name
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and security.plaintext:
                reason += "; if its links are TLS or tokens, give --tls DIR (and --token FILE) with --id"
            return ProbeResult(Probe.UNREACHABLE, f"{address} unreachable within {timeout_s:g}s ({reason})")
    name = _Status.Name(reply.status)
    if reply.status == _Status.SERVING:
        return ProbeResult(Probe.SERVING, f"{address}: {name}")
    return ProbeResult(Probe.NOT_SERVING, f"{address}: {name}")


def wait_until_gone(address: str, timeout_s: float, security: Security = PLAINTEXT) -> bool:
    """Block until the server at ``address`` stops serving (its process ended, or it said NOT_SERVING);
    True when it did within ``timeout_s``, False on timeout. Uses the ``Watch`` stream, so it wakes on the
    event itself, not on a poll."""
    with _channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            for reply in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s):
                if reply.status != _Status.SERVING:
                    return True
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                return True
    # the deadline: gone all the same if nothing answers now (a server that stopped while the stream was being set
    # up can leave it hanging until the deadline instead of ending it)
    return probe(address, 0.5, security=security).outcome != Probe.SERVING
