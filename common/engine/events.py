"""Lifecycle events of a run (NVFlare's event model, reduced): the feed for status pages and metrics.

The engine emits, in this order for a run:

    run_started   {"run_id", "spec" (RunSpec JSON dict), "nodes" (every node id), "resumed_at" (round index)}
    node_joined   {"node", "role"}                 (networked engine; any time, also for a node that rejoins)
    node_lost     {"node", "reason"}
    round_started {"round"}                        (0-based; -1 = an algorithm's set-up step)
    round_ended   {"round", "record", "duration_s"}  (record: what the round reported, 1-based "round" inside)
    links         {"rows"}                         (meter rows so far: src, dst, kind, phase, round, bytes)
    missing       {"entry"}                        (one missing-log entry)
    run_finished  {"ok", "wall_s", "error"}

Listeners are called synchronously in the emitting thread and must be quick; an exception in a listener is
logged and never reaches the run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fedhop.events")

Listener = Callable[[str, dict[str, Any]], None]
KINDS = ("run_started", "node_joined", "node_lost", "round_started", "round_ended", "links", "missing",
         "run_finished")


class RunEvents:
    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    def subscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

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
