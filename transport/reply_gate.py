"""Admission of a folding scatter's replies into memory (issue 11: memory near the model size).

A scatter with a fold (``Comm.scatter(..., fold=...)``) folds the replies in canonical order. Replies that
arrive early would wait decoded, one model each; instead, the session reader of a child whose Result arrives
early stops reading its stream until the reply's turn comes, so the bundle waits in the child (HTTP/2 flow
control holds it there) and the parent holds the running aggregate, the reply being folded and at most
``window`` more. A reply whose Result head came in before the scatter's deadline is waited for as much longer
as the gate held its bundle back (the gate must not turn a punctual node into a missing one), and no longer:
a reply whose bytes stop arriving once it may send them is missing at the deadline (``Call.wait_settled`` in
``transport/session/calls.py``; issue 20).

With a ``stream`` (issue 19), the reply at the head is not decoded at all: when its bundle header arrives the
gate asks ``stream(node, head, header)`` for a sink (a fold that adds each chunk into the aggregate as it
lands, ``common/wire/fold.py``), so the parent holds the aggregate and a chunk. A sink not committed by the
time its reply is settled (the reply failed, was given up or was rejected) is aborted before the next reply
is admitted: the aggregate is restored before anyone else may add to it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fedhop.common.wire.codec import PayloadSink
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.session")

Stream = Callable[[str, pb.Frame, pb.BundleHeader], PayloadSink | None]  # (node, Result frame, header) -> sink


class ReplyGate:
    """Admits the replies of one scatter (by call id, in canonical order): the first one not yet settled at
    once, and at most ``window`` others at a time."""

    def __init__(self, window: int, stream: Stream | None = None) -> None:
        if window < 0:
            raise ValueError(f"reply window must be >= 0, got {window}")
        self.window = window
        self.stream = stream
        self._sinks: dict[int, PayloadSink] = {}  # call id -> the sink its reply streams into, until settled
        self._order: list[int] = []
        self._settled: set[int] = set()
        self._inside: set[int] = set()  # admitted and not settled
        self._open = False
        self._cv = threading.Condition()

    def add(self, call_id: int) -> None:
        """The next call of the scatter, in canonical order."""
        with self._cv:
            self._order.append(call_id)

    def _head(self) -> int | None:
        return next((c for c in self._order if c not in self._settled), None)

    def _may_enter(self, call_id: int) -> bool:
        if self._open or call_id in self._settled or call_id == self._head():
            return True
        head = self._head()
        return len(self._inside - {call_id, head}) < self.window

    def enter(self, call_id: int) -> None:
        """Block until ``call_id``'s reply may be received (called by the session reader of its child)."""
        with self._cv:
            while not self._may_enter(call_id):
                self._cv.wait()
            self._inside.add(call_id)

    def sink(self, call_id: int, node: str, head: pb.Frame, header: pb.BundleHeader) -> PayloadSink | None:
        """Where the bundle of ``call_id``'s reply goes (called by its session reader when the header arrives):
        a sink from ``stream`` when the reply is the next to fold, else None (it is decoded whole)."""
        with self._cv:
            if self.stream is None or self._open or call_id != self._head():
                return None
        try:
            s = self.stream(node, head, header)
        except (MemoryError, OSError, ValueError) as e:  # e.g. no memory for the first reply's buffer: decode it
            log.warning("the reply of %s cannot be folded while it arrives (%s): it is decoded whole", node, e)
            return None
        if s is None:
            return None
        with self._cv:
            if not (self._open or call_id in self._settled):
                self._sinks[call_id] = s
                return s
        s.abort()  # settled (given up) meanwhile: never let it touch the aggregate
        return None

    def settled(self, call_id: int) -> None:
        """The reply of ``call_id`` was folded, failed or given up: the next ones may come in (its sink, when not
        committed, is aborted first)."""
        with self._cv:
            self._settled.add(call_id)
            self._inside.discard(call_id)
            s = self._sinks.pop(call_id, None)
            if s is not None:
                s.abort()
            self._cv.notify_all()

    def open(self) -> None:
        """Admit everything from now on (the scatter is over); sinks not committed are aborted."""
        with self._cv:
            self._open = True
            for s in self._sinks.values():
                s.abort()
            self._sinks.clear()
            self._cv.notify_all()
