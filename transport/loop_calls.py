"""Calls onto one asyncio event loop from other threads, carried in batches (issue 19): the client hosts' sends
(``aio_child.py``) and a parent's wake-ups of its sessions (``parent.py``) share it."""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fedhop.transport")


class LoopCalls:
    """Calls onto one event loop from other threads, carried in batches: the calls made while the loop has not
    run the previous ones yet share one ``call_soon_threadsafe`` (a self-pipe write and a loop wake-up), not one
    each (issue 19: a host's ids' task threads each queued their Result and their Report with a wake-up of their
    own, and a parent's threads woke each session's handler with one of its own). Calls run in the order made.
    A client host's sessions share one per loop (:meth:`of`); a parent's servicer has its own (its counts are its
    own), ``what`` naming its calls in the log."""

    _all: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopCalls] = weakref.WeakKeyDictionary()
    _all_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop, what: str = "a call queued onto the loop") -> None:
        self.loop = loop
        self.what = what
        self._lock = threading.Lock()
        self._batch: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.calls = 0  # counted, for the tests: calls made ...
        self.wakes = 0  # ... and the call_soon_threadsafe that carried them

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LoopCalls:
        with cls._all_lock:
            calls = cls._all.get(loop)
            if calls is None:
                calls = cls._all[loop] = cls(loop)
            return calls

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon (RuntimeError, as ``call_soon_threadsafe``'s, once it is closed)."""
        with self._lock:
            self.calls += 1
            self._batch.append((fn, args))
            if len(self._batch) > 1:
                return  # the loop has not run the batch yet: it takes this one with it
            self.wakes += 1
        try:
            self.loop.call_soon_threadsafe(self._run)
        except RuntimeError:  # the loop is closed: nothing will run them (later calls raise too)
            with self._lock:
                self._batch.clear()
            raise

    def _run(self) -> None:
        with self._lock:
            batch, self._batch = self._batch, []
        for fn, args in batch:
            try:
                fn(*args)
            except Exception:  # one session's failure must not keep the others' calls from running
                log.exception("%s failed", self.what)
