"""``fedhop edge``: one edge server process (DESIGN.md section 4).

An edge is a child of the PS (it dials the PS and serves the PS's tasks) and a parent of its clients (it
serves ``Parent.Session`` to them), and it serves ``Edge.HandOff`` / ``Edge.Describe`` to its neighbour
edges: a model handed to a neighbour goes edge -> edge directly, never through the PS.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import grpc
import torch

from fedhop.common.engine.api import NodeContext, NodeId
from fedhop.common.engine.base import MissingLog, check_bundle
from fedhop.common.wire.frames import (
    HANDOFF,
    FrameError,
    MessageAssembler,
    get_scalars,
    parse_frame_lenient,
    to_device,
)
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.child import ChildSession, JoinError
from fedhop.transport.health import add_health
from fedhop.transport.parent import NODE_HEADER, SLOT_HEADER, NetComm, ParentHub, describe_reply, make_server
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.edge")


class EdgeService:
    """``Edge.HandOff`` and ``Edge.Describe`` of one edge."""

    def __init__(self, node_id: NodeId) -> None:
        self.node = node_id
        self.ctx: NodeContext | None = None
        self.max_bytes: int | None = None

    def register(self, server: grpc.Server) -> None:
        handlers = {
            "HandOff": grpc.stream_unary_rpc_method_handler(
                self.HandOff, request_deserializer=parse_frame_lenient, response_serializer=pb.Ack.SerializeToString),
            "Describe": grpc.unary_unary_rpc_method_handler(
                self.Describe, request_deserializer=pb.DescribeRequest.FromString,
                response_serializer=pb.DescribeReply.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fedhop.v1.Edge", handlers),))

    def _caller(self, context: grpc.ServicerContext) -> tuple[str, str]:
        md = dict(context.invocation_metadata())
        return str(md.get(NODE_HEADER, "")), str(md.get(SLOT_HEADER, ""))

    def _refuse(self, code: int, message: str) -> pb.Ack:
        log.warning("%s: hand-off refused: %s", self.node, message)
        return pb.Ack(ok=False, error=pb.Error(code=code, message=f"{self.node}: {message}"))

    def HandOff(self, frames: Iterator[Any], context: grpc.ServicerContext) -> pb.Ack:  # noqa: N802
        sender, slot = self._caller(context)
        ctx = self.ctx
        if ctx is None:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, "not in a run yet")
        if sender not in ctx.neighbours:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST,
                                f"{sender or '(anonymous)'} is not a neighbour (neighbours: {list(ctx.neighbours)})")
        if not slot:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"hand-off from {sender} names no slot")
        asm = MessageAssembler(max_bytes=self.max_bytes)
        msg = None
        try:
            for f in frames:
                msg = asm.feed(f)
                if msg is not None:
                    break
        except FrameError as e:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"hand-off from {sender}: {e}")
        if msg is None:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"hand-off from {sender} ended before its bundle")
        if msg.kind != "task" or msg.head.task.name != HANDOFF:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"hand-off from {sender} is not a {HANDOFF!r} Task")
        if msg.error is not None:
            return self._refuse(pb.ERROR_CODE_BAD_BUNDLE, f"hand-off from {sender}: {msg.error}")
        reason = check_bundle(msg.bundle)
        if reason is not None:
            return self._refuse(pb.ERROR_CODE_BAD_BUNDLE, f"{self.node} rejected the hand-off from {sender}: {reason}")
        ctx.inbox[slot] = (to_device(msg.bundle, ctx.device), get_scalars(msg.head.task.args))
        return pb.Ack(ok=True)

    def Describe(self, request: pb.DescribeRequest, context: grpc.ServicerContext) -> pb.DescribeReply:  # noqa: N802
        ctx = self.ctx
        if ctx is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.node} is not in a run yet")
        assert ctx is not None
        return describe_reply({"data_size": ctx.sizes.get(self.node, 0), **ctx.public})


def run_edge(node_id: str, ps: str, listen: str, *, device: str | None = None, advertise: str | None = None,
             connect_timeout_s: float = 60.0) -> int:
    """Serve clients and neighbour edges on ``listen``, join the run at ``ps``, serve until Bye.

    ``advertise`` is the address neighbour edges dial (default: the listen address, 127.0.0.1 for a
    wildcard host; set it when edges run on different machines)."""
    torch.set_num_threads(1)
    meter, missing = ByteMeter(), MissingLog()
    hub = ParentHub(node_id, meter)
    service = EdgeService(node_id)
    server = make_server(1024)
    add_health(server)  # grpc.health.v1 (compose healthchecks, `fedhop health`)
    hub.register(server)
    service.register(server)
    port = server.add_insecure_port(listen)
    if port == 0:
        log.error("%s: cannot listen on %s", node_id, listen)
        return 2
    server.start()
    host = listen.rsplit(":", 1)[0] or "127.0.0.1"
    address = advertise or f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '') else host}:{port}"
    session = ChildSession(node_id, "edge", ps, address=address, connect_timeout_s=connect_timeout_s)
    try:
        try:
            welcome, ws = session.join(device)
        except JoinError as e:
            log.error("%s", e)
            return 3
        spec = ws.spec
        hub.configure(spec, ws.topology, welcome.run_id)
        service.max_bytes = spec.transport.max_bundle_bytes
        comm = NetComm(node_id, ws.topology, missing, hub, spec, peers=session.peers)
        ctx = NodeContext(node_id=node_id, role="edge", ws=ws, comm=comm)
        comm.ctx = ctx
        log.info("%s: joined run %s, serving on %s; waiting for %d clients", node_id, welcome.run_id, address,
                 len(hub.children))
        absent = hub.wait_ready(0.9 * spec.transport.join_timeout_s)
        if absent:
            log.warning("%s: clients that did not join: %s", node_id, absent)
        sizes = hub.data_sizes()
        ctx.sizes = {**sizes, node_id: sum(sizes.values())}
        service.ctx = ctx
        session.send_ready(sizes)

        def bye() -> tuple[list[dict], list[dict]]:
            rows, child_missing = hub.shutdown(spec.transport.rpc_timeout_s)
            meter.merge(rows)
            return meter.rows(), missing.entries + child_missing

        ok = session.serve(ctx, on_bye=bye)
        if not ok:
            hub.shutdown(2.0)
        comm.close()
        return 0 if ok else 1
    finally:
        session.close()
        server.stop(grace=1.0).wait(5.0)
