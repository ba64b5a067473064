"""A parent's mailbox: the Post messages its children sent it unprompted (``Comm.post`` to the parent), taken by
``Comm.receive`` first in, first out. A Post comes on the child's session stream (a Post frame, then its bundle's
frames under the Post's call id), is counted on arrival under its task's request kind at the post's round (as
the in-process engine counts it), validated (scalars that decode, a bundle that decoded) and kept; one that fails
is refused: the child is told and the parent's missing log names it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fedhop.common.engine.api import NodeId, Post, meter_kind
from fedhop.common.engine.base import MissingLog
from fedhop.common.wire.codec import CodecError
from fedhop.common.wire.messages import Message
from fedhop.common.wire.meter import ByteMeter
from fedhop.common.wire.scalars import get_scalars
from fedhop.transport.session.link import ChildLink, complain
from fedhop.v1 import fedhop_pb2 as pb


class Mailbox:
    """The posts a parent's children sent it and nobody took yet, in arrival order."""

    def __init__(self, node: NodeId, meter: ByteMeter, missing: MissingLog) -> None:
        self.node = node
        self.meter = meter
        self.missing = missing
        self._posts: list[Post] = []
        self._changed = threading.Condition()

    def arrived(self, link: ChildLink, msg: Message) -> None:
        """A whole Post message from ``link``: counted, then kept (or refused, saying why)."""
        post = msg.head.post
        sender = link.node_id or link.name
        rnd = int(post.round)
        self.meter.record(sender, self.node, meter_kind(post.name, "request"), "request", msg.payload_bytes,
                          msg.message_bytes, rnd)
        reason = None
        if not post.name:
            reason = "it names no task"
        elif msg.error is not None:
            reason = f"its bundle could not be decoded: {msg.error}"
        try:
            args = get_scalars(post.args)
        except CodecError as e:
            args, reason = {}, reason or f"bad args: {e}"
        if reason is not None:
            why = f"{self.node} refused the post {post.name!r} from {sender}: {reason}"
            self.missing.add(rnd, self.node, sender, post.name or "post", why)
            complain(self.node, link, msg.call_id, pb.ERROR_CODE_BAD_REQUEST, why)
            return
        with self._changed:
            self._posts.append(Post(sender, post.name, msg.bundle, args, rnd))
            self._changed.notify_all()

    def take(self, want: Callable[[Post], bool], end: float) -> Post | None:
        """The first post ``want`` matches, taken out; None at ``end`` (a time.monotonic() time) if none came."""
        with self._changed:
            while True:
                for p in self._posts:
                    if want(p):
                        self._posts.remove(p)
                        return p
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)

    def __len__(self) -> int:
        with self._changed:
            return len(self._posts)
