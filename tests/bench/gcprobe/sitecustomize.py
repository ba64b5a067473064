"""Where a process's time in Python's garbage collector goes, for any benchmark (issue 19, "The collector at 10,000").

Put this folder first on ``PYTHONPATH`` and set ``GCSTATS_DIR``: every Python process started with that environment
(a benchmark and the ``fedhop`` processes it starts) times each collection through ``gc.callbacks`` and, every
second, writes ``GCSTATS_DIR/<pid>.json``: its command line, per generation [collections, seconds, objects
collected], each full collection as [epoch time, seconds, extra], and a series of [epoch time, seconds in the
collector so far] (to cut out a round's window). ``GCSTATS_DISABLE=1``: ``gc.disable()`` at start (what the
collector costs, at most). ``GCSTATS_THRESHOLD=a,b,c``: ``gc.set_threshold(a, b, c)`` at start.
``GCSTATS_TYPES=1``: after each full collection, the size of the oldest generation,
the frozen count and its 12 commonest types (slow: diagnosis only). Seconds are wall time: under CPU contention
they include waits.

    GCSTATS_DIR=/tmp/gc PYTHONPATH=tests/bench/gcprobe python tests/bench/bench_many_clients.py --clients 10000 \\
        --rounds 2 --by-hand --baseline
"""

import os

if os.environ.get("GCSTATS_DIR"):
    import collections
    import gc
    import json
    import sys
    import threading
    import time

    if os.environ.get("GCSTATS_DISABLE"):
        gc.disable()
    if os.environ.get("GCSTATS_THRESHOLD"):  # e.g. 50000,20,100: gc.set_threshold at start (an experiment)
        gc.set_threshold(*(int(x) for x in os.environ["GCSTATS_THRESHOLD"].split(",")))
    _start: dict[int, float] = {}
    _per_gen = {0: [0, 0.0, 0], 1: [0, 0.0, 0], 2: [0, 0.0, 0]}
    _full: list = []
    _series: list = []

    def _timed(phase: str, info: dict) -> None:
        g = info["generation"]
        if phase == "start":
            _start[g] = time.perf_counter()
            return
        took = time.perf_counter() - _start.get(g, time.perf_counter())
        acc = _per_gen[g]
        acc[0] += 1
        acc[1] += took
        acc[2] += info.get("collected", 0)
        if g == 2:
            extra = None
            if os.environ.get("GCSTATS_TYPES"):
                objs = gc.get_objects(2)
                extra = [len(objs), gc.get_freeze_count(),
                         collections.Counter(type(o).__qualname__ for o in objs).most_common(12)]
                del objs
            _full.append((time.time(), round(took, 4), extra))

    gc.callbacks.append(_timed)

    def _dump() -> None:
        path = os.path.join(os.environ["GCSTATS_DIR"], f"{os.getpid()}.json")
        while True:
            time.sleep(1)
            _series.append((time.time(), round(sum(a[1] for a in _per_gen.values()), 4)))
            try:
                with open(path + ".tmp", "w") as f:
                    json.dump({"argv": sys.argv[:4], "gen": _per_gen, "big": _full, "series": _series,
                               "t": time.time()}, f)
                os.replace(path + ".tmp", path)
            except OSError:
                pass

    threading.Thread(target=_dump, daemon=True, name="gcstats").start()
