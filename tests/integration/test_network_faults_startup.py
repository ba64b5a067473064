"""Faults at start-up over real processes: a client pointed at something that is not a fedhop node says so
within seconds (and waits, saying so, while nothing listens yet); a run folder that cannot be written stops
the PS before its port opens; a child re-joining a parent that now runs another run is refused."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import grpc
import pytest

from fedhop.common.exit_codes import ExitCode
from fedhop.common.topology import build_topology
from fedhop.common.wire.meter import ByteMeter
from fedhop.launch import free_port
from fedhop.transport.aio_server import make_loop_server
from fedhop.transport.channels import add_port, make_server
from fedhop.transport.child import ChildSession, JoinError
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.parent import serve_parent
from fedhop.transport.session import HubConfig, ParentHub
from tests.integration.netutil import small_spec


def run_client(addr: str, connect_timeout: float, timeout: float) -> subprocess.CompletedProcess:
    """A client process; ``timeout`` (far below ``connect_timeout``) fails the test if it waits it out."""
    return subprocess.run([sys.executable, "-m", "fedhop", "client", "--id", "client-0", "--connect", addr,
                           "--device", "cpu", "--connect-timeout", str(connect_timeout)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture()
def silent_listener():
    """A TCP listener that accepts connections and never says a word (no HTTP/2)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    conns = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(5)
    for c in conns:
        c.close()
    srv.close()


@pytest.fixture()
def http_server():
    class Hello(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Hello)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture()
def grpc_without_fedhop():
    server = make_server(4)
    port = add_port(server, "127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


@pytest.mark.parametrize("kind", ["silent_listener", "http_server", "grpc_without_fedhop"])
def test_client_at_a_port_that_is_not_fedhop_says_so(kind, request) -> None:
    addr = request.getfixturevalue(kind)
    proc = run_client(addr, connect_timeout=600, timeout=120)  # waiting out the connect timeout fails the test
    assert proc.returncode == ExitCode.NOT_FEDHOP, proc.stderr
    assert "(not a fedhop" in proc.stderr and addr in proc.stderr


@pytest.mark.parametrize("where", ["under_a_file", "in_proc"])
def test_unwritable_run_folder_stops_the_ps_before_its_port_opens(tmp_path, where) -> None:
    spec = small_spec("fedavg", clients=2, rounds=1)
    (tmp_path / "spec.toml").write_text(spec.to_toml())
    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "a-file" / "run" if where == "under_a_file" else "/proc/fedhop-run"
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "fedhop", "server", str(tmp_path / "spec.toml"), "--listen",
                           f"127.0.0.1:{port}", "--out", str(out), "--device", "cpu"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.RUN_FOLDER, proc.stderr
    assert f"the run folder {out} cannot be written" in proc.stderr
    assert "listening on port" not in proc.stderr


def test_launch_with_an_unwritable_run_folder_starts_nothing(tmp_path) -> None:
    spec = small_spec("fedavg", clients=2, rounds=1)
    (tmp_path / "spec.toml").write_text(spec.to_toml())
    (tmp_path / "a-file").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "fedhop", "launch", str(tmp_path / "spec.toml"), "--out",
                           str(tmp_path / "a-file" / "run"), "--quiet"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.RUN_FOLDER, proc.stderr
    assert "cannot be written" in proc.stderr and "starting" not in proc.stderr


def test_rejoin_to_a_parent_running_another_run_is_refused() -> None:
    spec = small_spec("fedavg", clients=2, edges=0, rounds=1)
    hub = ParentHub(HubConfig("ps", spec, build_topology(spec.topology, spec.seed), "run-b"), ByteMeter())
    server = make_loop_server()
    serve_parent(hub, server)
    port = add_port(server, "127.0.0.1:0")
    server.start()
    s = ChildSession(NodeConfig("client-0", f"127.0.0.1:{port}", connect_timeout_s=10), "client")
    try:
        s.run_id = "run-a"  # this node was in run-a when its stream broke
        with pytest.raises(JoinError, match="client-0 re-joins run 'run-a', which ps does not run") as e:
            s._open(rejoin=True)
        assert e.value.code == ExitCode.RUN_MISMATCH
        assert "run-b" not in str(e.value)  # no refusal says the parent's run id (issue 20)
    finally:
        s.close()
        server.stop(0)


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED])
def test_a_call_broken_before_the_welcome_is_retried_and_a_parent_that_stays_away_is_lost(code, caplog) -> None:
    # gRPC's core ends a Session call with INTERNAL ("Internal error from Core") or CANCELLED when the parent's
    # server shuts down while the call is set up (CI, 2026-11-26: a re-joining client exited 3, an error, where a
    # lost parent is exit 11); a server that always answers so stands for a parent that never comes back
    attempts: list[int] = []

    def session(requests, context):
        attempts.append(1)
        context.abort(code, "Internal error from Core")

    server = make_server(4)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "fedhop.v1.Parent", {"Session": grpc.stream_stream_rpc_method_handler(session)})])
    addr = f"127.0.0.1:{add_port(server, '127.0.0.1:0')}"
    server.start()
    spec = small_spec("fedavg", clients=2, rounds=1)
    s = ChildSession(NodeConfig("client-0", addr, connect_timeout_s=2), "client")
    try:
        with pytest.raises(JoinError, match=rf"unreachable for 2s \(the call broke before the parent answered "
                                            rf"\({code.name}: Internal error from Core\)\)") as e:
            s.connect()
        assert e.value.code == ExitCode.JOIN_FAILED
        first = len(attempts)
        assert first >= 2  # retried, not given up at the first answer
        s.run_id, s.transport = "run-a", spec.transport.model_copy(update={"reconnect_s": 1.5})
        with caplog.at_level("ERROR", logger="fedhop.child"):
            assert s._rejoin(old_ended=True) == ExitCode.PARENT_LOST
        assert len(attempts) >= first + 2
        assert any("did not come back within transport.reconnect_s = 1.5s (last: the call broke before the "
                   f"parent answered ({code.name}" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        s.close()
        server.stop(0)
