"""What the credentials cost on a gRPC stream: loopback throughput of chunk frames, plaintext vs mutual TLS vs
tokens over TLS (transport/credentials.py), in one run.

    python tests/bench/bench_tls.py [--mb 256] [--chunk-mib 1] [--reps 3]

A server process (this one) serves a stream-unary method that counts the bytes it receives; a client process
streams ``--mb`` MB of 1 MiB chunks (pre-built ``bytes``, so no encoding is timed) and the call's duration
is taken in the client. Modes take turns for ``--reps`` rounds; each mode's best counts. The TLS handshake
happens before timing, so the table shows the bulk cost (encryption + framing). Prints MB/s (1 MB = 10^6
bytes) and the ratio to plaintext. Round-time ratios of whole jobs need the roles wired to ``--tls`` (issue 9).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

METHOD = "/fedhop.bench.Sink/Take"
OPTIONS = [("grpc.max_receive_message_length", 80 << 20), ("grpc.max_send_message_length", 80 << 20)]


def _security(mode: str, node: str, pki: Path):
    from fedhop.transport.credentials import Security

    if mode == "insecure":
        return Security.insecure(node)
    return Security.load(node, pki, pki / "tokens.toml" if mode == "token" else None)


def _client(mode: str, pki: str, port: int, mb: int, chunk_mib: int, reps: int) -> int:
    import grpc

    from fedhop.transport.credentials import open_channel

    chunk = bytes(chunk_mib << 20)
    n = max(1, mb * 10**6 // len(chunk))
    channel = open_channel(f"127.0.0.1:{port}", _security(mode, "client-0", Path(pki)), OPTIONS)
    grpc.channel_ready_future(channel).result(timeout=30)
    call = channel.stream_unary(METHOD)
    call(iter([b"x"]), timeout=60)  # handshake and first call outside the timing
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        got = int(call(iter([chunk] * n), timeout=600))
        best = min(best, time.perf_counter() - t)
        assert got == n * len(chunk), (got, n * len(chunk))
    print(f"{n * len(chunk)} {best}")
    return 0


def _serve(mode: str, pki: Path):
    import grpc

    from fedhop.transport.credentials import add_port, server_interceptors

    def take(chunks, context):
        return str(sum(len(c) for c in chunks)).encode()

    sec = _security(mode, "ps", pki)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=OPTIONS,
                         interceptors=server_interceptors(sec))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "fedhop.bench.Sink", {"Take": grpc.stream_unary_rpc_method_handler(take)}),))
    port = add_port(server, "127.0.0.1:0", sec)
    server.start()
    return server, port


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=256, help="MB per transfer (default 256)")
    p.add_argument("--chunk-mib", type=int, default=1, help="chunk size in MiB (default 1)")
    p.add_argument("--reps", type=int, default=3, help="transfers per mode; the best counts (default 3)")
    p.add_argument("--client", nargs=3, metavar=("MODE", "PKI", "PORT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.client:
        return _client(a.client[0], a.client[1], int(a.client[2]), a.mb, a.chunk_mib, a.reps)

    from fedhop.transport.certs import init_folder
    from fedhop.transport.tokens import new_tokens, write_tokens

    pki = Path(tempfile.mkdtemp(prefix="fedhop-bench-tls-"))
    init_folder(pki / "certs", ["ps", "client-0"], force=True)
    write_tokens(pki / "certs" / "tokens.toml", new_tokens(["ps", "client-0"]))
    modes = ("insecure", "tls", "token")
    best = {m: (0, float("inf")) for m in modes}
    for _ in range(a.reps):  # modes take turns, so that load drifting during the run hits all of them alike
        for mode in modes:
            server, port = _serve(mode, pki / "certs")
            try:
                out = subprocess.run([sys.executable, __file__, "--mb", str(a.mb), "--chunk-mib", str(a.chunk_mib),
                                      "--reps", "1", "--client", mode, str(pki / "certs"), str(port)],
                                     check=True, capture_output=True, text=True).stdout.split()
            finally:
                server.stop(None)
            if float(out[1]) < best[mode][1]:
                best[mode] = (int(out[0]), float(out[1]))
    rows = [(m, n, secs, n / secs / 1e6) for m, (n, secs) in best.items()]
    base = rows[0][3]
    print(f"\n{a.mb} MB in {a.chunk_mib} MiB chunks over loopback gRPC, best of {a.reps}\n")
    print("| mode | MB/s | time (s) | throughput vs plaintext |")
    print("|---|---:|---:|---:|")
    for mode, _, secs, mbs in rows:
        print(f"| {mode} | {mbs:,.0f} | {secs:.3f} | {mbs / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
