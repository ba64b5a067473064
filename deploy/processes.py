"""The one process supervisor of the testbeds: start role processes with their output in ``logs/<name>.log``,
wait for them, report the first that died early, signal one, stop them all.

``fedhop launch`` starts its children through a fork server (:class:`fedhop.launch.Processes` passes a
``forker``); the namespace testbed wraps each command in ``ip netns exec NS``. Every child runs in its own
session (Ctrl-C reaches the supervisor, which then stops the children).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol


class Child(Protocol):
    """A started process: :class:`subprocess.Popen` or a forked one (fedhop/forkstart.py)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


# (name, command, log file, environment) -> a child started another way, or None: start a new process
Forker = Callable[[str, list[str], Path, dict[str, str]], Child | None]


class Processes:
    """The child processes of a federation, by name (a node id, ``proxy-edge-0``, ...)."""

    def __init__(self, logs: Path, forker: Forker | None = None) -> None:
        self.logs = logs
        self.forker = forker
        self.procs: dict[str, Child] = {}
        self._files: list[IO[bytes]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
              pass_fds: tuple[int, ...] = ()) -> Child:
        """Start ``cmd`` (with ``env`` added to this process's environment) as ``name``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log_file = self.logs / f"{name}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        p = self.forker(name, cmd, log_file, full_env) if self.forker is not None and not pass_fds else None
        if p is None:
            f = log_file.open("wb")
            self._files.append(f)
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=full_env,
                                 start_new_session=True, pass_fds=pass_fds)
        self.procs[name] = p
        return p

    def wait(self, timeout_s: float) -> dict[str, int | None]:
        """Exit codes after waiting up to ``timeout_s`` in all (None: still running)."""
        end = time.monotonic() + timeout_s
        out: dict[str, int | None] = {}
        for n, p in self.procs.items():
            try:
                out[n] = p.wait(max(0.01, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                out[n] = None
        return out

    def startup_failure(self) -> str | None:
        """Why the federation cannot start: the first child that has already exited, with its log's tail."""
        for n, p in self.procs.items():
            code = p.poll()
            if code is not None:
                tail = (self.logs / f"{n}.log").read_text(errors="replace").strip().splitlines()[-8:]
                return f"{n} exited with code {code} before the run started; its log ends:\n  " + "\n  ".join(tail)
        return None

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[name]
        if p.poll() is None:
            p.send_signal(sig)

    def stop(self, grace_s: float) -> None:
        """SIGTERM to every child still running, SIGKILL to those still there ``grace_s`` later; close the logs."""
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        end = time.monotonic() + grace_s
        for p in self.procs.values():
            try:
                p.wait(max(0.01, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(grace_s)
        for f in self._files:
            f.close()
        self._files.clear()

    def kill_all(self) -> None:
        """:meth:`stop` with 3 s of grace."""
        self.stop(3.0)
