"""``Comm.post`` over real gRPC (in this process): a child's Post up its session stream lands in the parent's
mailbox, where ``NetComm.receive`` takes it, counted byte for byte as the in-process engine counts it; a post
to a neighbour travels on ``Edge.HandOff`` and runs in the receiver's task loop."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from fedhop.common.engine.api import NodeContext, Post
from fedhop.common.engine.base import MissingLog, PostError
from fedhop.common.engine.workspace import Workspace
from fedhop.common.wire.messages import message_bytes, post_bytes, post_frame
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.aio_server import make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.child import ChildSession
from fedhop.transport.netcomm import NetComm
from fedhop.transport.peer import EdgeService, PeerClient
from fedhop.transport.session import ParentHub
from tests.net.hubs import parent_with_children
from tests.specs import DIGITS, run_spec


@pytest.fixture
def parent() -> Iterator[tuple[ParentHub, NetComm, dict[str, ChildSession]]]:
    spec = run_spec("fedavg", {}, clients=2, edges=0, name="post", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]})
    with parent_with_children(spec, {"client-0": 10, "client-1": 10}, child_transport=True) as (hub, children, topo):
        yield hub, NetComm(topo.server, topo, hub.missing, hub, spec), children


def test_a_childs_post_lands_in_the_parents_mailbox_counted_as_in_process(parent) -> None:
    hub, comm, children = parent
    w = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    children["client-1"].post_up("test.net.report", {}, {"loss": 0.5, "next": "edge-2"}, 3)
    children["client-0"].post_up("test.net.report", w, {"loss": 0.25}, 3)
    got = comm.receive("test.net.report", sender="client-0", deadline_s=30)
    assert got is not None and (got.sender, got.round, got.scalars) == ("client-0", 3, {"loss": 0.25})
    assert torch.equal(got.bundle["w"], w["w"])
    got = comm.receive("test.net.report", deadline_s=30)
    assert got is not None and (got.sender, got.bundle, got.scalars) == ("client-1", {}, {"loss": 0.5,
                                                                                        "next": "edge-2"})
    rows = {(r["src"], r["dst"], r["kind"], r["round"]): r for r in hub.meter.rows()}
    chunk = comm.transport.chunk_bytes
    up = rows[("client-0", "ps", "test.net.report", 3)]
    assert (up["phase"], up["messages"], up["payload_bytes"]) == ("request", 1, 24)
    assert up["message_bytes"] == post_bytes("test.net.report", w, {"loss": 0.25}, chunk, up=True, round_idx=3)
    control = rows[("client-1", "ps", "test.net.report", 3)]
    assert control["payload_bytes"] == 0  # a post without tensors: a control message
    assert control["message_bytes"] == post_bytes("test.net.report", {}, {"loss": 0.5, "next": "edge-2"}, chunk,
                                                  up=True, round_idx=3)
    assert not [r for r in hub.meter.rows() if r["src"] == "ps" and r["kind"] == "test.net.report"]


def test_receive_waits_for_its_deadline_refuses_bad_posts_and_takes_the_next(parent) -> None:
    hub, comm, children = parent
    began = time.monotonic()
    assert comm.receive("test.net.report", deadline_s=0.3) is None
    assert 0.25 <= time.monotonic() - began < 5
    child = children["client-0"]
    child.post_up("test.net.report", {"w": torch.zeros(2)}, {"n": 0}, 0)  # not what receive expects: refused
    child.send([post_frame(7, "test.net.report", {"n": 1}, has_bundle=False, round_idx=0)])  # not a post's call id
    child.post_up("test.net.report", {"w": torch.zeros(3)}, {"n": 2}, 0)
    got = comm.receive("test.net.report", expect={"w": torch.zeros(3)}, deadline_s=30)
    assert got is not None and got.scalars == {"n": 2}
    assert [(m["by"], m["node"], m["reason"]) for m in hub.missing.entries] == [
        ("ps", "client-0", "refused post: tensor 'w' has shape (2,), expected (3,)")]
    assert len(hub.mailbox) == 0


def test_a_post_to_a_neighbour_runs_in_its_task_loop_and_is_counted_by_the_sender() -> None:
    """edge-0 posts to edge-1 over a real Edge.HandOff; edge-1's service hands it to its task loop (here: a list),
    once even when the sender retries it; an unknown task is refused and raises PostError at the sender."""
    spec = run_spec("fedchs", {"K": 1}, clients=2, edges=2, edge_graph="ring", name="peer-post", rounds=1,
                    data=DIGITS, model={"name": "mlp", "hidden": [4]})
    ws = Workspace(spec, "cpu")
    svc = EdgeService("edge-1")
    got: list[Post] = []
    ctx = NodeContext(node_id="edge-1", role="edge", ws=ws, comm=None)  # type: ignore[arg-type]
    svc.serve(ctx, on_post=lambda post, epoch, sent: got.append(post))
    server = make_loop_server()  # the edge's server (edge/node.py)
    svc.register(server)
    addr = f"127.0.0.1:{add_port(server, '127.0.0.1:0')}"
    server.start()
    meter, missing = ByteMeter(), MissingLog()
    client = PeerClient("edge-0", meter, missing, spec.transport, {"edge-1": addr})
    try:
        w = {"w": torch.ones(4)}
        client.post("edge-1", "fedchs.round", w, {"first": False}, 2, 3)
        assert [(p.sender, p.task, p.round, p.scalars) for p in got] == [("edge-0", "fedchs.round", 3,
                                                                         {"first": False})]
        assert torch.equal(got[0].bundle["w"], w["w"])
        with pytest.raises(PostError, match="unknown task 'test.net.nope'"):
            client.post("edge-1", "test.net.nope", {}, {}, 2, 3)
        assert len(got) == 1 and missing.entries[0]["node"] == "edge-1"
        rows = {(r["src"], r["dst"], r["kind"], r["phase"]): r for r in meter.rows() if r["kind"] == "fedchs.round"}
        chunk = spec.transport.chunk_bytes
        assert rows[("edge-0", "edge-1", "fedchs.round", "request")]["message_bytes"] == \
            post_bytes("fedchs.round", w, {"first": False}, chunk, up=False, round_idx=3)
        assert rows[("edge-1", "edge-0", "fedchs.round", "reply")]["message_bytes"] == \
            message_bytes("handoff", "reply", {}, {}, chunk)
        assert {r["round"] for r in rows.values()} == {2}  # counted at the sender's round
    finally:
        client.close()
        server.stop(0)

