"""Run a fedhop command under cProfile in every thread, and write the merged profile (CPU time) at exit.

    python tests/bench/profile_process.py OUT.prof server spec.toml --out run ...   # as ``python -m fedhop ...``

``cProfile`` on its own sees the main thread only; a PS does its work on the asyncio server's loop thread
(``grpc-aio``), the session workers, the round's thread and the keep-alive thread. Here each thread gets a profiler
of its own when it starts (``threading.setprofile``), and at exit their statistics are merged into OUT.prof
(``pstats``; per thread too: OUT.prof.<thread name>). ``bench_many_clients.py --profile DIR`` runs the PS (and,
by hand, the client hosts) this way. Profiling slows Python down ~2x: compare profiles with profiles only.
"""

from __future__ import annotations

import atexit
import cProfile
import os
import pstats
import runpy
import sys
import threading
import time
from typing import Any

_profiles: list[tuple[str, cProfile.Profile]] = []
_lock = threading.Lock()


def _profiler() -> cProfile.Profile:
    """A profiler that counts the thread's CPU time (``time.thread_time_ns``): waiting (a queue's ``get``, the
    loop's ``epoll``, the GIL) costs nothing, so the totals are what the thread computed."""
    return cProfile.Profile(time.thread_time_ns, 1e-9)


def _start_in_thread(frame: Any, event: str, arg: Any) -> None:
    """The first profile event of a new thread: give it a profiler (which replaces this hook in that thread)."""
    prof = _profiler()
    with _lock:
        _profiles.append((threading.current_thread().name, prof))
    prof.enable()


_dumped: list[bool] = []


def _dump(path: str) -> None:
    if _dumped:
        return
    _dumped.append(True)
    _profiles[0][1].disable()
    merged: pstats.Stats | None = None
    with _lock:
        profiles = list(_profiles)
    for name, prof in profiles:
        try:
            prof.create_stats()
        except Exception:  # noqa: BLE001  (a thread's profiler that cannot be read: skip it)
            continue
        if not getattr(prof, "stats", None):
            continue
        stats = pstats.Stats(prof)
        if stats.total_tt < 0.05:  # type: ignore[attr-defined]
            continue
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
        stats.dump_stats(f"{path}.{safe}")
        if merged is None:
            merged = stats
        else:
            merged.add(stats)
    if merged is not None:
        merged.dump_stats(path)


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    path = sys.argv[1]
    sys.argv = ["fedhop", *sys.argv[2:]]
    prof = _profiler()
    _profiles.append(("MainThread", prof))
    threading.setprofile(_start_in_thread)
    atexit.register(_dump, path)
    real_exit = os._exit

    def exit_after_dump(rc: int) -> None:  # a role leaves with os._exit (fedhop/cli/console.py: exit_now)
        _dump(path)
        real_exit(rc)

    os._exit = exit_after_dump  # type: ignore[assignment]
    prof.enable()
    try:
        runpy.run_module("fedhop", run_name="__main__", alter_sys=True)
    finally:
        prof.disable()


if __name__ == "__main__":
    main()
