"""Issue 19: an edge serves its children, its neighbours and health on one asyncio server
(``edge/node.py`` ``edge_server``), so its threads do not grow with its children; a synchronous server held two
threads per child session (and a third while an early Hello waited for the edge's run): at most ~1,000 children
per edge. Real gRPC on loopback; threads counted, never timed. The Edge service's refusals keep their codes and
words on that server (mutual TLS: who calls is its certificate)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.engine.api import NodeContext, Reply
from fedhop.common.engine.base import HandOffError, MissingLog
from fedhop.common.engine.workspace import Workspace
from fedhop.common.topology import build_topology
from fedhop.common.wire.bundle import clone
from fedhop.common.wire.framing import bundle_frames
from fedhop.common.wire.messages import result_frame
from fedhop.common.wire.meter import ByteMeter
from fedhop.edge.node import EdgeServer, edge_server
from fedhop.transport.aio_server import SESSION_WORKERS, SYNC_WORKERS
from fedhop.transport.certs import init_folder
from fedhop.transport.child import ChildSession
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.netcomm import NetComm
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.peer import PeerClient
from fedhop.transport.session import HubConfig, ParentHub
from tests.net.hubs import HelloStreams, next_task
from tests.specs import DIGITS, run_spec
from tests.waiting import wait_until

CHILDREN = 48  # more children than the edge's server has session workers
SERVER_THREADS = ("grpc_", "session_", "session-", "grpc-aio", "lane_")  # a parent server's pools, loop, readers


def _server_threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name.startswith(SERVER_THREADS) and t.ident is not None}


def test_an_edges_threads_do_not_grow_with_its_children() -> None:
    spec = run_spec("fedavg", {}, clients=CHILDREN, edges=1, name="edge-threads", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]})
    topo = build_topology(spec.topology, spec.seed)
    edge = topo.edges[0]
    children = list(topo.cluster(edge))
    assert len(children) == CHILDREN
    before = _server_threads()
    served = edge_server(edge, "127.0.0.1:0", PLAINTEXT)
    assert served.port
    streams = HelloStreams(f"127.0.0.1:{served.port}")
    hub = ParentHub(HubConfig(edge, spec, topo, "edge-threads-run"), ByteMeter(), MissingLog())
    try:
        # every child says Hello before the edge knows its run (as under `launch`, where hosts and edges start
        # together): each Hello is held, not waited for in a thread
        calls = [streams.open(node) for node in children]
        wait_until(lambda: sum(link.hello_seen.is_set() for link in served.pending._held) == CHILDREN,
                   "every child's Hello to be held", timeout=60)
        held = _server_threads() - before
        served.pending.serve(hub)  # the run is known: the held Hellos are welcomed
        welcomes = [next(call).WhichOneof("body") for call in calls]
        assert welcomes == ["welcome"] * CHILDREN
        wait_until(lambda: len(hub.roster.alive()) == CHILDREN, "every session to be the hub's")
        running = _server_threads() - before
        # one loop and fixed pools whatever the number of children (the synchronous server: 2-3 per child)
        bound = SESSION_WORKERS + SYNC_WORKERS + 1
        assert len(held) <= bound and len(running) <= bound, (len(held), len(running))
    finally:
        streams.close()
        hub.shutdown(0.0, finished=True)
        served.server.stop(0).wait(10)


@pytest.fixture(scope="module")
def ring(tmp_path_factory) -> tuple[Path, NodeContext]:
    """A Fed-CHS ring of 4 edges (edge-0's neighbours: edge-1 and edge-3; edge-2 is a stranger), its PKI."""
    spec = run_spec("fedchs", {"K": 1}, clients=4, edges=4, edge_graph="ring", name="edge-tls", rounds=1,
                    data=DIGITS, model={"name": "mlp", "hidden": [4]})
    pki = tmp_path_factory.mktemp("pki")
    init_folder(pki, ["ps", *(f"edge-{i}" for i in range(4))])
    ctx = NodeContext(node_id="edge-0", role="edge", ws=Workspace(spec, "cpu"), comm=None)  # type: ignore[arg-type]
    assert sorted(ctx.neighbours) == ["edge-1", "edge-3"]
    return pki, ctx


def _peer(node: str, pki: Path, ctx: NodeContext, served: EdgeServer, missing: MissingLog) -> PeerClient:
    return PeerClient(node, ByteMeter(), missing, ctx.spec.transport, {"edge-0": f"127.0.0.1:{served.port}"},
                      Security.load(node, pki))


def test_the_edge_service_refuses_with_its_codes_and_takes_a_neighbours_hand_off_over_tls(ring) -> None:
    pki, ctx = ring
    served = edge_server("edge-0", "127.0.0.1:0", Security.load("edge-0", pki))
    missing = MissingLog()
    friend, stranger = _peer("edge-1", pki, ctx, served, missing), _peer("edge-2", pki, ctx, served, missing)
    try:
        assert friend.describe("edge-0", 0) is None  # not in a run yet: refused, not hung
        with pytest.raises(HandOffError, match="edge-0: not in a run yet"):
            friend.hand_off("edge-0", "model", {"w": torch.ones(3)}, {}, 0)
        served.service.serve(ctx)
        assert stranger.describe("edge-0", 0) is None
        with pytest.raises(HandOffError, match="edge-2 is not a neighbour of edge-0"):
            stranger.hand_off("edge-0", "model", {"w": torch.ones(3)}, {}, 0)
        reasons = [m["reason"] for m in missing.entries]
        assert reasons[0] == "UNAVAILABLE: edge-0 is not in a run yet"
        assert "PERMISSION_DENIED: edge-2 is not a neighbour of edge-0" in reasons
        assert friend.describe("edge-0", 0) == {"data_size": 0}
        friend.hand_off("edge-0", "model", {"w": torch.ones(3)}, {"n": 2}, 0)
        bundle, args = ctx.inbox["chs.model/edge-1"] if "chs.model/edge-1" in ctx.inbox else ctx.inbox["model"]
        assert torch.equal(bundle["w"], torch.ones(3)) and args == {"n": 2}
    finally:
        friend.close()
        stranger.close()
        served.server.stop(0).wait(10)


def test_an_edge_that_cannot_listen_says_so_and_stops_its_server() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        served = edge_server("edge-0", f"127.0.0.1:{busy.getsockname()[1]}", PLAINTEXT)
    assert served.port == 0  # run_edge: "cannot listen on ...", ExitCode.USAGE
    assert served.server.wait_for_termination(10)


def test_an_edges_folding_scatter_waits_for_its_reply_gate_without_holding_the_session_workers() -> None:
    # the edge's sessions are PendingHub's (opened before the run was known): the servicer must see the hub's
    # call table through it, or each Result ahead of the canonical order waits for the gate in a session worker
    # and SESSION_WORKERS of them hold every worker while the reply the gate waits for cannot be read
    n = SESSION_WORKERS + 4
    chunk = 1 << 10
    spec = run_spec("fedavg", {}, clients=n, edges=1, name="edge-gate", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]}, transport={"chunk_bytes": chunk})
    topo = build_topology(spec.topology, spec.seed)
    edge = topo.edges[0]
    order = list(topo.cluster(edge))
    served = edge_server(edge, "127.0.0.1:0", PLAINTEXT)
    hub = ParentHub(HubConfig(edge, spec, topo, "edge-gate-run"), ByteMeter(), MissingLog())
    served.pending.serve(hub)
    children: dict[str, ChildSession] = {}
    try:
        for node in order:
            s = children[node] = ChildSession(NodeConfig(node, f"127.0.0.1:{served.port}", connect_timeout_s=10),
                                              "client")
            s.connect()
            s.send_ready({node: 10})
        wait_until(lambda: len(hub.data_sizes()) == n, "the children to be ready", timeout=30)
        hub.start()
        comm = NetComm(edge, topo, missing := MissingLog(), hub, spec)
        bundle = {"w": torch.arange(600, dtype=torch.float32)}  # three chunks: read only once the gate admits it
        first_sent = threading.Event()

        def answer(node: str) -> None:
            cid = next_task(children[node])
            if node == order[0]:  # the reply the gate admits first comes last
                wait_until(lambda: all(hub.calls._calls[c].answered.is_set() for c in hub.calls._calls
                                       if hub.calls._calls[c].node != order[0]), "the other Results", timeout=30)
            children[node].send([result_frame(cid, {"n": 10}, has_bundle=True), *bundle_frames(cid, bundle, chunk)])
            if node == order[0]:
                first_sent.set()

        helpers = [threading.Thread(target=answer, args=(node,), daemon=True) for node in order]
        for h in helpers:
            h.start()
        mean = WeightedMean(lambda node, r: r.scalars["n"], 10 * n)
        out = comm.scatter(order, "fedavg.train", {}, {}, expect={"w": torch.zeros(600)}, deadline_s=20.0, fold=mean)
        assert first_sent.is_set() and sorted(out) == sorted(order) and missing.entries == []
        plain = WeightedMean(lambda node, r: r.scalars["n"], 10 * n)  # the in-process fold, in canonical order
        for node in order:
            plain(node, Reply(clone(bundle), {"n": 10}))
        assert torch.equal(mean.result()["w"], plain.result()["w"])
        for h in helpers:
            h.join(10)
    finally:
        for s in children.values():
            s.close()
        hub.shutdown(0.0, finished=True)
        served.server.stop(0).wait(10)
