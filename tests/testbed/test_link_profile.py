"""One link of the namespace testbed against the transfer model (issue 17): two namespaces on the testbed's bridge,
shaped by the testbed's own mechanisms (htb rate, nftables loss, delay and jitter held in the kernel's NFQUEUE by
deploy/kernel_delay.py), and a plain TCP transfer or echo between them. Root only, like test_netns.py."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedhop.common.network_spec import Shape
from fedhop.common.virtual_clock import congestion_control, mathis_bps, transfer_s, wire_bytes
from fedhop.deploy import loss, shaping
from fedhop.deploy.netns import Network, in_ns, plan_network, run_cmd
from tests.testbed.test_netns import pytestmark

__all__ = ["pytestmark"]

PORT = 5301
MB4 = 4_000_000

SERVER = f"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], {PORT})); s.listen()
print("listening", flush=True)
for _ in range(int(sys.argv[2])):
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if sys.argv[3] == "echo":
        while m := c.recv(1):
            c.sendall(m)
    else:
        n = 0
        while d := c.recv(1 << 20):
            n += len(d)
        print(n, repr(time.monotonic()), flush=True)
    c.close()
"""

CLIENT = f"""
import json, socket, struct, sys, time
addr, what, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = socket.create_connection((addr, {PORT}))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if what == "echo":
    rtts = []
    for _ in range(n):
        t = time.monotonic(); c.sendall(b"a"); c.recv(1); rtts.append(time.monotonic() - t)
        time.sleep(0.02)
    print(json.dumps({{"rtts": rtts}}))
else:
    t0 = time.monotonic()
    c.sendall(b"x" * n)
    info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    c.shutdown(socket.SHUT_WR); c.recv(1)
    print(json.dumps({{"start": t0, "total_retrans": struct.unpack_from("=I", info, 100)[0]}}))
"""


@dataclass(frozen=True)
class Pair:
    """Two shaped namespaces and the loss tables of their receivers."""

    net: Network
    tables: dict[str, loss.LossTable]

    @property
    def a(self):  # the sender (client-0)
        return self.net.nodes["client-0"]

    @property
    def b(self):  # the receiver (ps)
        return self.net.nodes["ps"]


@contextlib.contextmanager
def shaped_pair(tmp: Path, shape: Shape) -> Iterator[Pair]:
    """ps and client-0 on a bridge, both directions shaped as ``shape`` by the testbed's mechanisms."""
    net = plan_network([("ps", "server"), ("client-0", "client")], "10.231.0.0/24")
    procs: list[subprocess.Popen] = []
    try:
        net.create()
        if shape.mbit:
            shaping.apply_shaping(net, [shaping.LinkShape("ps", "client-0", shape.mbit),
                                        shaping.LinkShape("client-0", "ps", shape.mbit)])
        tables = loss.apply_loss(net, [loss.LinkLoss("ps", "client-0", shape.loss),
                                       loss.LinkLoss("client-0", "ps", shape.loss)]) if shape.loss else {}
        pair = Pair(net, tables)
        if shape.delay_ms or shape.jitter_ms:
            for me, peer in ((pair.a, pair.b), (pair.b, pair.a)):
                ready = tmp / f"ready-{me.node}"
                hold = f"{shape.delay_ms:g}~{shape.jitter_ms:g}"
                procs.append(subprocess.Popen(in_ns(me.ns, [
                    sys.executable, "-m", "fedhop.deploy.kernel_delay", "--hold", f"{peer.address}={hold}",
                    "--seed", "5", "--ready", str(ready)]), stderr=(tmp / f"kdelay-{me.node}.log").open("w")))
                end = time.monotonic() + 30
                while not ready.exists():
                    assert procs[-1].poll() is None and time.monotonic() < end, \
                        (tmp / f"kdelay-{me.node}.log").read_text()
                    time.sleep(0.02)
        yield pair
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        net.destroy()


def _serve(pair: Pair, conns: int, mode: str) -> subprocess.Popen:
    srv = subprocess.Popen(in_ns(pair.b.ns, [sys.executable, "-c", SERVER, pair.b.address,
                                             str(conns), mode]), stdout=subprocess.PIPE, text=True)
    assert srv.stdout is not None and srv.stdout.readline().strip() == "listening"
    return srv


def _client(pair: Pair, what: str, n: int) -> dict:
    return json.loads(run_cmd(in_ns(pair.a.ns, [sys.executable, "-c", CLIENT, pair.b.address, what, str(n)])))


def transfer(pair: Pair, nbytes: int, times: int = 3) -> tuple[float, int, list[float]]:
    """``times`` fresh connections client-0 -> ps, one after the other, each carrying ``nbytes``: (the median of
    the seconds from the first byte sent to the last received, the segments the senders retransmitted, every
    time). The median: on a loaded 2-core host one transfer now and then takes much longer."""
    srv = _serve(pair, times, "sink")
    seconds, retrans = [], 0
    for _ in range(times):
        got = _client(pair, "send", nbytes)
        line = srv.stdout.readline().split()
        assert int(line[0]) == nbytes
        seconds.append(float(line[1]) - got["start"])
        retrans += got["total_retrans"]
    srv.wait(30)
    return statistics.median(seconds), retrans, seconds


def echo_rtts(pair: Pair, n: int) -> list[float]:
    srv = _serve(pair, 1, "echo")
    rtts = _client(pair, "echo", n)["rtts"]
    srv.wait(30)
    return rtts


def test_a_lossy_delayed_link_moves_4_mb_as_the_profile_predicts(tmp_path: Path) -> None:
    """The issue's case: 10 Mbit/s, 50 ms each way, 1% loss. A 4 MB transfer on a fresh connection takes the
    model's time within 15% (transfer_s, cold start, this host's congestion control), the loss rule dropped
    packets and the sender retransmitted them; the round trip is the 2 x 50 ms configured (the delay is inside
    TCP's loop: the sender's own RTT estimate sees it)."""
    shape = Shape(mbit=10, delay_ms=50, loss=0.01)
    cc = congestion_control()
    with shaped_pair(tmp_path, shape) as pair:
        rtts = echo_rtts(pair, 10)
        seconds, retrans, each = transfer(pair, MB4)
        drops = loss.drop_counts([loss.LinkLoss("client-0", "ps", 0.01)], pair.tables)[0]["dropped_packets"]
    predicted = transfer_s(shape, MB4, cc, cold=True)
    mathis = wire_bytes(MB4, 0.01) * 8 / mathis_bps(0.01, 0.1)
    print(f"\n4 MB at 10 Mbit/s, 50 ms, 1% loss ({cc}): {[round(x, 2) for x in each]} s, predicted {predicted:.2f} s "
          f"({seconds / predicted - 1:+.1%}); Mathis (loss-based TCP) would say {mathis:.1f} s; {drops} packets "
          f"dropped, {retrans} retransmitted; round trips {min(rtts) * 1e3:.1f}-{max(rtts) * 1e3:.1f} ms, median "
          f"{statistics.median(rtts) * 1e3:.1f} ms")
    assert abs(seconds / predicted - 1) <= 0.15, (seconds, predicted)
    assert drops > 0 and retrans > 0, (drops, retrans)
    assert 0.099 <= statistics.median(rtts) <= 0.115, rtts


def test_jitter_spreads_round_trips_and_lengthens_a_transfer_as_the_profile_says(tmp_path: Path) -> None:
    """50 ms +- 40 ms each way: one-byte round trips (sparse packets, none held behind another) have the profile's
    distribution, the sum of two uniform holds: mean 100 ms, standard deviation 40 * sqrt(2/3) = 32.7 ms, within
    [20, 180] ms. 50 ms +- 10 ms at 20 Mbit/s: a 2 MB transfer takes transfer_s's time within 15%, which adds the
    last packet's lag (packets never overtake) to the unjittered time. (With jitter near the delay, BBR's
    minimum-RTT filter sees the short round trips and caps its window below the path; the model's cap assumes a
    long-lived connection and over-predicts a fresh transfer's time: docs/network.md.)"""
    with shaped_pair(tmp_path, Shape(delay_ms=50, jitter_ms=40)) as pair:
        rtts = echo_rtts(pair, 60)
    ms = sorted(x * 1e3 for x in rtts)
    mean, stdev = statistics.mean(ms), statistics.stdev(ms)
    shape = Shape(mbit=20, delay_ms=50, jitter_ms=10)
    cc = congestion_control()
    with shaped_pair(tmp_path, shape) as pair:
        seconds, _, each = transfer(pair, MB4 // 2)
    predicted = transfer_s(shape, MB4 // 2, cc, cold=True)
    plain = transfer_s(Shape(mbit=20, delay_ms=50), MB4 // 2, cc, cold=True)
    print(f"\njitter 50 +- 40 ms each way: round trips {ms[0]:.1f}-{ms[-1]:.1f} ms, mean {mean:.1f} ms, stdev "
          f"{stdev:.1f} ms (profile: 100, 32.7); 50 +- 10 ms, 2 MB at 20 Mbit/s: {[round(x, 3) for x in each]} s, "
          f"predicted {predicted:.3f} s ({seconds / predicted - 1:+.1%} at the median; without jitter {plain:.3f})")
    inside = [x for x in ms if 19 <= x <= 190]  # 2 x (50 +- 40) ms, +10 ms for a loaded host
    assert len(inside) >= 0.9 * len(ms), ms
    assert 90 <= mean <= 115 and 0.7 * 32.7 <= stdev <= 1.3 * 32.7, ms
    assert abs(seconds / predicted - 1) <= 0.15, (seconds, predicted)
    assert predicted > plain


@pytest.mark.parametrize("mbit", [10.0, 50.0])
def test_rate_and_delay_achieved(tmp_path: Path, mbit: float) -> None:
    """htb's rate and the kernel delay together, no loss: the round trip is 2 x 20 ms (within 5 ms at the
    median), and a 3 MB transfer on a fresh connection takes the model's time (cold start) within 15%."""
    shape = Shape(mbit=mbit, delay_ms=20)
    cc = congestion_control()
    with shaped_pair(tmp_path, shape) as pair:
        rtts = echo_rtts(pair, 20)
        seconds, retrans, each = transfer(pair, 3_000_000)
    predicted = transfer_s(shape, 3_000_000, cc, cold=True)
    achieved = wire_bytes(3_000_000) * 8 / (seconds - 0.020) / 1e6
    print(f"\n{mbit:g} Mbit/s, 20 ms: round trips median {statistics.median(rtts) * 1e3:.1f} ms; 3 MB in "
          f"{[round(x, 3) for x in each]} s, predicted {predicted:.3f} s ({seconds / predicted - 1:+.1%}); "
          f"~{achieved:.1f} Mbit/s of IP packets incl. the slow start")
    assert 0.040 <= statistics.median(rtts) <= 0.045, rtts
    assert abs(seconds / predicted - 1) <= 0.15, (seconds, predicted)
    assert retrans == 0


def test_the_kernel_delay_probe_answers_here() -> None:
    """This host (CI's, root) can hold packets in the kernel: the probe says ok, so the testbed does not fall
    back to the proxy."""
    p = subprocess.run([sys.executable, "-m", "fedhop.deploy.kernel_delay", "--probe"], capture_output=True,
                       text=True, env={**os.environ})
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.stdout, p.stderr)
