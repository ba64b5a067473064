"""``Comm.post`` / ``Comm.receive`` in the in-process engine: the FIFO scheduler's order (derived by hand below),
the receiver's context, the byte meter (a post is counted like the networked engine sends it), and refusals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import pytest
import torch

from fedhop.common.engine.api import NodeContext, Post, Reply, Scalar, task
from fedhop.common.engine.base import PostError
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.engine.workspace import Workspace
from fedhop.common.wire.bundle import payload_bytes
from fedhop.common.wire.messages import CALL_ID_BASE, message_bytes, post_bytes, task_frame
from fedhop.transport.peer import NODE_HEADER, POST_HEADER, ROUND_HEADER, EdgeService
from fedhop.v1 import fedhop_pb2 as pb
from tests.specs import run_spec

DATA = {"dataset": "synthetic", "partition": "dirichlet", "train_limit": 120, "test_limit": 40}
LOG: list[tuple[str, str, int, int]] = []  # (task, node, ctx.round, hop) of every posted task run


def engine(edges: int = 3) -> InProcessEngine:
    """PS, ``edges`` edges on a ring (edge-0 - edge-1 - edge-2 - edge-0), one client each; no run started."""
    s = run_spec("fedchs", {"K": 1}, clients=edges, edges=edges, edge_graph="ring", data=DATA,
                 model={"name": "logreg"}, rounds=1, seed=1)
    LOG.clear()
    return InProcessEngine(s)


@task("test.post.hop")
def hop(ctx: NodeContext, bundle: dict[str, torch.Tensor], args: dict[str, Scalar]) -> Reply:
    """Record the run, then: report to the parent, and pass on to the next edge while ``hops`` remain."""
    n = int(args["hop"])
    LOG.append(("hop", ctx.node_id, ctx.round, n))
    ctx.comm.post(ctx.topology.server, "test.post.report", {"w": bundle["w"] + 1}, {"hop": n, "at": ctx.node_id})
    if n + 1 < int(args["hops"]):
        nxt = ctx.neighbours[-1] if ctx.node_id == "edge-0" else sorted(ctx.neighbours)[0]
        ctx.comm.post(nxt, "test.post.hop", {"w": bundle["w"] + 1}, {"hop": n + 1, "hops": args["hops"]},
                      round=ctx.round + 1)
    return Reply()


@task("test.post.note")
def note(ctx: NodeContext, bundle: dict[str, torch.Tensor], args: dict[str, Scalar]) -> Reply:
    LOG.append(("note", ctx.node_id, ctx.round, int(args["n"])))
    return Reply({"ignored": torch.zeros(1)})  # what a posted task returns goes nowhere


@task("test.post.boom")
def boom(ctx: NodeContext, bundle: dict[str, torch.Tensor], args: dict[str, Scalar]) -> Reply:
    raise ValueError("no")


def test_receive_runs_queued_posts_first_in_first_out_until_the_parent_has_a_match() -> None:
    """edge-0 posts hop 0 to edge-1 and a note to edge-2; then note 1 to edge-1. The first receive runs the queue
    head, hop 0 at edge-1 (round 4), which reports (mailbox: report 0) and posts hop 1 to edge-0 at round 5 (queue:
    note 0, note 1, hop 1): the report is there, so receive returns it without running more. The second receive
    finds no report: it runs note 0 (edge-2), note 1 (edge-1), then hop 1 (edge-0, round 5), whose report it
    returns; hop 1 was the last hop. A third receive finds the queue empty: None, at once."""
    eng = engine()
    e0 = eng.nodes["edge-0"]
    e0.round = 4
    w = {"w": torch.zeros(3)}
    e0.comm.post("edge-1", "test.post.hop", w, {"hop": 0, "hops": 2})
    e0.comm.post("edge-2", "test.post.note", None, {"n": 0})
    e0.comm.post("edge-1", "test.post.note", None, {"n": 1})
    assert LOG == []  # nothing runs at post time
    ps = eng.nodes["ps"].comm
    first = ps.receive("test.post.report")
    assert first is not None and (first.sender, first.scalars["hop"], first.round) == ("edge-1", 0, 4)
    assert torch.equal(first.bundle["w"], torch.ones(3))
    assert LOG == [("hop", "edge-1", 4, 0)]
    second = ps.receive("test.post.report")
    assert second is not None and (second.sender, second.scalars["hop"], second.round) == ("edge-0", 1, 5)
    assert torch.equal(second.bundle["w"], torch.full((3,), 2.0))
    assert LOG == [("hop", "edge-1", 4, 0), ("note", "edge-2", 4, 0), ("note", "edge-1", 4, 1),
                   ("hop", "edge-0", 5, 1)]
    assert ps.receive("test.post.report") is None


def test_receive_takes_by_kind_and_sender_and_leaves_the_rest_in_the_mailbox() -> None:
    eng = engine()
    for e in ("edge-2", "edge-0", "edge-2"):
        eng.nodes[e].comm.post("ps", "test.post.a" if e == "edge-0" else "test.post.b", None, {"from": e})
    ps = eng.nodes["ps"].comm
    got = ps.receive("test.post.b", sender="edge-2")
    assert got is not None and got.sender == "edge-2"
    got = ps.receive("test.post.a")
    assert got is not None and got.sender == "edge-0"
    assert [p.task for p in eng.mailboxes["ps"]] == ["test.post.b"]
    assert ps.receive("test.post.a") is None
    eng.nodes["edge-1"].comm.post("ps", "test.post.b", None, {"n": 4}, round=4)
    eng.nodes["edge-1"].comm.post("ps", "test.post.b", None, {"n": 3}, round=3)
    got = ps.receive("test.post.b", round=3)
    assert got is not None and (got.sender, got.scalars["n"]) == ("edge-1", 3)
    assert ps.receive("test.post.b", sender="edge-1", round=5) is None
    assert eng.missing.entries[-1]["reason"] == "no test.post.b of round 6 posted"
    assert [p.round for p in eng.mailboxes["ps"]] == [0, 4]


def test_posts_are_metered_as_the_networked_engine_sends_them() -> None:
    """Up: one Post frame and its bundle (no reply). To a neighbour: a Task frame and its bundle, then an Ack."""
    eng = engine()
    e0 = eng.nodes["edge-0"]
    w = {"w": torch.zeros(5)}
    chunk = eng.spec.transport.chunk_bytes
    e0.comm.post("ps", "test.post.report", w, {"a": 1}, round=2)
    e0.comm.post("edge-1", "test.post.note", None, {"n": 7})
    rows = {(r["src"], r["dst"], r["kind"], r["phase"]): r for r in eng.meter.rows()}
    up = rows[("edge-0", "ps", "test.post.report", "request")]
    assert up["payload_bytes"] == payload_bytes(w) == 20
    assert up["message_bytes"] == post_bytes("test.post.report", w, {"a": 1}, chunk, up=True, round_idx=2)
    assert not [k for k in rows if k[:2] == ("ps", "edge-0")]  # nobody answers a post to the parent
    peer = rows[("edge-0", "edge-1", "test.post.note", "request")]
    assert peer["payload_bytes"] == 0  # a tensor-free post: a control message
    assert peer["message_bytes"] == post_bytes("test.post.note", {}, {"n": 7}, chunk, up=False, round_idx=0)
    ack = rows[("edge-1", "edge-0", "test.post.note", "reply")]
    assert ack["message_bytes"] == message_bytes("handoff", "reply", {}, {}, chunk)


def test_bad_posts_are_refused_and_the_run_goes_on() -> None:
    eng = engine()
    e0 = eng.nodes["edge-0"]
    with pytest.raises(PostError, match="edge-1 refused the post from edge-0: unknown task 'test.post.nope'"):
        e0.comm.post("edge-1", "test.post.nope")
    with pytest.raises(PostError, match=r"non-finite values"):
        e0.comm.post("edge-1", "test.post.note", {"w": torch.tensor([float("nan")])}, {"n": 0})
    with pytest.raises(ValueError, match="cannot post to its child client-0"):
        e0.comm.post("client-0", "test.post.note")
    with pytest.raises(ValueError, match="edge-0 has no link to client-1"):
        e0.comm.post("client-1", "test.post.note")
    # a post whose bundle is not what receive expects is refused (logged), and the next one is taken
    e0.comm.post("ps", "test.post.report", {"w": torch.zeros(2)}, {"n": 0})
    e0.comm.post("ps", "test.post.report", {"w": torch.zeros(3)}, {"n": 1})
    got = eng.nodes["ps"].comm.receive("test.post.report", expect={"w": torch.zeros(3)})
    assert got is not None and got.scalars["n"] == 1
    # a posted task that fails is logged by its node; the queue goes on
    e0.comm.post("edge-1", "test.post.boom")
    e0.comm.post("edge-1", "test.post.note", None, {"n": 9})
    assert eng.nodes["ps"].comm.receive("test.post.report") is None
    assert LOG == [("note", "edge-1", 0, 9)]
    reasons = [(m["by"], m["node"], m["task"], m["reason"]) for m in eng.missing.entries]
    assert reasons == [
        ("edge-0", "edge-1", "test.post.nope", "edge-1 refused the post from edge-0: unknown task 'test.post.nope'"),
        ("edge-0", "edge-1", "test.post.note", reasons[1][3]),
        ("ps", "edge-0", "test.post.report", "refused post: tensor 'w' has shape (2,), expected (3,)"),
        ("edge-1", "edge-1", "test.post.boom", "posted task failed: ValueError: no"),
    ]


def test_receive_is_a_parents_and_takes_from_its_children() -> None:
    eng = engine()
    with pytest.raises(RuntimeError, match="client-0 has no children"):
        eng.nodes["client-0"].comm.receive("x")
    with pytest.raises(ValueError, match="client-0 is not among them"):
        eng.nodes["ps"].comm.receive("x", sender="client-0")


class _PostContext:
    """The part of a grpc.ServicerContext that EdgeService reads, for a post from edge-0 with id ``pid``."""

    def __init__(self, pid: str, sender: str = "edge-0") -> None:
        self.md = ((NODE_HEADER, sender), (POST_HEADER, pid), (ROUND_HEADER, "4"))

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.md

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"



def _hand_off(svc: EdgeService, frames: Iterable[object], context: _PostContext) -> pb.Ack:
    """``Edge.HandOff`` (a coroutine, as the edge's asyncio server runs it) on an event loop of its own."""
    async def stream() -> AsyncIterator[object]:
        for f in frames:
            yield f

    return asyncio.run(svc.HandOff(stream(), context))  # type: ignore[arg-type]


def test_the_peer_service_runs_a_retried_post_once_and_refuses_strangers_and_unknown_tasks() -> None:
    """The same post id delivered twice (its first Ack lost): acknowledged both times, handed on once."""
    eng = engine()
    svc = EdgeService("edge-1")
    got: list[Post] = []
    svc.serve(NodeContext(node_id="edge-1", role="edge", ws=Workspace(eng.spec, "cpu"), comm=None),  # type: ignore[arg-type]
              on_post=lambda post, epoch, sent: got.append(post))

    def frames(name: str = "test.post.note") -> object:
        return iter([task_frame(CALL_ID_BASE, name, {"n": 1}, deadline_s=5.0, has_bundle=False)])

    assert _hand_off(svc, frames(), _PostContext("edge-0/1")).ok
    assert _hand_off(svc, frames(), _PostContext("edge-0/1")).ok
    assert _hand_off(svc, frames(), _PostContext("edge-0/2")).ok
    assert [(p.sender, p.task, p.round, p.scalars) for p in got] == [("edge-0", "test.post.note", 4, {"n": 1})] * 2
    ack = _hand_off(svc, frames("test.post.nope"), _PostContext("edge-0/3"))
    assert not ack.ok and "unknown task 'test.post.nope'" in ack.error.message
    ack = _hand_off(svc, frames(), _PostContext("x/1", sender="client-0"))
    assert not ack.ok and "client-0 is not a neighbour of edge-1" in ack.error.message
    assert len(got) == 2
