"""When the PS counts its run folder as written (fedhop/lifecycle.py), without a process: the SIGTERM paths
themselves are in tests/integration/test_lifecycle.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fedhop.lifecycle import WRITTEN_LAST, ResultsWatch


def write(out: Path, text: str = "x") -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in WRITTEN_LAST:
        (out / f).write_text(text)


def test_a_result_stamped_before_the_start_by_the_coarse_clock_counts(tmp_path: Path) -> None:
    """The kernel stamps mtimes from a coarse clock (a tick of up to several ms): a file written right after the
    start can carry an mtime earlier than a ``time.time()`` taken at the start. Here that is made certain: the
    files' mtimes are set to a moment before the start. (A check of ``mtime >= time.time() at the start``, the old
    one, answers False here.)"""
    out = tmp_path / "run"
    started = time.time()
    watch = ResultsWatch.start(out)
    assert not watch.written()
    write(out)
    coarse = started - 0.004
    for f in WRITTEN_LAST:
        os.utime(out / f, (coarse, coarse))
        assert (out / f).stat().st_mtime < started
    assert watch.written()


def test_a_partial_result_does_not_count(tmp_path: Path) -> None:
    out = tmp_path / "run"
    watch = ResultsWatch.start(out)
    out.mkdir()
    (out / WRITTEN_LAST[0]).write_text("x")
    assert not watch.written()
    (out / WRITTEN_LAST[-1]).write_text("x")
    assert watch.written()


def test_stale_results_count_only_once_rewritten(tmp_path: Path) -> None:
    out = tmp_path / "run"
    write(out, "old")
    for f in WRITTEN_LAST:
        os.utime(out / f, (1, 1))
    watch = ResultsWatch.start(out)
    assert not watch.written()  # an earlier run's folder, untouched
    write(out, "the new run")
    for f in WRITTEN_LAST:
        os.utime(out / f, (1, 1))  # even with the old mtime: the file was written again (here: its size)
    assert watch.written()
