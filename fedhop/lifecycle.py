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
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from fedhop.transport.credentials import PLAINTEXT, Security

log = logging.getLogger("fedhop.lifecycle")

# write_run_folder writes these last; both (re)written since this process started means the run is on disk.
WRITTEN_LAST = ("results.json", "plots.png")


@dataclass(frozen=True)
class FileStamp:
    """What the file system says about one file; any write or replacement of the file changes it."""

    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileStamp | None:
        """The file's stamp, or None when there is no such file."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return cls(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class ResultsWatch:
    """The run folder's last-written files as they were when the process started.

    The result counts as written once every one of :data:`WRITTEN_LAST` exists and differs from its stamp at the
    start. Nothing compares a file's time with the clock: the kernel stamps files from a coarse clock, so a file
    written right after the start can carry an mtime *before* a ``time.time()`` taken at the start.
    """

    out: Path
    before: tuple[FileStamp | None, ...]

    @classmethod
    def start(cls, out: Path) -> ResultsWatch:
        return cls(out, tuple(FileStamp.of(out / f) for f in WRITTEN_LAST))

    def written(self) -> bool:
        """Whether the run folder holds a complete result written since :meth:`start`."""
        now = [FileStamp.of(self.out / f) for f in WRITTEN_LAST]
        return all(n is not None and n != b for n, b in zip(now, self.before, strict=True))


def exit_zero_on_sigterm_once_written(out: Path) -> None:
    """Install a SIGTERM handler for the PS: exit 0 when the run folder is complete, else 143."""
    watch = ResultsWatch.start(out)

    def on_term(signum: int, frame: FrameType | None) -> None:
        done = watch.written()
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
