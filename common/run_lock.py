"""One process per run folder: the PS (``fedhop server``, ``launch``) or ``fedhop simulate`` holds its run folder
while it runs, so a second one on the same folder (``fedhop server --resume RUN`` twice, ``--out RUN --force``
into a running run) is refused at once, naming the process that holds it.

How: an exclusive ``fcntl.flock`` on ``<run folder>/.fedhop.lock``, taken without waiting, with the holder's
pid, host, command and start time written in the file. flock rather than a pid file checked for liveness
because the kernel releases a flock however its holder ends (SIGKILL and OOM kill included), atomically, so
there is no stale lock to clean up, no race between two processes taking over the same stale file, and no pid
reuse to be fooled by. The file's contents only name the holder: a process that takes the lock and finds
another process's record in it (its holder died without releasing it) says so in one log line. Limits: flock
is per host on network file systems older than NFSv4 (two hosts sharing one run folder over NFSv3 are not
kept apart); a forked child does not keep its parent's lock (:func:`os.register_at_fork` closes the inherited
descriptor), and a new interpreter never inherits it (the descriptor is not inheritable).

Torch-free; a refusal is a :class:`~fedhop.common.exit_codes.Fatal` with exit code 2 (USAGE).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhop.common.exit_codes import ExitCode, Fatal

log = logging.getLogger("fedhop.run_lock")

LOCK_FILE = ".fedhop.lock"


class RunFolderLocked(Fatal):
    """Another live process holds the run folder (exit code 2: USAGE); ``holder``: its record (pid, host, ...)."""

    def __init__(self, folder: Path, holder: dict[str, Any]) -> None:
        pid = holder.get("pid")
        who = f"process {pid}" if pid is not None else "another process"
        where = f" on {holder['host']}" if holder.get("host") and holder.get("host") != socket.gethostname() else ""
        cmd = f" ({holder['command']})" if holder.get("command") else ""
        since = f", since {holder['since']}" if holder.get("since") else ""
        super().__init__(ExitCode.USAGE, f"the run folder {folder} is in use by {who}{where}{cmd}{since}: one "
                                         "process runs a run folder at a time; wait for it to end or stop it, or "
                                         "choose another --out")
        self.folder = folder
        self.holder = holder


@dataclass
class RunLock:
    """A held run folder (:func:`acquire`); :meth:`release` gives it back (also done by the kernel at exit)."""

    folder: Path
    fd: int
    count: int = field(default=1)  # nested acquisitions of the same folder by this process

    def release(self) -> None:
        with _REGISTRY_LOCK:
            self.count -= 1
            if self.count > 0:
                return
            _HELD.pop(_key(self.folder), None)
            fd, self.fd = self.fd, -1
        if fd < 0:
            return
        with contextlib.suppress(OSError):
            _write_record(self.folder, b"")  # no record left: the next holder takes over nothing
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


_HELD: dict[str, RunLock] = {}  # realpath of a folder -> this process's lock on it
_REGISTRY_LOCK = threading.Lock()


def _key(folder: Path) -> str:
    return os.path.realpath(folder)


def _forget_in_child() -> None:
    """After a fork: the child closes its copies of the parent's lock descriptors (the parent keeps the locks)."""
    for lock in list(_HELD.values()):
        with contextlib.suppress(OSError):
            os.close(lock.fd)
        lock.fd, lock.count = -1, 0
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _record(fd: int) -> dict[str, Any]:
    """The holder's record in an open lock file ({} when empty or unreadable)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 65536)
        data = json.loads(raw) if raw.strip() else {}
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _open(folder: Path) -> int:
    """The lock file, opened read-only (created if missing): the lock is held on a descriptor that does not
    write, so that the folder's file system can still be remounted read-only under a running PS (Linux refuses
    while a file on it is open for writing); its record is written through a descriptor closed at once."""
    return os.open(folder / LOCK_FILE, os.O_RDONLY | os.O_CREAT, 0o644)


def _write_record(folder: Path, data: bytes) -> None:
    fd = os.open(folder / LOCK_FILE, os.O_WRONLY)
    try:
        os.ftruncate(fd, 0)
        if data:
            os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def acquire(folder: Path, what: str | None = None) -> RunLock:
    """Hold ``folder`` (created if missing) for this process: :class:`RunFolderLocked` at once when another
    process holds it; a Fatal with RUN_FOLDER (10) when its lock file cannot be created. ``what``: the holder's
    command as a refusal names it (default: this command line). This process may hold it again (nested: each
    acquisition is released once)."""
    with _REGISTRY_LOCK:
        mine = _HELD.get(_key(folder))
        if mine is not None:
            mine.count += 1
            return mine
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = _open(folder)
        except OSError as e:  # as check_run_folder words it (server/main.py): exit code RUN_FOLDER
            raise Fatal(ExitCode.RUN_FOLDER, f"the run folder {folder} cannot be written ({e.strerror or e}); "
                                             "choose another --out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunFolderLocked(folder, holder) from None
        except BaseException:
            os.close(fd)
            raise
        previous = _record(fd)
        if previous.get("pid") not in (None, os.getpid()):
            log.warning("run folder %s: taking over the lock of process %s (%s, since %s), which ended without "
                        "releasing it", folder, previous.get("pid"), previous.get("command", "?"),
                        previous.get("since", "?"))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "command": what or " ".join(sys.argv),
              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            _write_record(folder, json.dumps(me).encode() + b"\n")
        except OSError as e:  # a full disk: the lock holds all the same, only its record is missing
            log.warning("run folder %s: the lock's record could not be written (%s)", folder, e.strerror or e)
        lock = _HELD[_key(folder)] = RunLock(folder, fd)
        return lock


def _read_holder(fd: int) -> dict[str, Any]:
    """The holder's record; it writes it just after taking the lock, so an empty one is read again briefly."""
    for _ in range(20):
        rec = _record(fd)
        if rec:
            return rec
        time.sleep(0.01)
    return {}


def check_free(folder: Path) -> None:
    """:class:`RunFolderLocked` when another process holds ``folder`` (nothing is held or created here)."""
    if not (folder / LOCK_FILE).is_file() or _key(folder) in _HELD:
        return
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free if a shared lock can be had
        except BlockingIOError:
            raise RunFolderLocked(folder, _read_holder(fd)) from None
        except OSError:
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold(folder: Path | None, what: str | None = None) -> Iterator[RunLock | None]:
    """:func:`acquire` ``folder`` for the block (nothing when None)."""
    if folder is None:
        yield None
        return
    lock = acquire(folder, what)
    try:
        yield lock
    finally:
        lock.release()
