"""Light timers for the round wall-time breakdown (tests/bench/bench_round_breakdown.py; issues 8 and 11).

Off unless the environment names a folder in ``FEDHOP_TIMERS``; then each process appends what it measured
to ``<folder>/<node>-<pid>.jsonl`` when it exits: events with a ``time.monotonic()`` stamp (one clock for
every process of a machine on Linux, so a parent's and a child's events line up) and the process's CPU seconds
so far (``cpu``: ``time.process_time()``, all its threads), and the seconds it spent in the codec, summed over its
threads. When off, every hook is one boolean test.

Events: ``call`` (a parent sent a Task: call id, child, task), ``reply`` (the parent holds the whole Result),
``task_in`` (a child holds the whole Task), ``run`` / ``ran`` (the child's handler started / returned),
``round`` / ``round_end`` (the driver's round loop). Sums: ``encode_s`` (checksum + chunk frames),
``decode_s`` (copying + checksum into the decode buffer).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

FOLDER: str | None = None
ENABLED = False

_lock = threading.Lock()
_events: list[dict[str, Any]] = []
_sums: defaultdict[str, float] = defaultdict(float)
_node = ["?"]


def set_node(node: str) -> None:
    """Name this process's file after its node id."""
    _node[0] = node


def event(kind: str, **data: Any) -> None:
    if ENABLED:
        with _lock:
            _events.append({"kind": kind, "t": time.monotonic(), "cpu": time.process_time(), **data})


def add(category: str, seconds: float) -> None:
    if ENABLED:
        with _lock:
            _sums[category] += seconds


def _dump() -> None:
    if not ENABLED or not (_events or _sums):
        return
    path = Path(FOLDER) / f"{_node[0]}-{os.getpid()}.jsonl"  # type: ignore[arg-type]
    with _lock, path.open("a") as f:
        f.write(json.dumps({"kind": "sums", "node": _node[0], **_sums}) + "\n")
        for e in _events:
            f.write(json.dumps({"node": _node[0], **e}) + "\n")


def flush() -> None:
    """Write what was measured so far (and start over): for a process that ends with ``os._exit``."""
    _dump()
    with _lock:
        _events.clear()
        _sums.clear()


def configure_from_env() -> None:
    """Read ``FEDHOP_TIMERS`` (again): at import, and in a process forked from one that imported this module
    under another environment (fedhop/forkstart.py)."""
    global FOLDER, ENABLED
    FOLDER = os.environ.get("FEDHOP_TIMERS") or None
    ENABLED = FOLDER is not None
    if ENABLED:
        Path(FOLDER).mkdir(parents=True, exist_ok=True)  # type: ignore[arg-type]
        atexit.unregister(_dump)
        atexit.register(_dump)


configure_from_env()
