"""Issue 20: 200 streams that never say Hello, opened against a running PS's session service (an in-process
``LoopServer``, as the PS and the edges run it), must not hold up a Hello that comes mid-run: the sessions that
have not said Hello are few at a time (the oldest are closed when more come; on the retired synchronous server
each held a worker while it lasted), and the late joiner is welcomed within seconds, not after the handshake
timeouts."""

from __future__ import annotations

import queue
import time

import grpc

from fedhop.common.engine.base import MissingLog
from fedhop.common.topology import build_topology
from fedhop.common.wire.framing import parse_frame_lenient, serialize_frame
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.aio_server import make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.child import ChildSession
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.parent import serve_parent
from fedhop.transport.session import HubConfig, ParentHub
from fedhop.transport.session.liveness import CROWD
from tests.specs import DIGITS, run_spec
from tests.waiting import wait_until

IDLE = 200


def _silence(q: queue.Queue):
    while (item := q.get()) is not None:
        yield item


def test_idle_streams_do_not_hold_up_a_mid_run_hello() -> None:
    spec = run_spec("fedavg", {}, clients=2, edges=0, name="idle", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]}, transport={"handshake_timeout_s": 10.0})
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig(topo.server, spec, topo, "idle-run"), ByteMeter(), MissingLog())
    # as the PS and the edges make it (server/main.py, edge/node.py: asyncio, no thread per session)
    server = make_loop_server(handshake_timeout_s=10.0)
    serve_parent(hub, server)
    addr = f"127.0.0.1:{add_port(server, '127.0.0.1:0')}"
    server.start()
    first = ChildSession(NodeConfig("client-0", addr, connect_timeout_s=10), "client")
    late = ChildSession(NodeConfig("client-1", addr, connect_timeout_s=10), "client")
    channels = [grpc.insecure_channel(addr) for _ in range(4)]
    quiet: queue.Queue = queue.Queue()
    calls = []
    try:
        first.connect()
        first.send_ready({"client-0": 5})
        wait_until(lambda: hub.data_sizes() == {"client-0": 5}, "client-0 to be ready", timeout=30)
        hub.start()  # the run is under way
        for k in range(IDLE):  # sessions that never say Hello
            call = channels[k % 4].stream_stream("/fedhop.v1.Parent/Session", request_serializer=serialize_frame,
                                                 response_deserializer=parse_frame_lenient)(_silence(quiet))
            calls.append(call)
        wait_until(lambda: len(hub.liveness.waits) >= CROWD, "the idle streams to hold the spare workers", timeout=30)
        began = time.monotonic()
        welcome = late.connect()
        took = time.monotonic() - began
        assert welcome.node_id == "client-1"
        assert took < 8.0, f"a mid-run Hello waited {took:.1f}s behind {IDLE} idle streams"
    finally:
        for c in calls:
            c.cancel()
        for ch in channels:
            ch.close()
        first.close()
        late.close()
        hub.shutdown(0.0, finished=True)
        server.stop(0)
