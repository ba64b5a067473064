"""Faults over real processes: a client killed mid-run, a client that stalls past the deadline, and bad input
(malformed frames, unknown tasks, NaN bundles, impostors) that must be refused while the node keeps serving."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
import torch

from fedhop.common.engine.workspace import Workspace
from fedhop.common.topology import build_topology
from fedhop.common.wire.frames import (
    CALL_ID_BASE,
    MessageAssembler,
    chunk_frame_bytes,
    get_scalars,
    message_frames,
    parse_frame_lenient,
    serialize_frame,
    task_frame,
)
from fedhop.common.wire.meter import ByteMeter
from fedhop.launch import free_port
from fedhop.transport.aio_server import make_loop_server
from fedhop.transport.channels import add_port, make_server
from fedhop.transport.child import ChildSession, JoinError
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.parent import serve_parent
from fedhop.transport.session import HubConfig, ParentHub
from fedhop.v1 import fedhop_pb2 as pb
from tests.integration.netutil import Federation, load_result, small_spec


def test_killed_client_is_missing_and_the_run_finishes(tmp_path) -> None:
    spec = small_spec("fedavg", clients=4, edges=2, rounds=12, options={"local_steps": 60},
                      transport={"round_deadline_s": 30.0})
    fed = Federation(spec, tmp_path, marks=(2,))
    try:
        fed.wait_round(2, timeout=120)
        t_kill = time.monotonic()
        fed.procs.kill("client-1")  # SIGKILL: no Bye, the stream just breaks
        assert fed.wait(120) == 0, fed.all_logs()
        assert time.monotonic() - t_kill < 25, "a dead client must fail fast, not wait for the deadline"
    finally:
        fed.close()
    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    assert res["missing"], "the killed client must be reported missing"
    assert {m["node"] for m in res["missing"]} == {"client-1"}
    assert {m["by"] for m in res["missing"]} == {"edge-0"}  # its parent noticed, and told the PS at Bye
    first = min(m["round"] for m in res["missing"])
    assert first >= 3
    assert {m["round"] for m in res["missing"]} == set(range(first, spec.rounds + 1))
    replies = {(r["src"], r["round"]) for r in res["links"] if r["phase"] == "reply"}
    for c in ("client-0", "client-2", "client-3"):  # the others trained in every round, client-0 beside it
        assert all((c, t) in replies for t in range(1, spec.rounds + 1)), c
    assert not any(("client-1", t) in replies for t in range(first, spec.rounds + 1))
    assert res["rounds"][-1]["accuracy"] > 0.5


def test_stalled_client_misses_the_deadline_and_comes_back(tmp_path) -> None:
    spec = small_spec("fedavg", clients=3, edges=0, rounds=10, options={"local_steps": 40},
                      transport={"round_deadline_s": 2.0})
    fed = Federation(spec, tmp_path, marks=(3,), holds=(2,))
    try:
        fed.wait_round(2, timeout=120)  # the PS waits after round 2 until the test lets it go
        fed.procs.kill("client-2", signal.SIGSTOP)
        fed.go(2)
        fed.wait_round(3, timeout=120)  # round 3 closed at its deadline, without client-2
        fed.procs.kill("client-2", signal.SIGCONT)
        assert fed.wait(120) == 0, fed.all_logs()
    finally:
        fed.close()
    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    gone = [m for m in res["missing"] if m["node"] == "client-2"]
    assert gone and all("deadline" in m["reason"] for m in gone), [(m["round"], m["reason"]) for m in gone]
    assert {m["node"] for m in res["missing"]} == {"client-2"}
    assert max(m["round"] for m in gone) < spec.rounds, "after SIGCONT the client must take part again"


# -- bad input to a real client process --------------------------------------------------------------------


class ScriptedParent:
    """A fake parent: welcomes one child, pushes scripted frames, collects what comes back."""

    def __init__(self, spec_json: str, script: list) -> None:
        self.spec_json = spec_json
        self.script = script
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()

    def Session(self, requests, context):  # noqa: N802
        hello = next(requests)
        assert hello.WhichOneof("body") == "hello"
        w = pb.Frame()
        w.welcome.node_id = hello.hello.node_id
        w.welcome.spec = self.spec_json
        w.welcome.spec_format = "json"
        yield w
        threading.Thread(target=lambda: [self.inbox.put(f) for f in requests], daemon=True).start()
        while True:
            f = self.outbox.get()
            if f is None:
                return
            yield f


@pytest.fixture()
def scripted_client(tmp_path):
    spec = small_spec("fedavg", clients=2, edges=0, rounds=1)
    parent = ScriptedParent(spec.model_dump_json(), [])
    server = make_server(8)
    handler = grpc.stream_stream_rpc_method_handler(parent.Session, request_deserializer=parse_frame_lenient,
                                                    response_serializer=serialize_frame)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fedhop.v1.Parent",
                                                                         {"Session": handler}),))
    port = add_port(server, "127.0.0.1:0")
    server.start()
    log = (tmp_path / "client.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "fedhop", "client", "--id", "client-0", "--connect",
                             f"127.0.0.1:{port}", "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield spec, parent, proc, tmp_path / "client.log"
    finally:
        parent.outbox.put(None)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        log.close()
        server.stop(0)


def _next(parent: ScriptedParent, timeout: float = 60):
    return parent.inbox.get(timeout=timeout)


def test_client_refuses_bad_requests_and_keeps_serving(scripted_client) -> None:
    spec, parent, proc, log = scripted_client
    ready = _next(parent)
    assert ready.WhichOneof("body") == "ready" and dict(ready.ready.data_sizes).keys() == {"client-0"}
    params = Workspace(spec, "cpu").initial_params()
    cid = iter(range(CALL_ID_BASE + 1, CALL_ID_BASE + 100))
    asm = MessageAssembler()

    def push(frames) -> None:
        for f in frames:
            parent.outbox.put(f)

    def answer():
        """The next complete Result message, or an Error frame."""
        while True:
            f = _next(parent)
            if isinstance(f, pb.Frame) and f.WhichOneof("body") == "error":
                return f
            msg = asm.feed(f)
            if msg is not None:
                return msg

    args = {"solver.steps": 2, "solver.lr": 0.1, "solver.batch_size": 8}
    # 1. unknown task
    c = next(cid)
    push([task_frame(c, "no.such.task", {}, deadline_s=5, has_bundle=False, round_idx=0)])
    m = answer()
    assert m.call_id == c and not m.head.result.ok
    assert m.head.result.error.code == pb.ERROR_CODE_UNKNOWN_TASK and "no.such.task" in m.head.result.error.message
    # 2. a NaN bundle
    c = next(cid)
    bad = {k: v.clone() for k, v in params.items()}
    next(iter(bad.values()))[0] = float("nan")
    push(message_frames(task_frame(c, "local.train", args, deadline_s=5, has_bundle=True, round_idx=0), bad, 4096))
    m = answer()
    assert m.call_id == c and m.head.result.error.code == pb.ERROR_CODE_BAD_BUNDLE
    assert "non-finite" in m.head.result.error.message
    # 3. bytes that are not a Frame at all
    push([b"\xff\xff\xff\xff"])
    e = answer()
    assert e.WhichOneof("body") == "error" and "malformed" in e.error.message
    # 4. a chunk of a call that announced no bundle
    push([chunk_frame_bytes(CALL_ID_BASE + 99, 0, b"abcd")])
    e = answer()
    assert e.WhichOneof("body") == "error" and "no open bundle" in e.error.message
    # 5. a header that lies about a tensor's size
    c = next(cid)
    frames = list(message_frames(task_frame(c, "local.train", args, deadline_s=5, has_bundle=True, round_idx=0),
                                 params, 4096))
    frames[1].header.tensors[0].nbytes += 4
    push(frames)
    m = answer()
    assert m.call_id == c and m.head.result.error.code == pb.ERROR_CODE_BAD_BUNDLE
    assert "nbytes" in m.head.result.error.message
    # 6. a valid task still works
    c = next(cid)
    push(message_frames(task_frame(c, "local.train", args, deadline_s=5, has_bundle=True, round_idx=0),
                        params, 4096))
    m = answer()
    assert m.call_id == c and m.head.result.ok, m.head.result.error.message
    assert list(m.bundle) == list(params) and all(m.bundle[k].shape == params[k].shape for k in params)
    assert not any(torch.equal(m.bundle[k], params[k]) for k in params)
    assert get_scalars(m.head.result.scalars)["n"] > 0
    # 7. Bye: the client answers Bye and exits cleanly
    bye = pb.Frame()
    bye.bye.reason = "done"
    bye.bye.finished = True
    push([bye])
    f = _next(parent)
    assert f.WhichOneof("body") == "bye"
    parent.outbox.put(None)
    assert proc.wait(30) == 0, log.read_text()
    text = log.read_text()
    assert "unknown task 'no.such.task'" in text and "non-finite" in text


def test_parent_refuses_impostors_and_duplicates() -> None:
    spec = small_spec("fedavg", clients=2, edges=0, rounds=1)
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig("ps", spec, topo, "run-x"), ByteMeter())
    server = make_loop_server()
    serve_parent(hub, server)
    port = add_port(server, "127.0.0.1:0")
    server.start()
    addr = f"127.0.0.1:{port}"
    sessions = []
    try:
        with pytest.raises(JoinError, match="'client-9' is not a child of"):
            s = ChildSession(NodeConfig("client-9", addr, connect_timeout_s=10), "client")
            sessions.append(s)
            s.connect()
        with pytest.raises(JoinError, match="is a client in this run, but said Hello as edge"):
            s = ChildSession(NodeConfig("client-1", addr, connect_timeout_s=10), "edge")
            sessions.append(s)
            s.connect()
        ok = ChildSession(NodeConfig("client-0", addr, connect_timeout_s=10), "client")
        sessions.append(ok)
        w = ok.connect()
        assert w.node_id == "client-0" and w.parent_id == "ps" and w.spec == spec.model_dump_json()
        with pytest.raises(JoinError, match="duplicate Hello: client-0 is already connected"):
            s = ChildSession(NodeConfig("client-0", addr, connect_timeout_s=10), "client")
            sessions.append(s)
            s.connect()
        # the first session is still fine: it can say Ready and be counted
        ok.send_ready({"client-0": 5})
        assert hub.wait_ready(0.5) == ["client-1"]
        assert hub.data_sizes() == {"client-0": 5}
    finally:
        for s in sessions:
            s.close()
        server.stop(0)


def test_free_port_is_bindable() -> None:
    import socket

    p = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


def test_fedchs_walk_avoids_a_killed_edge_and_keeps_the_model(tmp_path) -> None:
    """An edge process dies mid-run: describe cannot reach it, so the two-step rule never hands it the model;
    the walk goes on over the remaining edges and the run finishes (the model is never lost)."""
    from fedhop.common.engine.inprocess import InProcessEngine

    spec = small_spec("fedchs", clients=4, edges=4, rounds=10, edge_graph="complete",
                      options={"K": 200}, transport={"round_deadline_s": 30.0, "rpc_timeout_s": 5.0})
    seq = [r["edge"] for r in InProcessEngine(spec, device="cpu").run().rounds]
    victim = next(e for e in (seq[3], *spec_edges(spec)) if e not in (seq[1], seq[2]))
    fed = Federation(spec, tmp_path, marks=(2,))
    try:
        fed.wait_round(2, timeout=120)
        fed.procs.kill(victim)
        assert fed.wait(180) == 0, fed.all_logs()
    finally:
        fed.close()
    res, final = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    later = [r["edge"] for r in res["rounds"][3:]]
    assert victim not in later
    assert any(m["node"] == victim and m["task"] in ("describe", "handoff") for m in res["missing"])
    assert all(torch.isfinite(v).all() for v in final.values())


def spec_edges(spec) -> list[str]:
    return list(build_topology(spec.topology, spec.seed).edges)
