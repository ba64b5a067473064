"""Admission of a folding scatter's replies into memory (issue 11: memory near the model size).

A scatter with a fold (``Comm.scatter(..., fold=...)``) folds the replies in canonical order. Replies that
arrive early would wait decoded, one model each; instead, the session reader of a child whose Result arrives
early stops reading its stream until the reply's turn comes, so the bundle waits in the child (HTTP/2 flow
control holds it there) and the parent holds the running aggregate, the reply being folded and at most
``window`` more. A reply whose Result head came in before the scatter's deadline is waited for as much longer
as the gate held its bundle back (the gate must not turn a punctual node into a missing one), and no longer:
a reply whose bytes stop arriving once it may send them is missing at the deadline (``Call.wait_settled`` in
``transport/session/calls.py``; issue 20).
"""

from __future__ import annotations

import threading


class ReplyGate:
    """Admits the replies of one scatter (by call id, in canonical order): the first one not yet settled at
    once, and at most ``window`` others at a time."""

    def __init__(self, window: int) -> None:
        if window < 0:
            raise ValueError(f"reply window must be >= 0, got {window}")
        self.window = window
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

    def settled(self, call_id: int) -> None:
        """The reply of ``call_id`` was folded, failed or given up: the next ones may come in."""
        with self._cv:
            self._settled.add(call_id)
            self._inside.discard(call_id)
            self._cv.notify_all()

    def open(self) -> None:
        """Admit everything from now on (the scatter is over)."""
        with self._cv:
            self._open = True
            self._cv.notify_all()
