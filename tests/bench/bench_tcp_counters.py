"""The wire level's cost: one read of this process's TCP counters (sock_diag dump + /proc/self/fd + attribution)
with N open loopback connections, i.e. what a parent with N children pays once per round.

    python tests/bench/bench_tcp_counters.py [--sizes 1 10 100 1000] [--repeat 3]

Each size opens N connected socket pairs in this process (2N own sockets, of which N are attributed), reads
the counters 20 times and prints the median of ``--repeat`` such means, with the load average (the machine is
shared: a busy one makes every row slower alike).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

from fedhop.transport.tcp_counters import TcpCounters, attribute


def one_size(n: int, repeat: int) -> tuple[float, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(n)
    pairs = []
    for _ in range(n):
        c = socket.create_connection(srv.getsockname())
        a, _ = srv.accept()
        c.sendall(b"x" * 1000)
        pairs.append((c, a))
    peers = {(c.getsockname()[0], c.getsockname()[1]): f"client-{i}" for i, (c, _) in enumerate(pairs)}
    counters = TcpCounters("bench")
    means = []
    found = 0
    for _ in range(repeat):
        last: dict = {}
        t0 = time.perf_counter()
        for _ in range(20):
            infos = counters.read()
            found = max(found, len(attribute("ps", infos, peers, last)) // 2)
        means.append((time.perf_counter() - t0) / 20)
    for c, a in pairs:
        c.close()
        a.close()
    srv.close()
    return statistics.median(means), found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[1, 10, 100, 1000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("| connections | links found | time per read |")
    print("|---|---|---|")
    for n in args.sizes:
        t, found = one_size(n, args.repeat)
        print(f"| {n} | {found} | {t * 1e3:.2f} ms |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
