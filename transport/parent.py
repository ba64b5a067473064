"""The gRPC half of ``Parent.Session`` (docs/design.md section 6), served by the PS and by every edge: a thin
servicer that feeds each session's frames to the protocol (:class:`~fedhop.transport.session.ParentHub`, or
an edge's :class:`~fedhop.transport.session.PendingHub` until it knows its run) and streams back what the
protocol queues for that child."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import grpc

from fedhop.common.wire.framing import parse_frame_lenient, serialize_frame
from fedhop.transport.credentials import Security, Unauthenticated, peer_identity
from fedhop.transport.session import ChildLink, Frame

log = logging.getLogger("fedhop.parent")


class SessionHost(Protocol):
    """What the servicer needs of the protocol: a ``ParentHub`` or a ``PendingHub``."""

    node: str

    @property
    def security(self) -> Security: ...

    def open(self, peer: str, identity: str | None = None, unauthenticated: str = "",
             cancel: Any = None) -> ChildLink: ...

    def on_frame(self, link: ChildLink, frame: Frame) -> bool: ...

    def lost(self, link: ChildLink, why: str) -> None: ...


class ParentServicer:
    """``fedhop.v1.Parent/Session`` for one hub."""

    def __init__(self, hub: SessionHost) -> None:
        self.hub = hub

    def register(self, server: grpc.Server) -> None:
        handler = grpc.stream_stream_rpc_method_handler(
            self.Session, request_deserializer=parse_frame_lenient, response_serializer=serialize_frame)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fedhop.v1.Parent",
                                                                             {"Session": handler}),))

    def Session(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        identity, why = None, ""
        if not self.hub.security.plaintext:
            try:
                identity = peer_identity(context, self.hub.security)
            except Unauthenticated as e:
                why = str(e)
        link = self.hub.open(context.peer(), identity, why, cancel=context.cancel)
        if not link.alive:  # refused at once (not authenticated): only the refusal goes back
            yield from link.outgoing()
            return
        reader = threading.Thread(target=self._read, args=(link, request_iterator),
                                  name=f"session-{link.peer}", daemon=True)
        reader.start()
        yield from link.outgoing()

    def _read(self, link: ChildLink, frames: Iterator[Any]) -> None:
        why = "the child closed its stream"
        try:
            for frame in frames:
                if not self.hub.on_frame(link, frame):
                    return
        except grpc.RpcError as e:
            why = f"stream broken ({e.code().name if hasattr(e, 'code') else e})"
        except Exception as e:  # never let one session take the node down
            why = f"session failed: {type(e).__name__}: {e}"
            log.exception("%s: session with %s failed", self.hub.node, link.name)
        finally:
            self.hub.lost(link, why)


def serve_parent(hub: SessionHost, server: grpc.Server) -> ParentServicer:
    """Register ``Parent.Session`` of ``hub`` on ``server``."""
    servicer = ParentServicer(hub)
    servicer.register(server)
    return servicer
