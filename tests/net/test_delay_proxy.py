"""The testbed's delay proxy on loopback: bytes pass unchanged, each direction ``delay`` later."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

from fedhop.launch import free_port


def _echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def _connect(port: int, deadline_s: float = 20.0) -> socket.socket:
    end = time.monotonic() + deadline_s
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except ConnectionRefusedError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed early"
        buf += chunk
    return buf


def test_proxy_delays_each_direction_and_keeps_the_bytes() -> None:
    srv, target = _echo_server()
    port = free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "fedhop.deploy.delay_proxy", "--listen", f"127.0.0.1:{port}",
                              "--target", f"127.0.0.1:{target}", "--delay", "127.0.0.1=150"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with _connect(port) as s:
            payload = bytes(range(256)) * 1024  # 256 KiB: several chunks
            t0 = time.monotonic()
            s.sendall(payload)
            echoed = _recv_exactly(s, len(payload))
            rtt = time.monotonic() - t0
        assert echoed == payload
        assert rtt >= 0.3  # 150 ms there and 150 ms back
    finally:
        proxy.terminate()
        proxy.wait(10)
        srv.close()


def test_proxy_rejects_a_negative_delay() -> None:
    p = subprocess.run([sys.executable, "-m", "fedhop.deploy.delay_proxy", "--listen", "127.0.0.1:1",
                        "--target", "127.0.0.1:2", "--delay", "10.0.0.1=-3"], capture_output=True, text=True)
    assert p.returncode == 2 and "delay must be >= 0 ms" in p.stderr


def _round_trips(delay: str, n: int = 25) -> list[float]:
    """``n`` one-byte request / answer round trips through a proxy started with ``--delay 127.0.0.1=DELAY``."""
    srv, target = _echo_server()
    port = free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "fedhop.deploy.delay_proxy", "--listen", f"127.0.0.1:{port}",
                              "--target", f"127.0.0.1:{target}", "--delay", f"127.0.0.1={delay}", "--seed", "4"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        rtts = []
        with _connect(port) as s:
            for i in range(n):
                t0 = time.monotonic()
                s.sendall(bytes([i]))
                assert _recv_exactly(s, 1) == bytes([i])
                rtts.append(time.monotonic() - t0)
        return rtts
    finally:
        proxy.terminate()
        proxy.wait(10)
        srv.close()


def test_jitter_spreads_the_round_trips_around_twice_the_delay() -> None:
    """60 ms one-way, +- 50 ms jitter each way: round trips between 2 x 10 and 2 x 110 ms (plus scheduling),
    spread far wider than without jitter, and centred near 2 x 60 ms."""
    steady = _round_trips("60")
    jittered = _round_trips("60~50")
    print("round trips (ms): steady", [round(x * 1000) for x in steady], "jittered",
          [round(x * 1000) for x in jittered])
    assert min(steady) >= 0.12 and min(jittered) >= 0.02
    assert max(jittered) - min(jittered) > 0.06  # uniform +-50 ms twice: 25 draws spread far more than this
    assert max(jittered) - min(jittered) > 2 * (max(steady) - min(steady))
    assert 0.08 < sorted(jittered)[len(jittered) // 2] < 0.2


def test_each_direction_has_its_own_delay() -> None:
    rtts = _round_trips("100,0", n=5)  # peer -> node 100 ms, node -> peer none
    assert all(0.1 <= r < 0.19 for r in rtts), rtts
