"""The cyclic garbage collector and a federation's long-lived heap: settle what the join built (issue 19).

CPython's collector scans every tracked object of a generation when it collects it, and it collects the oldest
generation whenever the objects promoted into it since the last full collection reach a quarter of the objects
it held then. A PS, an edge or a client host of thousands of sessions holds millions of tracked objects from
its join on (the sessions' links, streams, asyncio tasks, gRPC calls, their protobufs), nearly all alive until
the run ends; yet every round promotes enough new ones (meter rows, the calls and frames of the round) to set
off full collections that walk them all again. Measured at 10,000 clients (2 hosts of 5,000 ids, FedAvg, 2
cores; docs/benchmarks.md, "The collector at 10,000"): full collections of 1.0-2.0 s each, 2-3 per round in
the PS and 1 per round in each host, 3-5 s of the PS's and 1.5-3 s of each host's CPU in a ~22 s round; with
the collector off the round was 15.5 s.

So a process fedhop owns keeps what has lived long in the collector's permanent generation (``gc.freeze()``),
which later collections do not scan, as a fourth generation that it manages itself:

* :meth:`Settler.settle` (a *full* settle): unfreeze, collect everything, freeze what survived. Once when the
  process's federation joined (the PS and an edge when their children are ready, a client host when all its
  ids are), and again as below.
* From the first settle on, the collector's thresholds are :data:`THRESHOLDS`: a young collection every 50,000
  net allocations, not 700, and full collections left to the tidies below.
* :meth:`Settler.tidy`, at the process's quiet points (the PS after each round's commit, an edge before each
  task, a client host every :data:`TIDY_MIN_S`), at most every :data:`TIDY_MIN_S`: collect what is not frozen
  (one round's survivors: cheap), freeze what survived (the round's meter rows and records, which live until
  the run ends). It is a full settle instead when sessions ended since the last full one
  (:meth:`Settler.session_ended`, called wherever a session ends; at most every :data:`RESETTLE_MIN_S`), or
  when the frozen objects grew to :data:`GROWTH` times what the last full settle left.

Freezing has one cost: a frozen object that later becomes part of a garbage *cycle* is not reclaimed while it
stays frozen (objects freed by their reference count, nearly all of them, are freed as usual). The full
settles bound it: cycles of a session that ended are reclaimed within :data:`RESETTLE_MIN_S` (and the next
quiet point), and any other frozen garbage before the frozen set has grown :data:`GROWTH`-fold: the frozen
garbage never outnumbers the objects the last full settle found alive (the same kind of bound as CPython's own
rule for its oldest generation, with 100 % for 25 %).

Only a process that fedhop owns settles (:func:`claim`: the ``fedhop`` command line and forked role
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
TIDY_MIN_S = 10.0  # a quiet point tidies at most this often
RESETTLE_MIN_S = 60.0  # a process with ended sessions settles in full at most this often
GROWTH = 2  # a tidy is a full settle once the frozen objects grew this many times the last full settle's
# the collector's thresholds from the first settle on (CPython's: 700, 10, 10): a young collection every 50,000
# net allocations instead of 700 finds most of a round's short-lived objects already freed by their reference
# count (fewer scanned per allocation), and the oldest generation is left to the tidies (at least every
# TIDY_MIN_S at the quiet points) instead of the collector's own rule
THRESHOLDS = (50_000, 20, 100)


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
        self.settled_at: float | None = None  # time.monotonic() of the last full settle
        self.tidied_at: float | None = None  # ... of the last settle or tidy
        self.stale = False  # a session ended since the last full settle
        self.settles = 0  # full settles
        self.tidies = 0  # tidies that were not full settles
        self.last_frozen = 0  # objects frozen by the last full settle
        self.thresholds_before: tuple[int, ...] | None = None  # gc.get_threshold() before the first settle

    def own(self, env: Mapping[str, str]) -> None:
        """This process is fedhop's: settle from now on, unless ``env`` says not to (a bad value raises)."""
        self.enabled = enabled_by(env)

    def settle(self, why: str, *, now: float | None = None) -> bool:
        """A full settle: collect every generation (the frozen objects too), then freeze what survived; False
        when disabled."""
        if not self.enabled:
            return False
        with self._lock:
            t0 = time.perf_counter()
            if self.settles == 0:
                self.thresholds_before = gc.get_threshold()
                gc.set_threshold(*THRESHOLDS)
            gc.unfreeze()  # frozen objects that became garbage are collected too
            gc.collect()
            gc.freeze()
            self.last_frozen = gc.get_freeze_count()
            self.settled_at = self.tidied_at = time.monotonic() if now is None else now
            self.stale = False
            self.settles += 1
        log.info("heap settled (%s): %d objects frozen in %.2fs", why, self.last_frozen, time.perf_counter() - t0)
        return True

    def session_ended(self) -> None:
        """A session ended (or was replaced): its objects may be frozen garbage now."""
        self.stale = True

    def tidy(self, why: str, *, now: float | None = None) -> str | None:
        """At a quiet point of a process that settled before, at most every :data:`TIDY_MIN_S`: a full
        :meth:`settle` when sessions ended since the last (at most every :data:`RESETTLE_MIN_S`) or the frozen
        objects grew :data:`GROWTH`-fold; else collect what is not frozen and freeze what survived. Returns
        "full", "young" or None (nothing done)."""
        if not self.enabled or self.settled_at is None or self.tidied_at is None:
            return None
        now = time.monotonic() if now is None else now
        if now - self.tidied_at < TIDY_MIN_S:
            return None
        if (self.stale and now - self.settled_at >= RESETTLE_MIN_S) \
                or gc.get_freeze_count() >= GROWTH * max(self.last_frozen, 1):
            self.settle(why, now=now)
            return "full"
        with self._lock:
            t0 = time.perf_counter()
            gc.collect()  # the objects made since the last settle or tidy: the frozen ones are not scanned
            gc.freeze()
            self.tidied_at = now
            self.tidies += 1
        log.debug("heap tidied (%s): %d objects frozen in %.3fs", why, gc.get_freeze_count(),
                  time.perf_counter() - t0)
        return "young"


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


def tidy(why: str) -> str | None:
    return SETTLER.tidy(why)
