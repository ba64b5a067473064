"""Issue 20, over a real (in-process) gRPC server with fake children that send frames by hand:

* "one participant stalling mid-upload stretches a round from 5 s to 35 s": a reply whose Result frame came in
  time but whose bundle bytes stop arriving does not hold a folding scatter past its deadline (it waited
  ``rpc_timeout_s`` more); the honest reply held back behind it by the gate is still folded;
* "a 512 MiB reply is buffered before its shape is checked": a bundle header announcing other shapes than the
  scatter's ``expect`` fails the reply at once, before any chunk arrives and before anything is reserved.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from fedhop.common.engine.base import Failure, MissingLog
from fedhop.common.wire.framing import bundle_frames
from fedhop.common.wire.messages import result_frame
from fedhop.transport.child import ChildSession
from fedhop.transport.netcomm import NetComm
from fedhop.transport.session import ParentHub
from tests.net.hubs import next_task, parent_with_children
from tests.specs import DIGITS, run_spec
from tests.waiting import wait_until

CHUNK = 64 << 10
EXPECT = {"w": torch.zeros(64, 1024)}  # 256 KiB: four chunks


@pytest.fixture  # the asyncio server the PS (server/main.py) and the edges serve on
def parent() -> Iterator[tuple[ParentHub, dict[str, ChildSession], object]]:
    spec = run_spec("fedavg", {}, clients=2, edges=0, name="stall", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]}, transport={"chunk_bytes": CHUNK, "rpc_timeout_s": 30.0})
    with parent_with_children(spec, {"client-0": 10, "client-1": 10}) as (hub, children, topo):
        yield hub, children, (spec, topo)


def reply_frames(cid: int, bundle: dict[str, torch.Tensor]) -> list:
    return [result_frame(cid, {"n": 10}, has_bundle=True), *bundle_frames(cid, bundle, CHUNK)]


def test_a_reply_that_stalls_mid_upload_does_not_hold_the_round_past_its_deadline(parent) -> None:
    hub, children, (spec, topo) = parent
    comm = NetComm(topo.server, topo, comm_missing := MissingLog(), hub, spec)
    stalled, honest = children["client-0"], children["client-1"]  # client-0 comes first: the gate's head

    def answer() -> None:
        frames = reply_frames(next_task(stalled), {"w": torch.ones(64, 1024)})
        stalled.send(frames[:3])  # Result, header, the first chunk of four: then nothing more
        honest.send(reply_frames(next_task(honest), {"w": torch.full((64, 1024), 2.0)}))

    folded: list[str] = []
    helper = threading.Thread(target=answer, daemon=True)
    helper.start()
    deadline = 1.5
    began = time.monotonic()
    out = comm.scatter(["client-0", "client-1"], "fedavg.train", {}, {}, expect=EXPECT, deadline_s=deadline,
                       fold=lambda node, r: folded.append(node))
    took = time.monotonic() - began
    helper.join(5)
    assert took < deadline + 2.0, f"the scatter took {took:.1f}s for a deadline of {deadline}s"
    assert folded == ["client-1"] and list(out) == ["client-1"]
    assert [(m["node"], m["reason"]) for m in comm_missing.entries] == [
        ("client-0", f"no reply within the deadline of {deadline:g}s")]


def test_a_header_of_the_wrong_shape_fails_the_reply_before_its_bytes_are_read(parent) -> None:
    hub, children, _ = parent
    child = children["client-0"]
    got: queue.Queue[int] = queue.Queue()
    threading.Thread(target=lambda: got.put(next_task(child)), daemon=True).start()
    call = hub.call("client-0", "fedavg.train", {}, {}, 0, 30.0, expect=EXPECT)
    assert not isinstance(call, Failure)
    cid = got.get(timeout=30)
    frames = reply_frames(cid, {"w": torch.zeros(1024, 1024)})  # 4 MiB announced, (64, 1024) expected
    child.send(frames[:2])  # the Result and the header only: no chunk is ever sent before the refusal
    assert call.done.wait(30), "the reply was not refused at its header"
    assert isinstance(call.result, Failure)
    assert "bundle refused at its header, before its bytes were read: tensor 'w' has shape (1024, 1024), " \
           "expected (64, 1024)" in call.result.reason
    link = hub.roster.links["client-0"]
    assert link.asm.open_bundles == 0 and not link.asm._reserved  # nothing allocated or reserved for it
    child.send(frames[2:])  # its chunks now: dropped unread, no buffer opened for them
    wait_until(lambda: child._stream.out.empty(), "the chunks to be sent", timeout=30)
    assert link.asm.open_bundles == 0 and not link.asm._reserved
    ok = hub.call("client-0", "fedavg.train", {}, {}, 0, 30.0, expect=EXPECT)  # the session still works
    assert not isinstance(ok, Failure)
    child.send(reply_frames(next_task(child), {"w": torch.ones(64, 1024)}))
    assert ok.done.wait(30) and not isinstance(ok.result, Failure), ok.result
    assert torch.equal(ok.result.bundle["w"], torch.ones(64, 1024))
