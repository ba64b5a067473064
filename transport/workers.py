"""A fixed set of worker threads for many nodes of one process (a client host's ids), and :class:`SerialWork`: one
node's work, run in order and one item at a time, on those shared threads. A client host of 10,000 ids ran a task
worker thread per id (and as many session threads, stream readers, ...: 50,000 threads, past this machine's
``pid_max``); with SerialWork its ids cost no thread of their own."""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

log = logging.getLogger("fedhop.workers")

T = TypeVar("T")
_STOP = object()
MAX_BLOCKED = 512  # threads a pool adds, at most, for work that waits (blocking()) instead of computing
IDLE_S = 30.0  # a thread added for waiting work ends after this long without work


class DaemonPool:
    """``size`` daemon threads taking work in submission order (a ``ThreadPoolExecutor``'s threads are joined at
    interpreter exit: a host that ends while an id still dials would wait for it). Each item may name the thread
    while it runs (``name``: the node it works for, so that its log records carry the node).

    Work that waits rather than computes (an emulated slow node waiting out its compute time, a posted task
    waiting for its parent) says so with :meth:`blocking`: the pool then adds a thread, so that ``size`` threads
    stay free for the others (at most :data:`MAX_BLOCKED` more; an added thread ends once idle)."""

    def __init__(self, size: int, name: str) -> None:
        if size < 1:
            raise ValueError(f"a pool needs at least one thread, got {size}")
        self.size = size
        self.name = name
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._blocked = 0  # threads inside blocking()
        self._serial = 0  # names of the threads
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any, name: str | None = None) -> Future[T]:
        """Run ``fn(*args)`` on a pool thread (named ``name`` meanwhile); its outcome is the returned future's."""
        fut: Future[T] = Future()
        self._work.put((fut, fn, args, name))
        with self._lock:  # threads start as work comes, up to size (more while some wait)
            if len(self._threads) - self._blocked < self.size:
                self._start()
        return fut

    def _start(self) -> None:
        t = threading.Thread(target=self._run, daemon=True, name=f"{self.name}-{self._serial}")
        self._serial += 1
        self._threads.append(t)
        t.start()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """The calling pool thread waits (not computes) meanwhile: the pool may add a thread for the others."""
        with self._lock:
            self._blocked += 1
            if len(self._threads) - self._blocked < self.size and self._blocked <= MAX_BLOCKED:
                self._start()
        try:
            yield
        finally:
            with self._lock:
                self._blocked -= 1

    def _next(self) -> object:
        """The next work item; None for a thread the pool no longer needs (idle, more threads than size)."""
        while True:
            try:
                return self._work.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if len(self._threads) - self._blocked > self.size:
                        self._threads.remove(threading.current_thread())
                        return None

    def _run(self) -> None:
        me = threading.current_thread()
        own = me.name
        while (item := self._next()) is not _STOP and item is not None:
            fut, fn, args, name = item  # type: ignore[misc]
            if not fut.set_running_or_notify_cancel():
                continue
            me.name = name or own
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001  (handed to whoever waits on the future)
                fut.set_exception(e)
            finally:
                me.name = own

    def threads(self) -> int:
        """How many threads the pool has started (at most ``size``)."""
        with self._lock:
            return len(self._threads)

    def shutdown(self) -> None:
        """Let the threads end once the work queued before is done (they are daemons: nobody waits for them)."""
        with self._lock:
            for _ in range(len(self._threads) + MAX_BLOCKED):
                self._work.put(_STOP)


class SerialWork(Generic[T]):
    """One node's work items, handled by ``handle`` in the order put, one at a time, on ``pool``'s threads (the
    thread is named ``name`` while it handles them). What a node's own worker thread did, without the thread."""

    def __init__(self, pool: DaemonPool, handle: Callable[[T], None], name: str) -> None:
        self.pool = pool
        self.handle = handle
        self.name = name
        self._items: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        self._running = False
        self._closed = threading.Event()  # close() was called and every item before it is handled
        self._closing = False

    def put(self, item: T) -> None:
        with self._lock:
            if self._closing:
                return
            self._items.append(item)
            if self._running:
                return
            self._running = True
        self.pool.submit(self._drain, name=self.name)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._items:
                    self._running = False
                    if self._closing:
                        self._closed.set()
                    return
                item = self._items.popleft()
            try:
                self.handle(item)
            except Exception:
                log.exception("%s: a work item failed", self.name)

    def close(self, timeout: float) -> bool:
        """Take no more items; wait up to ``timeout`` s for those put before (the one in progress may finish).
        True when they are done."""
        with self._lock:
            self._closing = True
            if not self._running:
                self._closed.set()
        return self._closed.wait(timeout)
