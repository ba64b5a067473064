"""Issue 20, over a real (in-process) gRPC server: a process that knows a connected client's id and the run id
cannot take its session over (the hijack that replaced the model on plaintext); the owner keeps it. The same
refusal tells a re-joining child whose old stream still works to stay on it, and one whose old stream ended to
retry until its parent has seen that end."""

from __future__ import annotations

import pytest

from fedhop.common.engine.base import Failure, MissingLog
from fedhop.common.exit_codes import ExitCode
from fedhop.common.spec import TransportSpec
from fedhop.common.topology import build_topology
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.aio_server import make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.child import ChildSession, _StillConnected
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.parent import serve_parent
from fedhop.transport.session import HubConfig, ParentHub
from tests.specs import DIGITS, run_spec
from tests.waiting import wait_until

RUN = "takeover-run"


@pytest.fixture
def parent():
    spec = run_spec("fedavg", {}, clients=2, edges=0, name="takeover", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]})
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig(topo.server, spec, topo, RUN), ByteMeter(), MissingLog())
    server = make_loop_server()
    serve_parent(hub, server)
    addr = f"127.0.0.1:{add_port(server, '127.0.0.1:0')}"
    server.start()
    sessions: list[ChildSession] = []

    def session(node: str) -> ChildSession:
        s = ChildSession(NodeConfig(node, addr, connect_timeout_s=10), "client")
        sessions.append(s)
        return s

    try:
        yield hub, session
    finally:
        for s in sessions:
            s.close()
        hub.shutdown(0.0, finished=True)
        server.stop(0)


def test_a_hello_with_the_run_id_does_not_take_over_a_connected_client(parent) -> None:
    hub, session = parent
    owner = session("client-0")
    owner.connect()
    owner.send_ready({"client-0": 5})
    wait_until(lambda: hub.data_sizes() == {"client-0": 5}, "client-0 to be ready", timeout=30)
    thief = session("client-0")
    thief.run_id = RUN  # what a refusal used to reveal, and what let a second Hello skip the duplicate check
    with pytest.raises(_StillConnected, match="duplicate Hello: client-0 is already connected"):
        thief._open(rejoin=True)
    assert thief.welcome is None  # no RunSpec, no model
    hub.start()
    call = hub.call("client-0", "fedavg.train", {}, {}, 0, 30.0)
    assert not isinstance(call, Failure)
    assert hub.roster.links["client-0"].alive and not hub.roster.links["client-0"].superseded


def test_a_rejoining_child_stays_on_a_stream_that_works_and_retries_one_that_ended(parent) -> None:
    hub, session = parent
    child = session("client-1")
    child.connect()
    child.transport = TransportSpec(reconnect_s=1.0)
    stream = child._stream
    assert child._rejoin(old_ended=False) is None  # the parent was only slow: the old stream stays
    assert child._stream is stream and hub.roster.links["client-1"].alive
    # the child saw its stream end, the parent has not: the child retries, and gives up after reconnect_s
    assert child._rejoin(old_ended=True) == ExitCode.PARENT_LOST
    assert child._stream is stream
