"""Helpers of the hostile-peer unit tests: a configured ParentHub with no sockets, and what it sent a link."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fedhop.common.engine.base import MissingLog
from fedhop.common.spec import RunSpec
from fedhop.common.topology import Topology, build_topology
from fedhop.common.wire.framing import parse_frame
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.session import CLOSE, QUIET, ChildLink, HubConfig, HubListener, ParentHub, hello_frame
from fedhop.v1 import fedhop_pb2 as pb
from tests.specs import run_spec

RUN_ID = "hostile-run"


def spec_for(clients: int = 3, edges: int = 0, algorithm: str = "fedavg", **transport: Any) -> RunSpec:
    return run_spec(algorithm, clients=clients, edges=edges, edge_graph="ring", name="hostile", rounds=1,
                    data={"dataset": "digits"}, model={"name": "mlp", "hidden": [4]}, transport=transport)


@contextmanager
def configured_hub(spec: RunSpec, security: Security = PLAINTEXT,
                   listener: HubListener = QUIET) -> Iterator[tuple[ParentHub, Topology]]:
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig(topo.server, spec, topo, RUN_ID, security=security), ByteMeter(), MissingLog(),
                    listener=listener)
    try:
        yield hub, topo
    finally:
        hub.shutdown(0.0, finished=True)


def drain(link: ChildLink) -> tuple[list[pb.Frame], bool]:
    """Everything queued on ``link`` so far (frames parsed back from bytes) and whether the stream was closed."""
    frames: list[pb.Frame] = []
    closed = False
    while True:
        try:
            item = link._q.get_nowait()
        except queue.Empty:
            return frames, closed
        if item is CLOSE:
            closed = True
            continue
        for f in item[0]:
            frames.append(parse_frame(f) if isinstance(f, bytes) else f)


def errors(frames: list[pb.Frame]) -> list[str]:
    return [f.error.message for f in frames if isinstance(f, pb.Frame) and f.WhichOneof("body") == "error"]


def join(hub: ParentHub, node: str, role: str = "client", peer: str = "ipv4:127.0.0.1:40000",
         identity: str | None = None, size: int = 10) -> ChildLink:
    """A child that says Hello and Ready on a new session; its Welcome is drained."""
    link = hub.open(peer, identity)
    assert hub.on_frame(link, hello_frame(node, role, "", {}, ""))
    ready = pb.Frame()
    ready.ready.data_sizes[node] = size
    assert hub.on_frame(link, ready)
    frames, _ = drain(link)
    assert frames and frames[0].WhichOneof("body") == "welcome", frames
    return link
