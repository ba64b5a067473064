"""Start ``fedhop`` role processes by forking a server that has already imported torch and fedhop.

A role process spends most of its start-up importing torch (2-3 CPU-seconds here); ``launch`` starts one per
edge and client host, so on a small machine a federation of six processes took half a minute to come up
(measured under load: 34 s for six interpreter starts against 6.6 s forked). Python's ``forkserver`` start
method keeps one clean process that imported the modules below and forks each child from it: the children
are ordinary processes with their own pid (killable, stoppable, each in its own session as before) that run
``fedhop <role> ...`` exactly as the command line would, with the caller's working directory, environment
and ``sys.path[0]``; their standard output and error go to their log file.

The server is a fresh interpreter (it is *not* forked from the caller), so no thread, gRPC channel or CUDA
context of the caller reaches a child. What the server imported was configured by its own environment at
its start: :func:`_become` re-reads the few settings fedhop takes from the environment at import time.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import setproctitle

# imported once by the server, shared copy-on-write by every child
PRELOAD = ["torch", "numpy", "grpc", "sklearn.datasets", "fedhop.cli", "fedhop.cli.roles", "fedhop.common.algorithms",
           "fedhop.client.host", "fedhop.client.main", "fedhop.edge.node", "fedhop.server.main",
           "fedhop.transport.parent", "fedhop.transport.child"]
FEDHOP = ("-m", "fedhop")
# what `python -m fedhop ARGS` runs (fedhop/__main__.py), named rather than imported: the launcher (this layer)
# does not import the command line that sits above it; a child resolves it by name (:func:`resolve_entry`)
ENTRY = "fedhop.cli:main"

# environment variables that torch, OpenMP, gRPC or Python itself read when they are imported or start: a child
# that needs other values than the server had cannot be forked from it
IMPORT_TIME_ENV = ("GRPC_", "OMP_", "MKL_", "KMP_", "GOMP_", "PYTHON", "LD_", "MALLOC_", "TORCH_")
NOT_AT_IMPORT = {"PYTHONUNBUFFERED"}  # applied by _become

_ctx: Any = None
_server_env: dict[str, str] = {}  # the caller's environment when the server started
_server_defaults: dict[str, str] | None = None  # what the server's own imports added to it (see server_defaults)
_live: weakref.WeakSet[ForkedChild] = weakref.WeakSet()


def context() -> Any:
    """The forkserver context; its server (preloading :data:`PRELOAD`) is started on first use, once per
    process, with the environment of that moment."""
    global _ctx
    if _ctx is None:
        from multiprocessing import forkserver

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _server_env.update(os.environ)
        forkserver.ensure_running()
        _ctx = ctx
    return _ctx


def warm() -> None:
    """Start the server now, so that its imports overlap the caller's own set-up."""
    context()


def _send_environ(conn: Any) -> None:
    conn.send(dict(os.environ))
    conn.close()


def server_defaults() -> dict[str, str]:
    """The variables that the server's imports of :data:`PRELOAD` set themselves (scikit-learn sets
    ``KMP_DUPLICATE_LIB_OK`` and ``KMP_INIT_AT_FORK`` with ``os.environ.setdefault``), read once from a forked
    probe. The caller gets the same defaults when it imports those modules itself, usually after the server
    started: they are no difference between the two."""
    global _server_defaults
    if _server_defaults is None:
        ctx = context()
        receive, send = ctx.Pipe(duplex=False)
        probe = ctx.Process(target=_send_environ, args=(send,), daemon=True)
        probe.start()
        send.close()
        try:
            env: dict[str, str] = receive.recv()
        finally:
            receive.close()
            probe.join()
        _server_defaults = {k: v for k, v in env.items() if k not in _server_env}
    return _server_defaults


def import_time_differences(env: dict[str, str]) -> list[str]:
    """The variables of :data:`IMPORT_TIME_ENV` on which ``env`` and the server's environment differ (the
    server is started now if it is not running). A variable that the server's imports set by default
    (:func:`server_defaults`) differs only where ``env`` gives it another value."""
    context()
    defaults = server_defaults()
    server = {**_server_env, **defaults}
    mine = {**defaults, **env}
    keys = {k for k in {*mine, *server} if k.startswith(IMPORT_TIME_ENV) and k not in NOT_AT_IMPORT}
    return sorted(k for k in keys if mine.get(k) != server.get(k))


def fedhop_argv(cmd: list[str]) -> list[str] | None:
    """The arguments after ``python -m fedhop`` when ``cmd`` is such a command line, else None."""
    if len(cmd) >= 3 and cmd[0] == sys.executable and tuple(cmd[1:3]) == FEDHOP:
        return cmd[3:]
    return None


def resolve_entry(entry: str) -> Callable[[list[str]], int]:
    """The function a ``"package.module:function"`` name points to (imported now)."""
    module, sep, name = entry.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"entry point {entry!r} is not 'package.module:function'")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise TypeError(f"entry point {entry!r} is not a function")
    return fn


def _become(entry: str, argv: list[str], log: str, cwd: str, env: dict[str, str]) -> None:
    """In the forked child: take the caller's place (session, directory, environment, log) and run ``entry``
    (``fedhop``'s command line) with ``argv``."""
    # what `ps` showed for a spawned child (before the environment is replaced: setproctitle takes the
    # memory of the original argv and environ strings)
    setproctitle.setproctitle(" ".join([sys.executable, *FEDHOP, *argv]))
    os.setsid()  # like Popen(start_new_session=True): Ctrl-C reaches the launcher, which then stops us
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout.reconfigure(line_buffering=True)  # what PYTHONUNBUFFERED=1 gave a spawned child
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[0] = cwd  # `python -m` puts the working directory first: user code (`pkg.module:fn`) imports
    sys.argv = ["fedhop", *argv]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    from fedhop.common import heap, timing

    timing.configure_from_env()
    heap.claim()  # a role process is fedhop's own: it settles its heap once joined (common/heap.py)
    sys.exit(resolve_entry(entry)(argv))


class ForkedChild:
    """A forked ``fedhop`` process with the part of :class:`subprocess.Popen`'s interface launch uses: it runs
    ``entry`` (by name, default :data:`ENTRY`, the command line) with ``argv``."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str], entry: str = ENTRY) -> None:
        self.args = argv
        self._p = context().Process(target=_become, args=(entry, argv, str(log), os.getcwd(), env), daemon=False)
        self._p.start()
        self.pid: int = self._p.pid
        _live.add(self)

    @property
    def returncode(self) -> int | None:
        return self._p.exitcode

    def poll(self) -> int | None:
        return self._p.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self._p.exitcode

    def send_signal(self, sig: int) -> None:
        if self._p.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@atexit.register
def _kill_left_over() -> None:
    """Children still running when the caller exits are killed (a spawned child in its own session would
    have outlived it; multiprocessing would otherwise wait for them to end)."""
    for child in list(_live):
        child.kill()
