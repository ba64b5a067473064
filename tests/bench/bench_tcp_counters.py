"""The wire level's cost: one read of this process's TCP counters (sock_diag dump + /proc/self/fd + attribution)
with N open loopback connections, i.e. what a parent with N children pays once per round.

    python tests/bench/bench_tcp_counters.py [--sizes 1 10 100 1000] [--repeat 3] [--others 20000]

Each size opens N connected socket pairs in this process (2N own sockets, of which N are attributed), reads
the counters 20 times and prints the median of ``--repeat`` such means, with the load average (the machine is
shared: a busy one makes every row slower alike). ``--others M``: another process holds M connected pairs
meanwhile (2M sockets of the machine that are not this process's: a PS's clients' hosts hold 2 per client).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
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
    ap.add_argument("--others", type=int, default=0, help="connected pairs held by another process meanwhile")
    args = ap.parse_args()
    others = None
    if args.others:
        others = subprocess.Popen([sys.executable, "-c", OTHERS, str(args.others)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert others.stdout is not None and others.stdout.readline().strip() == "ready"
        print(f"another process holds {args.others} connected pairs ({2 * args.others} sockets)")
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("| connections | links found | time per read |")
    print("|---|---|---|")
    for n in args.sizes:
        t, found = one_size(n, args.repeat)
        print(f"| {n} | {found} | {t * 1e3:.2f} ms |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if others is not None:
        others.communicate("")


OTHERS = """
import socket, sys
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1024)
held = []
for _ in range(int(sys.argv[1])):
    held.append(socket.create_connection(srv.getsockname())); held.append(srv.accept()[0])
print("ready", flush=True)
sys.stdin.read()
"""


if __name__ == "__main__":
    main()
