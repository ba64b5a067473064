"""Issue 19: the PS's threads do not grow with its children. A synchronous gRPC server held a worker thread per
open stream and the retired synchronous ``Parent.Session`` a reader thread more (a PS with 1,000 clients ran 2,015
threads); a parent's server (``transport/aio_server.py``) serves every session from one event loop and a fixed
pool. Counted by thread names, never timed."""

from __future__ import annotations

import threading

import pytest

from fedhop.common.engine.base import MissingLog
from fedhop.common.topology import build_topology
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.aio_server import SESSION_WORKERS, SYNC_WORKERS, make_loop_server
from fedhop.transport.channels import add_port, make_server
from fedhop.transport.parent import serve_parent
from fedhop.transport.session import HubConfig, ParentHub
from tests.net.hubs import HelloStreams
from tests.specs import DIGITS, run_spec
from tests.waiting import wait_until

SESSIONS = 3 * (SESSION_WORKERS + SYNC_WORKERS) // 2  # more sessions than the loop server has threads


def _server_threads() -> list[str]:
    """The threads a parent's gRPC server runs: pool workers ("grpc_N", "session_N") and session readers."""
    return [t.name for t in threading.enumerate() if t.name.startswith(("grpc_", "session_", "session-", "grpc-aio"))]


def test_a_parents_threads_do_not_grow_with_its_sessions() -> None:
    spec = run_spec("fedavg", {}, clients=SESSIONS, edges=0, name="many", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]})
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig(topo.server, spec, topo, "many-run"), ByteMeter(), MissingLog())
    before = _server_threads()
    server = make_loop_server()
    serve_parent(hub, server)
    addr = f"127.0.0.1:{add_port(server, '127.0.0.1:0')}"
    server.start()
    streams = HelloStreams(addr)
    welcomes = []
    try:
        for node in topo.clients:  # each says Hello and keeps its stream open
            streams.open(node)
        for call in streams.calls:
            welcomes.append(next(call).WhichOneof("body"))
        assert welcomes == ["welcome"] * SESSIONS
        wait_until(lambda: len(hub.roster.alive()) == SESSIONS, "every session to be open")
        now = _server_threads()  # (counted, not named: names repeat, and other tests' servers may still run)
        grown = len(now) - len(before)
        assert grown <= SESSION_WORKERS + SYNC_WORKERS + 1, now
        readers = sum(n.startswith("session-") for n in now) - sum(n.startswith("session-") for n in before)
        assert readers <= 0  # no reader thread per session
    finally:
        streams.close()
        hub.shutdown(0.0, finished=True)
        server.stop(0)


def test_serve_parent_refuses_a_plain_grpc_server() -> None:
    """The synchronous servicer is retired: a plain ``grpc.Server`` is a clear TypeError, nothing registered."""
    spec = run_spec("fedavg", {}, clients=1, edges=0, name="plain", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]})
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig(topo.server, spec, topo, "plain-run"), ByteMeter(), MissingLog())
    server = make_server(2)
    try:
        with pytest.raises(TypeError, match="serve_parent needs a LoopServer .* not _Server"):
            serve_parent(hub, server)  # type: ignore[arg-type]
    finally:
        server.stop(None)
        hub.shutdown(0.0, finished=True)
