"""Lifecycle events of a run (NVFlare's event model, reduced): the one progress channel of a run.

Both engines emit them through their :class:`~fedhop.common.engine.run.Run`; the progress bar, the live page's
RunStatus (``server/web/status.py``), /metrics and the reproductions' bars subscribe. In this order for a run:

    run_started   {"run_id", "spec" (RunSpec JSON dict), "nodes" (every node id), "resumed_at" (round index)}
    node_joined   {"node", "role"}                 (any time, also for a node that rejoins)
    node_ready    {"node", "data_sizes"}           (a child of the PS is ready: its clients' data sizes)
    node_lost     {"node", "reason"}
    round_started {"round"}                        (0-based; -1 = an algorithm's set-up step)
    round_ended   {"round", "record", "duration_s"}  (record: what the round reported, 1-based "round" inside;
                                                      {} when it reported nothing)
    links         {"rows", "rounds", "totals"}     (rows: every meter row so far: src, dst, kind, phase, round,
                                                      bytes; rounds: {round: its rows} for each round whose rows
                                                      changed since the last links event (all of them in the
                                                      first; [] for a round that has none left); totals:
                                                      messages, payload_bytes, message_bytes over every row)
    missing       {"entry"}                        (one missing-log entry)
    round_timeline {"round", "rows"}               (after the round's commit: where its time went, the rows of
                                                      timeline.csv for that round: round, node, peer, phase,
                                                      seconds; common/timeline.py)
    run_finished  {"ok", "wall_s", "error"}

``links`` and ``missing`` follow every round's commit and come once more before ``run_finished`` (the
algorithm's ``final`` and the children's last meter rows may add to them); ``round_timeline`` follows them after
each round's commit. The in-process engine's nodes join
and are ready right after ``run_started``.

Listeners are called synchronously in the emitting thread and must be quick; an exception in a listener is
logged and never reaches the run. :func:`round_records` and :func:`readiness` adapt a plain callback.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fedhop.events")

Listener = Callable[[str, dict[str, Any]], None]
KINDS = ("run_started", "node_joined", "node_ready", "node_lost", "round_started", "round_ended", "links",
         "missing", "round_timeline", "run_finished")


class RunEvents:
    """One run's event stream: ``subscribe(listener)``, then the run ``emit``s."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Add ``listener(kind, data)``; returns a function that removes it again."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return unsubscribe

    def emit(self, kind: str, **data: Any) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(KINDS)}")
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(kind, data)
            except Exception:  # a status page must never stop a run
                log.exception("event listener failed on %s", kind)


def round_records(fn: Callable[[dict[str, Any]], None]) -> Listener:
    """A listener that calls ``fn(record)`` when a round (not the set-up step) ends: what the round reported
    (1-based ``round``, its metrics, ``elapsed_s``, ``round_s``), or ``{"round": t + 1}`` if it reported nothing.
    For progress displays."""

    def listener(kind: str, data: dict[str, Any]) -> None:
        if kind == "round_ended" and data["round"] >= 0:
            fn(data.get("record") or {"round": data["round"] + 1})
    return listener


def readiness(fn: Callable[[str, dict[str, int]], None]) -> Listener:
    """A listener that calls ``fn(child, its clients' data sizes)`` when a child of the PS is ready."""

    def listener(kind: str, data: dict[str, Any]) -> None:
        if kind == "node_ready":
            fn(data["node"], dict(data["data_sizes"]))
    return listener
