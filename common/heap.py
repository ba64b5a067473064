"""The cyclic garbage collector and a federation's long-lived heap: settle what the join built (issue 19).

CPython's collector scans every tracked object of a generation when it collects it, and it collects the oldest
generation whenever the objects promoted into it since the last full collection reach a quarter of the objects
it held then. A PS, an edge or a client host of thousands of sessions holds millions of tracked objects from
its join on (the sessions' links, streams, asyncio tasks, gRPC calls, their protobufs), nearly all alive until
the run ends; yet every round promotes enough new ones (meter rows, records, frames in flight) to set off full
collections that walk them all again. Measured at 10,000 clients (2 hosts of 5,000 ids, FedAvg, 2 cores;
docs/benchmarks.md, "The collector at 10,000"): full collections of 1.0-2.0 s each, 2-3 per round in the PS
and 1 per round in each host, 3-5 s of the PS's and 1.5-3 s of each host's CPU in a ~22 s round; with the
collector off the round was 15.5 s.

:func:`settle` moves what has survived a full collection into the collector's permanent generation
(``gc.freeze()``): later collections scan only what was made since. Freezing has one cost: a frozen object that
later becomes part of a garbage *cycle* is not reclaimed while it stays frozen (objects freed by their reference
count, most of them, are freed as usual). So a process settles again (:func:`maybe_resettle`: unfreeze,
collect, freeze) at its quiet points (the PS after each round's commit, an edge before each task, a client
host every :data:`RESETTLE_MIN_S`) when sessions ended since it last settled (:func:`session_ended`, called
wherever a session ends), at most every :data:`RESETTLE_MIN_S`: what churn leaves behind is reclaimed within a
minute, at the price of one full collection.

Only a process that fedhop owns settles (:func:`own_process`: the ``fedhop`` command line and forked role
processes): a library caller's process (a test calling ``launch()``, a notebook) keeps its collector as it
was. ``FEDHOP_GC_FREEZE=0`` in the environment turns settling off (the collector as CPython runs it).
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Mapping

log = logging.getLogger("fedhop.heap")

ENV = "FEDHOP_GC_FREEZE"
RESETTLE_MIN_S = 60.0  # a process with ended sessions settles again at most this often


def enabled_by(env: Mapping[str, str]) -> bool:
    """Whether ``env`` lets an owned process settle: :data:`ENV` unset, empty or ``1``: yes; ``0``: no;
    ValueError naming the variable for anything else."""
    raw = env.get(ENV, "").strip()
    if raw in ("", "1"):
        return True
    if raw == "0":
        return False
    raise ValueError(f"{ENV}={raw!r}: expected 1 (settle the heap once the federation joined: the default) "
                     f"or 0 (leave the garbage collector as Python runs it)")


class Settler:
    """One process's settling state (the collector is the process's: :data:`SETTLER` is the one instance)."""

    def __init__(self) -> None:
        self.enabled = False
        self.claimed = False  # the process is fedhop's (claim()); own() then reads the environment
        self._lock = threading.Lock()
        self.settled_at: float | None = None  # time.monotonic() of the last settle
        self.stale = False  # a session ended since then
        self.settles = 0
        self.last_frozen = 0  # objects frozen by the last settle

    def own(self, env: Mapping[str, str]) -> None:
        """This process is fedhop's: settle from now on, unless ``env`` says not to (a bad value raises)."""
        self.enabled = enabled_by(env)

    def settle(self, why: str) -> bool:
        """Collect every generation (the frozen objects too), then freeze what survived; False when disabled."""
        if not self.enabled:
            return False
        with self._lock:
            t0 = time.perf_counter()
            gc.unfreeze()  # frozen objects that became garbage are collected too
            gc.collect()
            gc.freeze()
            self.last_frozen = gc.get_freeze_count()
            self.settled_at = time.monotonic()
            self.stale = False
            self.settles += 1
        log.info("heap settled (%s): %d objects frozen in %.2fs", why, self.last_frozen, time.perf_counter() - t0)
        return True

    def session_ended(self) -> None:
        """A session ended (or was replaced): its objects may be frozen garbage now."""
        self.stale = True

    def maybe_resettle(self, why: str, *, now: float | None = None) -> bool:
        """:meth:`settle` again when this process settled before, a session ended since, and
        :data:`RESETTLE_MIN_S` passed; True when it did."""
        if not self.enabled or self.settled_at is None or not self.stale:
            return False
        now = time.monotonic() if now is None else now
        if now - self.settled_at < RESETTLE_MIN_S:
            return False
        return self.settle(why)


SETTLER = Settler()


def claim() -> None:
    """This process is fedhop's: its command line (``python -m fedhop``, the console script) or a forked role
    process (``fedhop/forkstart.py``); the command then calls :func:`own_process`."""
    SETTLER.claimed = True


def own_process(env: Mapping[str, str] | None = None) -> None:
    """Settle from now on, unless ``env`` (default ``os.environ``) says not to; ValueError naming
    :data:`ENV` for a bad value."""
    SETTLER.own(os.environ if env is None else env)


def settle(why: str) -> bool:
    return SETTLER.settle(why)


def session_ended() -> None:
    SETTLER.session_ended()


def maybe_resettle(why: str) -> bool:
    return SETTLER.maybe_resettle(why)
