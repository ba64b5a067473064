"""A parent hub on a real gRPC server on loopback with fake children (ChildSession) that said Ready: what the
net tests of the reply gate, the streamed fold, posts and the bulk lane start from.

The fake children send hand-made chunk frames, so the bulk lane (transport/lane.py) is off unless a test asks
for it (``lane=True``)."""

from __future__ import annotations

import contextlib
import os
import queue
import time
from collections.abc import Iterator, Mapping
from typing import Any
from unittest import mock

import grpc

from fedhop.common.engine.base import MissingLog
from fedhop.common.spec import RunSpec
from fedhop.common.topology import Topology, build_topology
from fedhop.common.wire.framing import parse_frame_lenient, serialize_frame
from fedhop.common.wire.messages import Message
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.aio_server import make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.child import ChildSession
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.lane import ENV_SWITCH
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.parent import serve_parent
from fedhop.transport.session import HubConfig, ParentHub, child_assembler, hello_frame
from fedhop.v1 import fedhop_pb2 as pb
from tests.specs import DIGITS, run_spec
from tests.waiting import wait_until


@contextlib.contextmanager
def parent_with_children(spec: RunSpec, sizes: Mapping[str, int], *,
                         child_transport: bool = False, lane: bool = False,
                         security: Mapping[str, Security] | None = None,
                         ) -> Iterator[tuple[ParentHub, dict[str, ChildSession], Topology]]:
    """The started hub of ``spec``'s PS on an asyncio ``LoopServer`` (what the PS and the edges serve on) and one
    connected ChildSession per client, each Ready with its size from ``sizes``; everything closed afterwards.
    ``child_transport``: the children take the spec's transport options (chunk sizes of their own posts);
    ``lane``: the sessions open bulk lanes; ``security``: each node's credentials (default plaintext)."""
    sec = dict(security or {})
    with mock.patch.dict(os.environ, {ENV_SWITCH: "1" if lane else "0"}):
        yield from _parent_with_children(spec, sizes, child_transport, sec)


@contextlib.contextmanager
def fedavg_parent(name: str, weights: Mapping[str, int], chunk_bytes: int,
                  ) -> Iterator[tuple[ParentHub, dict[str, ChildSession], tuple[RunSpec, Topology]]]:
    """:func:`parent_with_children` for a flat FedAvg run of ``len(weights)`` clients (a 4-unit MLP on digits; the
    children's bundles are the tests' own), ``chunk_bytes`` per chunk, 30 s per call: the PS the fold and spill
    tests scatter from; yields (hub, children, (spec, topology))."""
    spec = run_spec("fedavg", {}, clients=len(weights), edges=0, name=name, rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]},
                    transport={"chunk_bytes": chunk_bytes, "rpc_timeout_s": 30.0})
    with parent_with_children(spec, weights) as (hub, children, topo):
        yield hub, children, (spec, topo)


def _parent_with_children(spec: RunSpec, sizes: Mapping[str, int], child_transport: bool,
                          sec: Mapping[str, Security]) -> Iterator[tuple[ParentHub, dict[str, ChildSession], Topology]]:
    topo = build_topology(spec.topology, spec.seed)
    ps_sec = sec.get(topo.server, PLAINTEXT)
    hub = ParentHub(HubConfig(topo.server, spec, topo, f"{spec.name}-run", security=ps_sec), ByteMeter(),
                    MissingLog())
    srv = make_loop_server(ps_sec)
    serve_parent(hub, srv)
    addr = f"127.0.0.1:{add_port(srv, '127.0.0.1:0', ps_sec)}"
    srv.start()
    children: dict[str, ChildSession] = {}
    try:
        for node in topo.clients:
            cfg = NodeConfig(node, addr, connect_timeout_s=10, security=sec.get(node, PLAINTEXT))
            s = children[node] = ChildSession(cfg, "client")
            s.connect()
            if child_transport:
                s.transport = spec.transport
            s.send_ready({node: sizes[node]})
        wait_until(lambda: len(hub.data_sizes()) == len(children), "the children to be ready", timeout=30)
        hub.start()
        yield hub, children, topo
    finally:
        for s in children.values():
            s.close()
        hub.shutdown(0.0, finished=True)
        srv.stop(0)


def next_task(child: ChildSession, timeout: float = 30) -> int:
    """The call id of the next Task the fake child receives."""
    end = time.monotonic() + timeout
    while True:
        _, kind, frame = child._events.get(timeout=max(0.01, end - time.monotonic()))
        if kind == "frame" and isinstance(frame, pb.Frame) and frame.WhichOneof("body") == "task":
            return frame.call_id


class HelloStreams:
    """Raw ``Parent.Session`` streams to a parent at ``address``: each says Hello as a client and then stays open
    and silent until :meth:`close` (what the thread-count tests hold many of)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self._session = self.channel.stream_stream("/fedhop.v1.Parent/Session", request_serializer=serialize_frame,
                                                   response_deserializer=parse_frame_lenient)
        self._quiet: queue.Queue = queue.Queue()
        self.calls: list[Any] = []

    def _frames(self, first: pb.Frame) -> Iterator[pb.Frame]:
        yield first
        while (item := self._quiet.get()) is not None:
            yield item

    def open(self, node: str) -> Any:
        """A stream that says Hello as ``node``; its answers are read from the returned call."""
        call = self._session(self._frames(hello_frame(node, "client", "", {}, "")))
        self.calls.append(call)
        return call

    def close(self) -> None:
        for _ in self.calls:
            self._quiet.put(None)
        for call in self.calls:
            call.cancel()
        self.channel.close()


def take_task(child: ChildSession, timeout: float = 30) -> Message:
    """The next whole Task message a fake child (``parent_with_children``'s) receives, its payload read from the
    session's lane if it has one."""
    asm = child_assembler(child.transport)
    assert child._stream is not None
    asm.lane = child._stream.lane
    while True:
        _, kind, frame = child._events.get(timeout=timeout)
        assert kind == "frame", frame
        if isinstance(frame, pb.Frame) and frame.WhichOneof("body") in (None, "ready"):
            continue
        msg = asm.feed(frame)
        if msg is not None:
            assert msg.error is None, msg.error
            return msg
