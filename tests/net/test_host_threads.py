"""Issue 19: a client host's threads do not grow with its ids. A host ran each id on a thread of its own with a
session thread, a stream reader, gRPC's request consumer and a task worker (10,000 ids: 50,000 threads, past this
machine's pid_max); now its ids' sessions share one asyncio loop and a fixed set of workers. A real PS (the
asyncio server) and a real host of many ids over loopback; threads counted, never timed."""

from __future__ import annotations

import threading
from typing import Any

from fedhop.client.host import JOIN_WORKERS, TASK_WORKERS, run_clients
from fedhop.common.engine.base import MissingLog
from fedhop.common.exit_codes import ExitCode
from fedhop.common.topology import build_topology
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.aio_server import make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.parent import serve_parent
from fedhop.transport.session import HubConfig, ParentHub
from tests.specs import DIGITS, run_spec
from tests.waiting import wait_until

IDS = 48  # far more ids than the host has workers
PS_THREADS = ("session_", "grpc_", "grpc-aio", "handshake-timers")  # the PS's (transport/aio_server.py, liveness.py)


def test_a_hosts_threads_do_not_grow_with_its_ids() -> None:
    spec = run_spec("fedavg", {}, clients=IDS, edges=0, name="host-threads", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]})
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig(topo.server, spec, topo, "host-threads-run"), ByteMeter(), MissingLog())
    server = make_loop_server()
    serve_parent(hub, server)
    addr = f"127.0.0.1:{add_port(server, '127.0.0.1:0')}"
    server.start()
    before = {t.ident for t in threading.enumerate()}
    outcome: list[int] = []
    host = threading.Thread(target=lambda: outcome.append(run_clients(list(topo.clients),
                                                                      NodeConfig("host", addr, connect_timeout_s=30))),
                            name="the-host", daemon=True)
    try:
        host.start()
        wait_until(lambda: len(hub.data_sizes()) == IDS, "every id of the host to be Ready", timeout=60)
        # the host's threads: those started since, less the PS's (its server's pools and loop, its timers)
        new = [t.name for t in threading.enumerate() if t.ident not in before]
        host_threads = [n for n in new if not n.startswith(PS_THREADS) and not n.endswith("-keepalive")]
        # the host's own thread (running its loop), its join and task workers (named after the id they work for
        # meanwhile), and what gRPC's asyncio part may start once per process: a few, whatever the number of ids
        # (a thread per id ran 4-5 each: 220 here)
        assert len(host_threads) <= 1 + JOIN_WORKERS + TASK_WORKERS + 4, host_threads
        assert not any(n.startswith("parent-stream-") for n in new), new
        assert set(hub.data_sizes()) == set(topo.clients)
    finally:
        hub.shutdown(10.0, finished=True)  # a Bye to every id: the host ends cleanly
        host.join(30)
        server.stop(0)
    assert outcome == [ExitCode.OK]


def test_a_hosts_ids_rejoin_a_parent_that_came_back() -> None:
    # the re-join path of the asyncio sessions: every id's stream ends with the parent's server, each dials again
    # (ChildSession._rejoin on the host's join workers) and re-joins the same run, Ready again, at the new server
    ids = 6
    spec = run_spec("fedavg", {}, clients=ids, edges=0, name="host-rejoin", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]})
    topo = build_topology(spec.topology, spec.seed)

    def parent(listen: str) -> tuple[ParentHub, Any, int]:
        hub = ParentHub(HubConfig(topo.server, spec, topo, "host-rejoin-run"), ByteMeter(), MissingLog())
        server = make_loop_server()
        serve_parent(hub, server)
        port = add_port(server, listen)
        server.start()
        return hub, server, port

    hub, server, port = parent("127.0.0.1:0")
    outcome: list[int] = []
    host = threading.Thread(target=lambda: outcome.append(run_clients(
        list(topo.clients), NodeConfig("host", f"127.0.0.1:{port}", connect_timeout_s=30))), daemon=True)
    host.start()
    again = None
    try:
        wait_until(lambda: len(hub.data_sizes()) == ids, "every id of the host to be Ready", timeout=60)
        server.stop(0)  # every session's stream ends
        hub.liveness.stop()
        again, server, _ = parent(f"127.0.0.1:{port}")
        wait_until(lambda: len(again.data_sizes()) == ids, "every id to re-join the parent", timeout=60)
        assert set(again.data_sizes()) == set(topo.clients)
    finally:
        (again or hub).shutdown(10.0, finished=True)
        host.join(30)
        server.stop(0)
    assert outcome == [ExitCode.OK]
