"""How role processes end when an orchestrator watches them (``docker compose up --exit-code-from ps``).

Compose's ``--exit-code-from ps`` implies ``--abort-on-container-exit``: the first container to exit stops all
the others (SIGTERM). Children end on their parent's Bye, which comes before the PS has written its run folder,
so a child that exited then would have the PS killed mid-write. Hence:

- a child :func:`linger`\\ s after a clean end until the PS's health service stops serving (the PS stops its
  gRPC server only after its results are written), and
- the PS, stopped by SIGTERM after that point, exits 0 (:func:`exit_zero_on_sigterm_once_written`); stopped
  earlier, it exits 143 as any interrupted process would.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from fedhop.transport.credentials import PLAINTEXT, Security

log = logging.getLogger("fedhop.lifecycle")

# write_run_folder writes these last; both present and newer than this process means the run is on disk.
WRITTEN_LAST = ("results.json", "plots.png")


def results_written(out: Path, since: float) -> bool:
    """Whether the run folder ``out`` holds a complete result written after ``since`` (a ``time.time()``)."""
    try:
        return all((out / f).stat().st_mtime >= since for f in WRITTEN_LAST)
    except FileNotFoundError:
        return False


def exit_zero_on_sigterm_once_written(out: Path) -> None:
    """Install a SIGTERM handler for the PS: exit 0 when the run folder is complete, else 143."""
    started = time.time()

    def on_term(signum: int, frame: FrameType | None) -> None:
        done = results_written(out, started)
        log.warning("ps: SIGTERM %s", "after the results were written; exiting 0" if done else "during the run")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if done else 128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)


def linger(node: str, rc: int, until: str | None, timeout_s: float, security: Security = PLAINTEXT) -> int:
    """After a clean end (``rc == 0``) wait until ``until``'s health service stops serving (reached with
    ``security``, the node's own credentials); returns ``rc``."""
    if rc != 0 or not until:
        return rc
    from fedhop.transport.health import wait_until_gone

    log.info("%s: done; staying up until %s has finished (at most %gs)", node, until, timeout_s)
    if not wait_until_gone(until, timeout_s, security):
        log.warning("%s: %s still serving after %gs; exiting anyway", node, until, timeout_s)
    return rc
