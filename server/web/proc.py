"""The web face in its own process, fed by the run's events over a pipe (issue 20: a flood of requests must not
slow training; a server thread in the run's process shares its GIL).

The run's process (the PS, ``fedhop simulate``) keeps its event stream as before (RunEvents, a RunStatus
subscribed). A :class:`WebProcess` subscribed to the same stream pickles each event with the time it was
emitted (``time.monotonic()``: one clock for every process of the machine) and one sender thread writes the
frames to the stdin of a child interpreter, ``python -m fedhop.server.web.proc`` (subprocess: fork + exec at
once, so nothing of the PS's gRPC threads lives on in it), which lowers its own priority (nice
:data:`~fedhop.server.web.serve.NICE`), builds its own RunStatus from those events on the parent's clock and
serves the same app (server/web/app.py: guard, token, limits, screening; serve.py's uvicorn thread). The parent
binds the listening socket and hands it over (``pass_fds``): it knows the address at once, and a taken port or a
token rule fails in the parent, before anything starts, with the same errors as the in-thread server.

Frames, parent -> child (the child's stdin): a 4-byte big-endian length, then a pickle of

    {"fd", "host", "token"}       first: the configuration (the token is never on a command line)
    (kind, data, t)               an event; t: the parent's time.monotonic() when it was emitted
    ("sync", n, None)             answered with {"synced": n} once every earlier event is applied

and child -> parent (its stdout), one JSON line each: ``{"ready": true, "port", "pid"}`` once it serves, then
the ``synced`` answers. Its stderr is the parent's (its log lines and any traceback land in the run's log).

The run never waits for the child: the listener pickles the event in the emitting thread (a snapshot, as the
in-process RunStatus takes one) and appends the bytes to a queue; the sender thread writes them. **No event is
ever dropped**: the page is exact (the same status, rounds, bytes as a RunStatus fed in-process, tested) or
absent; a drop-and-resync scheme would need a snapshot of the whole status in the run's process instead.
The queue is bounded by :data:`MAX_PENDING_BYTES` (64 MiB) of pickled events beyond the pipe's own buffer, or
:data:`LAG_FRAMES` times the largest event so far if that is more (most events are a few hundred bytes; a
``links`` event goes as the rounds whose rows changed since the last one, ~2 MiB a round at 10,000 clients,
and the child rebuilds every row from them, ``common/wire/meter.py`` :class:`RoundRows`, so a frame no longer
grows with the rounds run): a child that falls that far behind (stopped, swapped out) is ended with one log line,
like a dead one.

The child's death (killed, crashed) never reaches the run: the parent's watcher thread, blocked on the child's
stdout, sees it end and logs one line; the events are no longer sent and the run goes on without its page. It
is not restarted (a new child would need the run's events from the start). The parent's end (normal or
SIGKILL) closes the pipe: at EOF on its stdin the child stops serving and exits (no orphan; the run's other
children are started with subprocess's ``close_fds`` or from the fork server, so none of them holds the pipe).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fedhop.common.engine.events import RunEvents
from fedhop.server.web.serve import NICE, bind_socket, check_token, page_url

log = logging.getLogger("fedhop.http")

FRAME = struct.Struct(">I")
SYNC = "sync"
MAX_PENDING_BYTES = 64 << 20  # pickled events the child may lag behind before it is given up ...
LAG_FRAMES = 8  # ... or this many of the run's largest event, whichever is more
START_TIMEOUT_S = 30.0  # the child imports the web stack (about 0.5 s on an idle machine)
STOP_TIMEOUT_S = 5.0


class WebProcess:
    """The web face's child process and the parent's side of the pipe. Subscribe it to the run's events
    (:meth:`attach`); :meth:`stop` at the end. Made by :func:`start_web_process`."""

    def __init__(self, proc: subprocess.Popen[bytes], host: str, port: int, token: str | None,
                 clock: Callable[[], float], max_pending: int = MAX_PENDING_BYTES) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.host, self.port, self.token = host, port, token
        self._proc = proc
        self._stdin: IO[bytes] = proc.stdin
        self._clock = clock
        self._max_pending = max_pending
        self._cond = threading.Condition()
        self._emit_lock = threading.Lock()
        self._largest = 0  # the largest frame so far (a links event: the rows of the rounds it changed)
        self._queue: deque[bytes] = deque()
        self._pending = 0  # bytes queued or being written
        self._closing = False  # stop() was called: an exit of the child is expected
        self._done = False  # nothing more is sent (stopped, the child ended or was given up)
        self._ready: dict[str, Any] | None = None
        self._synced = 0
        self._sync_asked = 0
        self._unsubscribe: Callable[[], None] | None = None
        self._encode_cpu = 0.0
        self._thread_cpu: dict[str, float] = {}
        self.exit_code: int | None = None
        self.ended = threading.Event()  # set once the child has exited (for whatever reason)
        self._sender = threading.Thread(target=self._send, name="fedhop-web-send", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="fedhop-web-watch", daemon=True)

    # -- the parent's side ----------------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def url(self) -> str:
        return page_url(self.host, self.port)

    @property
    def alive(self) -> bool:
        """Whether events are still being sent to a running child."""
        with self._cond:
            return not self._done

    def attach(self, events: RunEvents) -> None:
        """Send every event of ``events`` from now on (:meth:`stop` detaches)."""
        self._unsubscribe = events.subscribe(self)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        """The listener: pickle the event (a snapshot, now) and queue it; never waits for the child."""
        if self._done:
            return
        with self._emit_lock:  # emitting threads queue in the order of their times
            t0 = time.thread_time()
            if kind == "links" and "rounds" in data:  # only the rounds that changed: the child keeps the rest
                data = {"rounds": data["rounds"], "totals": data.get("totals")}
            frame = _encode((kind, data, self._clock()))
            with self._cond:
                self._encode_cpu += time.thread_time() - t0
                if self._done:
                    return
                self._largest = max(self._largest, len(frame))
                bound = max(self._max_pending, LAG_FRAMES * self._largest)
                if self._pending + len(frame) > bound:
                    self._give_up(f"it fell {self._pending / 2**20:.0f} MiB of events behind")
                    return
                self._queue.append(frame)
                self._pending += len(frame)
                self._cond.notify_all()

    def sync(self, timeout_s: float = 10.0) -> bool:
        """Wait until the child has applied every event sent so far (tests, benchmarks): True, or False when
        the child is gone or ``timeout_s`` passed."""
        with self._cond:
            if self._done:
                return False
            self._sync_asked += 1
            n = self._sync_asked
            frame = _encode((SYNC, n, None))
            self._queue.append(frame)
            self._pending += len(frame)
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._synced >= n or self._done, timeout_s) and self._synced >= n

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Detach from the events, send what is queued, close the pipe (the child stops serving and exits) and
        wait for its exit (killed after ``timeout_s``)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._sender.join(timeout_s)
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("the live page's process (pid %d) did not stop in %.0f s: killed", self.pid, timeout_s)
            self._proc.kill()
            self._proc.wait()
        self._watcher.join(timeout_s)

    def parent_cpu_s(self) -> float:
        """CPU seconds this (the run's) process spent on the web face: pickling events in the emitting
        threads, the sender and watcher threads."""
        with self._cond:
            return self._encode_cpu + sum(self._thread_cpu.values())

    # -- threads --------------------------------------------------------------------------------------------------
    def _start(self, config: dict[str, Any], timeout_s: float) -> None:
        """Send the configuration, start the threads, wait for the child's ready line."""
        try:
            self._stdin.write(_encode(config))
            self._stdin.flush()
        except OSError:
            pass  # the child is gone already: the wait below says so
        self._watcher.start()
        self._sender.start()
        with self._cond:
            self._cond.wait_for(lambda: self._ready is not None or self._done, timeout_s)
            ready = self._ready is not None
        if not ready:
            self._closing = True
            if self._proc.poll() is None:
                self._proc.kill()
            code = self._proc.wait()
            self.ended.wait(STOP_TIMEOUT_S)
            raise RuntimeError(f"the live page's process did not start on {self.host}:{self.port} (exit code "
                               f"{code}; its error is in the log above)")

    def _send(self) -> None:
        _lower_priority()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing or self._done)
                if self._done or not self._queue:
                    break  # the child is gone, or stop() and everything is written
                batch = b"".join(self._queue)
                self._queue.clear()
            try:
                self._stdin.write(batch)
                self._stdin.flush()
            except (OSError, ValueError):
                break  # the child is gone: the watcher says so
            finally:
                with self._cond:
                    self._pending -= len(batch)
                    self._thread_cpu["send"] = time.thread_time()
        with contextlib.suppress(OSError, ValueError):
            self._stdin.close()  # EOF: the child stops serving and exits
        with self._cond:
            self._thread_cpu["send"] = time.thread_time()

    def _watch(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # stray output of the child
            with self._cond:
                if msg.get("ready"):
                    self._ready = msg
                if "synced" in msg:
                    self._synced = int(msg["synced"])
                self._thread_cpu["watch"] = time.thread_time()
                self._cond.notify_all()
        code = self._proc.wait()
        with self._cond:
            expected = self._closing or self._done
            self._done = True
            self.exit_code = code
            self._queue.clear()
            self._thread_cpu["watch"] = time.thread_time()
            self._cond.notify_all()
        if not expected:
            log.warning("the live page's process (pid %d) ended with exit code %s; the run goes on without its "
                        "live page (not restarted)", self.pid, code)
        self.ended.set()

    def _give_up(self, why: str) -> None:
        """(Under the lock.) Stop sending and end the child, with one log line."""
        self._done = True
        self._queue.clear()
        self._cond.notify_all()
        log.warning("the live page's process (pid %d) is ended: %s; the run goes on without its live page "
                    "(not restarted)", self.pid, why)
        with contextlib.suppress(OSError):
            self._proc.kill()


def start_web_process(host: str, port: int, token: str | None, events: RunEvents | None = None, *,
                      clock: Callable[[], float] = time.monotonic, max_pending: int = MAX_PENDING_BYTES,
                      start_timeout_s: float = START_TIMEOUT_S) -> WebProcess:
    """Serve the web face on ``host:port`` (0 = a free port) from a child process fed by ``events`` (attached
    before this returns, once the child answers). ``clock``: the events' times (tests); ``max_pending``: the
    queue's bound (see the module's doc).

    Raises :class:`~fedhop.server.web.serve.HttpConfigError` (token rules) or ``OSError`` (the address is taken)
    before any process starts; ``RuntimeError`` when the child does not start."""
    check_token(host, token)
    sock = bind_socket(host, port)
    try:
        actual = int(sock.getsockname()[1])
        proc = subprocess.Popen([sys.executable, "-m", "fedhop.server.web.proc"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, pass_fds=(sock.fileno(),), env=_child_env())
    finally:
        fd = sock.fileno()
        sock.close()  # the child holds its own copy
    web = WebProcess(proc, host, actual, token, clock, max_pending)
    web._start({"fd": fd, "host": host, "token": token}, start_timeout_s)
    if events is not None:
        web.attach(events)
    log.info("live page on %s:%d (process %d)", host, actual, web.pid)
    return web


def _encode(obj: object) -> bytes:
    try:
        body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        # an event carrying an object that does not pickle: what the page would show of it (JSON, str otherwise)
        body = pickle.dumps(json.loads(json.dumps(obj, default=str)), protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME.pack(len(body)) + body


def _child_env() -> dict[str, str]:
    """This environment, with the directory that holds the ``fedhop`` package first on the child's path."""
    root = str(Path(__file__).parents[3])  # this file is ROOT/fedhop/server/web/proc.py
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def _lower_priority() -> None:
    """This thread (Linux: per thread) below the run's priority; best effort."""
    if hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


# -- the child ------------------------------------------------------------------------------------------------------


class _EventClock:
    """The child's RunStatus clock: in the thread applying an event, the parent's time of that event (the page
    shows the times the in-process RunStatus would); in any other thread (a reader's ETA), now."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        t = getattr(self._local, "t", None)
        return time.monotonic() if t is None else t

    def set(self, t: float | None) -> None:
        self._local.t = t


def _read_frame(stream: IO[bytes]) -> Any:
    """The next frame's object, or None at EOF (the parent closed the pipe or is gone)."""
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (n,) = FRAME.unpack(head)
    body = stream.read(n)
    if len(body) < n:
        return None
    return pickle.loads(body)


def child_main() -> int:
    """The child: serve the configured socket, apply the events from stdin until EOF, then stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on the run's terminal: the parent decides, EOF ends it
    if hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s (live page process): %(message)s")
    stdin, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not reach the answer channel
    config = _read_frame(stdin)
    if config is None:
        return 0  # the parent went away before it configured us
    from fedhop.common.wire.meter import RoundRows
    from fedhop.server.web.serve import serve_socket
    from fedhop.server.web.status import RunStatus

    clock = _EventClock()
    status = RunStatus(clock=clock)
    links = RoundRows()  # every meter row, from the rounds each links event changed
    sock = socket.socket(fileno=int(config["fd"]))
    http = serve_socket(status, sock, str(config["host"]), config["token"])

    def answer(msg: dict[str, Any]) -> None:
        answers.write(json.dumps(msg).encode() + b"\n")
        answers.flush()

    try:
        answer({"ready": True, "port": http.port, "pid": os.getpid()})
        while (frame := _read_frame(stdin)) is not None:
            kind, data, t = frame
            if kind == SYNC:
                answer({"synced": data})
                continue
            clock.set(t)
            try:
                if kind == "links" and "rows" not in data:
                    data = {"rows": links.apply(data["rounds"]), "rounds": data["rounds"], "totals": data.get("totals")}
                status(kind, data)
            except Exception:  # as RunEvents does: a bad event is logged, the page goes on
                log.exception("the live page could not apply a %s event", kind)
            finally:
                clock.set(None)
    except BrokenPipeError:
        pass  # the parent is gone
    finally:
        http.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(child_main())
