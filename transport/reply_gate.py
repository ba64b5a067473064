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

import heapq
import threading
from collections.abc import Callable


class ReplyGate:
    """Admits the replies of one scatter (by call id, in canonical order): the first one not yet settled at
    once, and at most ``window`` others at a time; replies waiting for a place are admitted in canonical order.

    Each waiting reply has its own wake-up: a settle wakes only the replies it admits and costs O(log n), so a
    scatter to n children costs O(n log n) in all. (One condition for all waiters woke every waiting session
    reader at every settle, each scanning the scatter's order: O(n^2) wake-ups and O(n^3) steps per round,
    the superlinear term of a round with many clients, issue 19.)"""

    def __init__(self, window: int) -> None:
        if window < 0:
            raise ValueError(f"reply window must be >= 0, got {window}")
        self.window = window
        self._order: list[int] = []
        self._pos = 0  # self._order[self._pos] is the head: the first call not settled
        self._settled: set[int] = set()
        self._inside: set[int] = set()  # admitted and not settled
        self._waiting: dict[int, Callable[[], None]] = {}  # call id -> what admits it
        self._queue: list[int] = []  # the waiting call ids, a heap (canonical order: call ids grow with it)
        self._open = False
        self._lock = threading.Lock()
        self.wakeups = 0  # how many waiting replies were admitted later (a test counts them)

    def add(self, call_id: int) -> None:
        """The next call of the scatter, in canonical order."""
        with self._lock:
            self._order.append(call_id)

    def _head(self) -> int | None:
        while self._pos < len(self._order) and self._order[self._pos] in self._settled:
            self._pos += 1
        return self._order[self._pos] if self._pos < len(self._order) else None

    def _others_inside(self, head: int | None) -> int:
        return len(self._inside) - (head in self._inside)

    def _may_enter(self, call_id: int) -> bool:
        head = self._head()
        if self._open or call_id in self._settled or call_id == head:
            return True
        return self._others_inside(head) - (call_id in self._inside) < self.window

    def try_enter(self, call_id: int, on_admit: Callable[[], None]) -> bool:
        """Admit ``call_id``'s reply now (True), or later: then ``on_admit`` is called, once, by the thread whose
        :meth:`settled` or :meth:`open` frees its place (it must not block)."""
        with self._lock:
            if self._may_enter(call_id):
                if call_id not in self._settled:  # (a reply given up on takes no place)
                    self._inside.add(call_id)
                return True
            self._waiting[call_id] = on_admit
            heapq.heappush(self._queue, call_id)
            return False

    def enter(self, call_id: int) -> None:
        """Block until ``call_id``'s reply may be received (called by the session reader of its child)."""
        admitted = threading.Event()
        if not self.try_enter(call_id, admitted.set):
            admitted.wait()

    def _admit(self) -> list[Callable[[], None]]:
        """The waiting replies that may enter now, marked inside (the caller holds the lock and calls them)."""
        out: list[Callable[[], None]] = []
        if not self._waiting:
            return out
        if self._open:
            out = list(self._waiting.values())
            self._inside.update(self._waiting)
            self._waiting.clear()
            self._queue.clear()
            return out
        head = self._head()
        if head is not None and head in self._waiting:  # the head always enters
            out.append(self._waiting.pop(head))
            self._inside.add(head)
        while self._queue and self._others_inside(head) < self.window:
            cid = heapq.heappop(self._queue)
            admit = self._waiting.pop(cid, None)
            if admit is not None:  # (the head, admitted above, is still on the heap)
                out.append(admit)
                self._inside.add(cid)
        return out

    @staticmethod
    def _run(admitted: list[Callable[[], None]]) -> None:
        for admit in admitted:
            admit()

    def settled(self, call_id: int) -> None:
        """The reply of ``call_id`` was folded, failed or given up: the next ones may come in."""
        with self._lock:
            self._settled.add(call_id)
            self._inside.discard(call_id)
            admitted = self._admit()
            given_up = self._waiting.pop(call_id, None)  # its reader still waits: it reads and drops the reply
            if given_up is not None:
                admitted.append(given_up)
            self.wakeups += len(admitted)
        self._run(admitted)

    def open(self) -> None:
        """Admit everything from now on (the scatter is over)."""
        with self._lock:
            self._open = True
            admitted = self._admit()
            self.wakeups += len(admitted)
        self._run(admitted)
