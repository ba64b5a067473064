"""Property-based fuzzing of the session state machine (Hello -> Ready -> Task/Result -> Report -> Bye), from
the parent's side (:class:`ParentHub`) and the child's (:class:`ChildProtocol`), driven without sockets.

A valid session is scripted, then hypothesis mutates, truncates, drops, duplicates and reorders its frames and
inserts frames out of order (a Result before Ready, a second Hello, Bye in the middle of a bundle, a header that
claims more than ``max_bundle_bytes``, a Task sent by a child, a Result sent by a parent). Every case must end
in a clear error or a valid result: the handlers never raise, every call the parent made ends (a Reply or a
Failure) once the session is over, every bundle in flight is released, no decode buffer exceeds the limit, and
the child's task worker stops (no hang).

CI runs a few dozen examples per property; ``make fuzz`` runs many (``FEDHOP_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedhop.common.engine.api import NodeContext, Reply, task
from fedhop.common.engine.base import Failure
from fedhop.common.engine.workspace import Workspace
from fedhop.common.wire import codec
from fedhop.common.wire.control import bye_frame, report_frame
from fedhop.common.wire.framing import BadFrame, bundle_frames, parse_frame_lenient, serialize_frame
from fedhop.common.wire.messages import CALL_ID_BASE, PROTOCOL_VERSION, result_frame, task_frame
from fedhop.transport.session import ChildProtocol, child_assembler, hello_frame
from fedhop.v1 import fedhop_pb2 as pb
from tests.unit.hostile import configured_hub, drain, spec_for

EXAMPLES = int(os.environ.get("FEDHOP_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=dt.timedelta(seconds=20), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
MAX_BUNDLE = 64 << 10
SPEC = spec_for(clients=2, max_bundle_bytes=MAX_BUNDLE, max_open_bundles=2, handshake_timeout_s=60.0)
ECHO = "fuzz.echo"


@task(ECHO)
def _echo(ctx: NodeContext, bundle: dict, args: dict) -> Reply:
    return Reply(dict(bundle), {"n": 10})


@pytest.fixture
def allocations(monkeypatch):
    sizes: list[int] = []
    real = codec._allocate

    def record(size: int):
        sizes.append(size)
        return real(size)

    monkeypatch.setattr(codec, "_allocate", record)
    return sizes


def _frames_of(cid: int, bundle: dict[str, torch.Tensor]) -> list[pb.Frame | bytes]:
    return list(bundle_frames(cid, bundle, 1024))


def _oversized(cid: int) -> pb.Frame:
    n = MAX_BUNDLE * 1024
    return pb.Frame(call_id=cid, header=pb.BundleHeader(
        chunk_bytes=1024, checksum_algorithm="none", total_bytes=n,
        tensors=[pb.TensorSpec(name="w", dtype="uint8", shape=[n], nbytes=n)]))


def _ready(node: str, n: int = 10) -> pb.Frame:
    f = pb.Frame()
    f.ready.data_sizes[node] = n
    return f


@dataclass
class Edit:
    """One change to a scripted frame sequence."""

    op: str  # keep | drop | dup | swap | flip | cut | insert
    at: int
    arg: int = 0


edits = st.lists(st.builds(Edit, st.sampled_from(["keep", "drop", "dup", "swap", "flip", "cut", "insert"]),
                           st.integers(0, 40), st.integers(0, 1 << 16)), max_size=8)


def _as_bytes(f: pb.Frame | bytes) -> bytes:
    return serialize_frame(f)


def apply(script: list[pb.Frame | bytes], changes: list[Edit], extras: list[pb.Frame | bytes]) -> list:
    """The script with ``changes`` applied; frames come out as the transport would hand them over (parsed
    leniently from bytes: a mutated frame may become a BadFrame, a chunk, or another Frame)."""
    out = [_as_bytes(f) for f in script]
    for e in changes:
        if not out and e.op != "insert":
            continue
        i = e.at % max(1, len(out))
        if e.op == "drop":
            out.pop(i)
        elif e.op == "dup":
            out.insert(i, out[i])
        elif e.op == "swap" and i + 1 < len(out):
            out[i], out[i + 1] = out[i + 1], out[i]
        elif e.op == "flip" and out[i]:
            b = bytearray(out[i])
            b[e.arg % len(b)] ^= 1 + e.arg % 255
            out[i] = bytes(b)
        elif e.op == "cut":
            out[i] = out[i][:e.arg % (len(out[i]) + 1)]
        elif e.op == "insert":
            out.insert(i, _as_bytes(extras[e.arg % len(extras)]))
    return [parse_frame_lenient(b) for b in out]


# -- the parent's side ---------------------------------------------------------------------------------------------


@FUZZ
@given(edits, st.booleans())
def test_parent_survives_any_session(allocations, changes, call_first) -> None:
    with configured_hub(SPEC) as (hub, _):
        honest = hub.open("ipv4:127.0.0.1:1")  # client-1 joins properly: calls need the run started
        hub.on_frame(honest, hello_frame("client-1", "client", "", {}, ""))
        hub.on_frame(honest, _ready("client-1"))
        link = hub.open("ipv4:127.0.0.1:2")
        pre = [hello_frame("client-0", "client", "", {}, ""), _ready("client-0")]
        for f in pre if call_first else []:
            hub.on_frame(link, f)
        hub.start()
        calls = [hub.call("client-0", "t", {}, {}, 0, 60.0) for _ in range(2)]
        ids = [c.call_id if not isinstance(c, Failure) else CALL_ID_BASE + 7 for c in calls]
        w = {"w": torch.arange(600, dtype=torch.float32)}
        script: list = [] if call_first else list(pre)
        script += [result_frame(ids[0], {"n": 10}, has_bundle=True), *_frames_of(ids[0], w),
                   report_frame([], [], 0), result_frame(ids[1], {"n": 10}, has_bundle=False),
                   bye_frame("bye", finished=True)]
        extras = [hello_frame("client-0", "client", "", {}, ""), hello_frame("client-1", "edge", "", {}, "r"),
                  _ready("client-0", 10**12), bye_frame("bye", finished=False), _oversized(ids[0]),
                  result_frame(ids[0], {}, has_bundle=True), result_frame(CALL_ID_BASE + 99, {}, has_bundle=True),
                  task_frame(ids[1], "t", {}, deadline_s=1.0, has_bundle=False), pb.Frame(),
                  pb.Frame(welcome=pb.Welcome(node_id="x")), pb.Frame(hello=pb.Hello(protocol=PROTOCOL_VERSION + 1)),
                  *_frames_of(CALL_ID_BASE + 99, w)[1:]]
        for f in apply(script, changes, extras):
            if not hub.on_frame(link, f):  # a refused Hello ends the session
                break
        hub.lost(link, "the stream ended")
        for c in calls:
            if isinstance(c, Failure):
                continue
            assert c.done.is_set(), "a call outlived its child's session"
            assert isinstance(c.result, Reply | Failure)
        assert link.asm.open_bundles == 0
        assert link.asm.budget is None or link.asm.budget.in_flight == (0, 0)
        if not changes and call_first:  # the unchanged script is a valid session: both calls are answered
            assert [type(c.result) for c in calls] == [Reply, Reply], [c.result for c in calls]
            assert torch.equal(calls[0].result.bundle["w"], w["w"])
        assert all(a <= MAX_BUNDLE + 4096 for a in allocations), allocations
        drain(link)


# -- the child's side ----------------------------------------------------------------------------------------------

WS = Workspace(SPEC, "cpu")


@FUZZ
@given(edits)
def test_child_survives_any_parent(allocations, changes) -> None:
    sent: list = []
    ctx = NodeContext(node_id="client-0", role="client", ws=WS, comm=None)  # type: ignore[arg-type]
    proto = ChildProtocol("client-0", ctx, lambda frames: sent.extend(frames), chunk_bytes=1024)
    asm = child_assembler(SPEC.transport)
    w = {"w": torch.arange(300, dtype=torch.float32)}
    c1, c2 = CALL_ID_BASE + 1, CALL_ID_BASE + 2
    start = pb.Frame()
    start.ready.SetInParent()
    script = [start, task_frame(c1, ECHO, {}, deadline_s=30.0, has_bundle=True), *_frames_of(c1, w),
              task_frame(c2, ECHO, {}, deadline_s=30.0, has_bundle=False), bye_frame("done", finished=True)]
    extras = [result_frame(c1, {}, has_bundle=True), task_frame(c1, "no.such.task", {}, deadline_s=1.0,
                                                                  has_bundle=False),
              _oversized(c1), pb.Frame(hello=pb.Hello()), pb.Frame(report=pb.Report()), pb.Frame(),
              pb.Frame(error=pb.Error(message="x")), task_frame(c2, ECHO, {}, deadline_s=1.0, has_bundle=True),
              BadFrame("junk", 3)]
    frames = apply(script, changes, [f for f in extras if not isinstance(f, BadFrame)])
    for f in frames:
        if proto.on_frame(f, asm) is not None:  # the parent's Bye
            break
    proto.stop()
    assert proto._worker is None or not proto._worker.is_alive(), "the task worker hangs"
    answered = set()
    for f in sent:
        data = serialize_frame(f)  # whatever the child sends can be sent
        got = parse_frame_lenient(data)
        if isinstance(got, pb.Frame) and got.WhichOneof("body") == "result":
            answered.add(got.call_id)
    delivered = {f.call_id for f in frames if isinstance(f, pb.Frame) and f.WhichOneof("body") == "task"}
    assert answered <= delivered, "the child answered a call its parent never made"
    if not changes:
        assert answered == {c1, c2}
    assert all(a <= MAX_BUNDLE + 4096 for a in allocations), allocations
    asm.close()
    assert asm.budget.in_flight == (0, 0)
