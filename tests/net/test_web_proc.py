"""The web face in its own process (server/web/proc.py): fed by the run's events over a pipe, it shows what a
RunStatus fed the same events in-process shows; its death never reaches the run; the run's death ends it; a bad
address or token fails before anything starts."""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from fedhop.common.engine.events import RunEvents
from fedhop.common.exit_codes import ExitCode, Fatal
from fedhop.server.web import proc
from fedhop.server.web.app import create_app
from fedhop.server.web.cli import page_from_args
from fedhop.server.web.live import live_page, open_page, simulate
from fedhop.server.web.serve import HttpConfigError
from fedhop.server.web.status import RunStatus
from tests.net.test_http_api import FAULTS, TOKEN, _spec
from tests.unit.test_run import spec as small_spec

ROUTES = ("api/status", "api/rounds", "api/links?rows=1", "api/topology", "api/missing", "api/timeline")


class Clock:
    """The events' times, set by the test before each emit: the same for the child and the reference."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def recorded() -> list[tuple[str, dict[str, Any]]]:
    """Every event of a Fed-CHS run with clients down in round 2 (missing entries, lost rounds)."""
    events = RunEvents()
    got: list[tuple[str, dict[str, Any]]] = []
    events.subscribe(lambda kind, data: got.append((kind, data)))
    simulate(_spec(), events, run_id="proc-run", faults=FAULTS)
    return got


def wait_exit(pid: int, timeout_s: float) -> bool:
    """Whether process ``pid`` (not necessarily our child) ended within ``timeout_s`` (a pidfd: no polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def test_the_child_shows_what_an_in_process_status_shows(recorded: list[tuple[str, dict[str, Any]]]) -> None:
    """The same events, on the same clock, into the child and into a local RunStatus: every route answers the
    same JSON (mid-run: the rounds and links; at the end: all of them)."""
    clock = Clock()
    events = RunEvents()
    reference = RunStatus(clock=clock)
    events.subscribe(reference)
    web = proc.start_web_process("127.0.0.1", 0, None, events, clock=clock)
    try:
        ref = TestClient(create_app(reference, loopback=True), base_url="http://127.0.0.1")
        half = next(i for i, (kind, d) in enumerate(recorded) if kind == "round_ended" and d["round"] == 1)
        for i, (kind, data) in enumerate(recorded):
            clock.t += 0.25
            events.emit(kind, **data)
            if i == half:
                assert web.sync()
                for route in ("api/rounds", "api/links?rows=1"):
                    assert httpx.get(web.url + route, timeout=30).json() == ref.get("/" + route).json(), route
        assert web.sync()
        for route in ROUTES:
            assert httpx.get(web.url + route, timeout=30).json() == ref.get("/" + route).json(), route
        status = httpx.get(web.url + "api/status", timeout=30).json()
        assert status["phase"] == "finished" and status["run_id"] == "proc-run"
        assert status["elapsed_s"] == pytest.approx(0.25 * (len(recorded) - 1))  # the parent's clock
        assert httpx.get(web.url + "api/missing", timeout=30).json()["missing"]  # the faults' entries arrived
        assert web.parent_cpu_s() > 0
    finally:
        web.stop()
    assert web.exit_code == 0 and not web.alive


def test_the_childs_death_does_not_stop_the_run(caplog: pytest.LogCaptureFixture) -> None:
    """kill -9 the page's process: one log line says so, the run goes on to its end, close() is quiet."""
    caplog.set_level(logging.WARNING, logger="fedhop.http")
    with live_page("127.0.0.1:0") as page:
        web = page.http
        assert isinstance(web, proc.WebProcess)
        assert httpx.get(web.url + "api/status", timeout=30).status_code == 200
        os.kill(web.pid, signal.SIGKILL)
        assert web.ended.wait(30)
        result = simulate(small_spec(rounds=2), page.events, run_id="goes-on")
        assert page.status.status()["phase"] == "finished" and len(result.rounds) == 2
        assert not page.sync(1)
    lines = [r.getMessage() for r in caplog.records if "live page's process" in r.getMessage()]
    assert lines == [f"the live page's process (pid {web.pid}) ended with exit code -9; the run goes on without "
                     f"its live page (not restarted)"]


def test_a_child_that_falls_behind_is_given_up_and_the_run_never_waits(caplog: pytest.LogCaptureFixture) -> None:
    """A stopped child reads nothing: the run's emits still return at once; beyond the queue's bound the child
    is ended with one log line (events are never dropped from a page that goes on)."""
    caplog.set_level(logging.WARNING, logger="fedhop.http")
    events = RunEvents()
    web = proc.start_web_process("127.0.0.1", 0, None, events, max_pending=1 << 20)
    try:
        os.kill(web.pid, signal.SIGSTOP)
        rows = [{"src": f"client-{i}", "dst": "server", "kind": "update", "phase": "task", "round": 0,
                 "messages": 1, "payload_bytes": i, "message_bytes": i} for i in range(2000)]
        for _ in range(200):  # ~ 40 MiB in all: over the pipe's buffer and the 1 MiB bound
            events.emit("links", rows=rows)
        assert web.ended.wait(30) and not web.alive
    finally:
        web.stop()
    assert web.exit_code == -signal.SIGKILL
    lines = [r.getMessage() for r in caplog.records if "live page's process" in r.getMessage()]
    assert len(lines) == 1 and "MiB of events behind" in lines[0]


STAND_IN = """
import sys
from fedhop.server.web.live import open_page
page = open_page("127.0.0.1:0")
page.events.emit("node_joined", node="client-0", role="client")
print(page.http.pid, page.url, flush=True)
sys.stdin.read()  # until killed
"""


def test_the_child_ends_with_its_parent() -> None:
    """kill -9 the run's process (a stand-in that serves a page): the page's process sees EOF and exits."""
    parent = subprocess.Popen([sys.executable, "-c", STAND_IN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=proc._child_env())
    try:
        assert parent.stdout is not None
        pid_text, url = parent.stdout.readline().split()
        child = int(pid_text)
        assert httpx.get(url + "api/status", timeout=30).status_code == 200
        assert not wait_exit(child, 0)  # serving
        parent.kill()
        assert parent.wait(30) == -signal.SIGKILL
        assert wait_exit(child, 30), f"the page's process {child} outlived its parent"
    finally:
        parent.kill()
        parent.wait(30)


def test_bad_settings_fail_before_any_process_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Token rules and a taken port fail in the parent, with the in-thread server's errors; no child starts."""
    def no_child(*_a: object, **_k: object) -> None:
        raise AssertionError("a child process was started")

    monkeypatch.setattr(proc.subprocess, "Popen", no_child)
    with pytest.raises(HttpConfigError, match="bearer token is required"):
        open_page("0.0.0.0:0")
    with pytest.raises(HttpConfigError, match="at least 16 characters"):
        open_page("127.0.0.1:0", token="short")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve the live page on 127.0.0.1:{port}"):
            open_page(f"127.0.0.1:{port}")
        with pytest.raises(Fatal) as e:
            page_from_args(f"127.0.0.1:{port}")
        assert e.value.code == ExitCode.ADDRESS_IN_USE
    with pytest.raises(Fatal) as e:
        page_from_args("0.0.0.0:0")
    assert e.value.code == ExitCode.USAGE


def test_the_token_reaches_the_child_and_not_its_command_line() -> None:
    """A token-guarded page off loopback: 401 without it, 200 with it; the child's argv does not show it."""
    with live_page("0.0.0.0:0", token=TOKEN) as page:
        web = page.http
        assert isinstance(web, proc.WebProcess)
        url = f"http://127.0.0.1:{web.port}/"
        assert httpx.get(url + "api/status", timeout=30).status_code == 401
        got = httpx.get(url + "api/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert got.status_code == 200 and got.json()["phase"] == "waiting"
        with open(f"/proc/{web.pid}/cmdline", "rb") as f:
            assert TOKEN.encode() not in f.read()


def test_an_event_that_does_not_pickle_is_sent_as_the_page_would_show_it() -> None:
    """A listener's data is the run's: an object that does not pickle goes as its JSON (str) form."""
    import io
    import pickle

    frame = proc._encode(("round_ended", {"round": 0, "record": {"note": lambda: 1, "loss": 0.5}}, 1.0))
    kind, data, t = proc._read_frame(io.BytesIO(frame))
    assert (kind, t, data["round"], data["record"]["loss"]) == ("round_ended", 1.0, 0, 0.5)
    assert data["record"]["note"].startswith("<function")
    assert proc._read_frame(io.BytesIO(frame[:-1])) is None  # a cut frame: the end of the pipe
    assert pickle.loads(proc._encode({"fd": 3})[proc.FRAME.size:]) == {"fd": 3}
