"""The round loop, shared by both engines: the only place that advances the PS's round counter.

    S = init(ctx)                         (or the state of a checkpoint: resume)
    S = setup(ctx, S)                     (if the algorithm has a set-up step; round index SETUP_ROUND)
    for t in start..T-1:  S = round(ctx, S); commit(t, S)
    return final(ctx, S)

After every round the state's type is checked (a round must return the same kind of state it was given) and
``commit`` (the engine's checkpoint writer) is called with the round just completed. The PS's ``ctx.state``
is S between rounds, for whoever watches the run. A round in which the PS
sent tasks and got fewer than ``transport.min_participants`` usable replies is retried from the state it
started from, up to ``transport.round_retries`` times, and then ends the run with :class:`RoundFailed`: a run
that did not train as specified never ends as if it had.

With ``spill_bytes`` > 0 (the networked PS: ``transport.spill_model_bytes``), an algorithm that never changes
its state's tensors in place (``round_replaces_tensors``) has them moved into a file-backed mapping at each
round's start, before the retry snapshot shares them, and their pages leave the PS's resident memory once its
scatter's requests are out (``spill.py``; issue 19: the round's starting model is not held beside the aggregate).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedhop.common import timing
from fedhop.common.engine.api import SETUP_ROUND, Algorithm, NodeContext
from fedhop.common.engine.base import BaseComm
from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.spill import Spiller, dropping, spiller
from fedhop.common.engine.state_io import StateSnapshot, check_savable, snapshot_state
from fedhop.common.wire.bundle import Bundle

log = logging.getLogger("fedhop.engine")

Commit = Callable[[int, Any], None]


class RoundFailed(RuntimeError):
    """A round that could not be trained as specified (too few participants after its retries)."""


@dataclass(frozen=True)
class Start:
    """Where a run starts: ``state`` None = fresh (init + setup); else resume at round ``next_round``."""

    next_round: int = 0
    state: Any = None


def drive(algo: Algorithm, ctx: NodeContext, start: Start = Start(), commit: Commit | None = None,
          on_redo: Callable[[int, int], None] | None = None, events: RunEvents | None = None,
          spill_bytes: int = 0) -> tuple[Bundle, Any]:
    """Run ``algo`` on the PS context ``ctx`` from ``start``; returns (final model, final state).

    ``events`` gets round_started / round_ended around every round (see ``events.py``). ``spill_bytes``: the
    state's tensors are spilled at each round's start when they hold at least this many bytes (0: never; see
    the module's docstring)."""
    events = events or RunEvents()
    spill = spiller(algo, spill_bytes)
    t0 = start.next_round
    state = start.state
    if state is None:
        t0 = 0
        state = ctx.state = algo.init(ctx)
        check_savable(state, f"algorithm {algo.name!r}: the state init returned")  # before round 1, naming the field
        if algo.setup is not None:
            state = ctx.state = _timed(events, ctx, SETUP_ROUND,
                                       lambda: _attempt(algo, ctx, SETUP_ROUND, state, algo.setup, on_redo, spill))
            if commit is not None:
                commit(SETUP_ROUND, state)
    ctx.state = state
    for t in range(t0, ctx.spec.rounds):
        state = ctx.state = _timed(events, ctx, t,
                                   lambda t=t, s=state: _attempt(algo, ctx, t, s, algo.round, on_redo, spill))
        if commit is not None:
            commit(t, state)
    drain = getattr(ctx.comm, "drain", None)
    if drain is not None:  # replies to submitted tasks nobody collected: received and counted, not used
        drain()
    return algo.final(ctx, state), state


def _timed(events: RunEvents, ctx: NodeContext, t: int, step: Callable[[], Any]) -> Any:
    events.emit("round_started", round=t)
    timing.event("round", round=t)
    t0 = time.perf_counter()
    state = step()
    timing.event("round_end", round=t)
    records = getattr(ctx.reporter, "records", None) or [{}]
    record = records[-1] if records[-1].get("round") == t + 1 else {}
    events.emit("round_ended", round=t, record=record, duration_s=time.perf_counter() - t0)
    return state


def _attempt(algo: Algorithm, ctx: NodeContext, t: int, state: Any, step: Callable[[NodeContext, Any], Any],
             on_redo: Callable[[int, int], None] | None, spill: Spiller | None = None) -> Any:
    transport = ctx.spec.transport
    retries = transport.round_retries
    comm = ctx.comm
    base = comm if isinstance(comm, BaseComm) else None
    spilled = spill.spill(state) if spill is not None and base is not None else None  # before the snapshot
    before = snapshot_state(state, share_tensors=algo.round_replaces_tensors) \
        if retries > 0 and comm.can_fail else None
    with dropping(base, spilled):
        return _tries(algo, ctx, t, state, step, on_redo, before)


def _tries(algo: Algorithm, ctx: NodeContext, t: int, state: Any, step: Callable[[NodeContext, Any], Any],
           on_redo: Callable[[int, int], None] | None, before: StateSnapshot | None) -> Any:
    """The round ``t`` and its retries (``before``: the state to redo it from)."""
    transport = ctx.spec.transport
    retries = transport.round_retries
    for attempt in range(retries + 1):
        ctx.round = t
        ctx.comm.begin_round(t)
        new = step(ctx, state)
        if type(new) is not type(state):
            raise TypeError(f"{algo.name}: round {t + 1} returned a {type(new).__name__}, not the "
                            f"{type(state).__name__} it was given (the state's type is fixed for the run)")
        sent, ok = ctx.comm.round_counts()
        need = min(transport.min_participants, sent)
        if ok >= need:
            return new
        what = "set-up step" if t == SETUP_ROUND else f"round {t + 1}"
        if attempt == retries:
            raise RoundFailed(f"{what}: {ok} usable replies of {sent} tasks, fewer than "
                              f"transport.min_participants = {transport.min_participants}, after {retries} "
                              f"retries (see missing.csv for who failed and why)")
        log.warning("%s: %d usable replies of %d tasks (min_participants %d); redoing it (retry %d of %d)",
                    what, ok, sent, transport.min_participants, attempt + 1, retries)
        if on_redo is not None:
            on_redo(t, attempt)
        assert before is not None
        state = before.restore()
    raise AssertionError("unreachable")
