"""Loopback throughput of one big bundle between two fedhop processes, beside a raw TCP (or TLS) socket.

    python tests/bench/bench_transfer.py [--mb 256] [--reps 3] [--chunk-mib 1] [--no-lane] [--no-grpc] [--no-tls]

fedhop: this process is a parent (``ParentHub`` + ``NetComm`` on the PS's asyncio server); a separate ``fedhop
client`` process joins it; one ``scatter`` pushes the bundle to the client, which decodes it into one buffer,
validates it (finite values) and answers with an empty Result (scatter PS -> client); or one scatter sends an
empty task and gets the bundle back as the client's reply (reply client -> PS); one untimed call first. Timed:
scatter start to reply, i.e. snapshot, encode + checksum, transfer, decode, checksum, validation. The fedhop
rows run with the bulk lane (transport/lane.py: the chunk frames on a second connection of the session, written
from the tensors' memory and received straight into the decode buffer) and, for comparison, without it
(``FEDHOP_BULK_LANE=0``: chunk frames on the gRPC stream); plaintext and mutual TLS (certificates from a
throwaway CA).

Baselines, same run: raw TCP (the same bytes from the tensor's memory with ``sendall`` to a child process that
``recv_into``s a preallocated buffer and answers one byte), the same into a fresh bundle-size buffer per
transfer (as a receiver that keeps the model must have; its page faults are part of the cost: the issue's
target is >= 0.9x of this row), and a TLS socket (Python's ``ssl``, the lane's own contexts) into a fresh
buffer, the TLS rows' reference. Each fedhop row's reference is measured again right before it (the load of a
shared machine moves between rows) and its ratio is to that. ``--ablation`` adds fedhop (gRPC) with the codec's
huge-page decode buffers switched off. Prints the median of ``--reps`` in seconds and MB/s (1 MB = 10^6 bytes),
the ratio to its reference, and the load average.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

NODES = ("ps", "client-0")


def _security(node: str, tls_dir: str | None):  # noqa: ANN202 (fedhop imported lazily: the children import it late)
    from fedhop.transport.credentials import PLAINTEXT, Security

    return PLAINTEXT if tls_dir is None else Security.load(node, tls_dir)


def _sink_child(addr: str, plain_buffers: bool = False, tls_dir: str | None = None) -> int:
    """A client process that knows two extra tasks: take the bundle and say how many bytes it got; send one."""
    from fedhop.client.main import run_client
    from fedhop.common.wire import codec
    from fedhop.transport.node_config import NodeConfig

    if plain_buffers:
        codec._HUGE_BUFFER_BYTES = 1 << 62  # ablation: decode buffers from the ordinary allocator
    from fedhop.common.engine.api import NodeContext, Reply, task
    from fedhop.common.wire.bundle import Bundle, payload_bytes

    @task("bench.sink")
    def sink(ctx: NodeContext, bundle: Bundle, args: dict) -> Reply:
        return Reply({}, {"bytes": payload_bytes(bundle)})

    source: dict = {}

    @task("bench.source")
    def send_back(ctx: NodeContext, bundle: Bundle, args: dict) -> Reply:
        n = int(args["numel"])  # the same tensor every time (built on the first call): only the upload varies
        if source.get("n") != n:
            source.update(n=n, w=torch.randn(n, generator=torch.Generator().manual_seed(0)))
        return Reply({"w": source["w"]}, {})

    return run_client(NodeConfig("client-0", addr, device="cpu", security=_security("client-0", tls_dir)))


def _receive(s: socket.socket, nbytes: int, reps: int, fresh: bool) -> int:
    buf = bytearray(1 << 22)
    view = memoryview(buf)
    for _ in range(reps):
        if fresh:  # a new buffer of the whole bundle each time, as a decoder allocates
            fresh_buf = torch.empty(nbytes, dtype=torch.uint8)
            view = memoryview(fresh_buf.numpy())
            pos = 0
            while pos < nbytes:
                n = s.recv_into(view[pos:])
                if n == 0:
                    return 1
                pos += n
            s.sendall(b"k")
            del view, fresh_buf
            continue
        left = nbytes
        while left:
            n = s.recv_into(view[:min(left, len(buf))])
            if n == 0:
                return 1
            left -= n
        s.sendall(b"k")
    return 0


def _tcp_child(port: int, nbytes: int, reps: int, fresh: bool, tls_dir: str | None) -> int:
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls_dir is None:
            return _receive(raw, nbytes, reps, fresh)
        from fedhop.transport.lane import client_context

        with client_context(_security("client-0", tls_dir)).wrap_socket(raw, server_hostname="127.0.0.1") as s:
            return _receive(s, nbytes, reps, fresh)


def bench_tcp(payload: torch.Tensor, reps: int, fresh: bool = False, tls_dir: str | None = None) -> list[float]:
    """Seconds per transfer of ``payload``'s bytes over a plain (or, with ``tls_dir``, a TLS) socket."""
    nbytes = payload.numel() * payload.element_size()
    data = memoryview(payload.view(torch.uint8).numpy())
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        child = subprocess.Popen([sys.executable, __file__, "--tcp-child", str(port), str(nbytes), str(reps),
                                  str(int(fresh)), tls_dir or "-"])
        conn, _ = srv.accept()
        if tls_dir is not None:
            from fedhop.transport.lane import server_context

            ctx = server_context(_security("ps", tls_dir))
            assert ctx is not None
            conn = ctx.wrap_socket(conn, server_side=True)
        times = []
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(reps):
                t0 = time.perf_counter()
                conn.sendall(data)
                assert conn.recv(1) == b"k"
                times.append(time.perf_counter() - t0)
        child.wait(30)
    return times


def bench_fedhop(payload: torch.Tensor, reps: int, chunk_bytes: int, plain_buffers: bool = False,
                 upload: bool = False, lane: bool = True, tls_dir: str | None = None) -> list[float]:
    """Times of a scatter that pushes ``payload`` to the client, or (``upload``) of one that sends an empty task
    and gets ``payload``'s size back as the client's reply (the client -> parent direction). ``lane``: the
    sessions' bulk lane on (else ``FEDHOP_BULK_LANE=0``: chunk frames on the gRPC stream)."""
    from fedhop.common.engine.api import NodeContext
    from fedhop.common.engine.base import MissingLog
    from fedhop.common.engine.workspace import Workspace
    from fedhop.common.spec import RunSpec
    from fedhop.common.topology import build_topology
    from fedhop.common.wire.meter import ByteMeter
    from fedhop.transport.aio_server import make_loop_server
    from fedhop.transport.channels import add_port
    from fedhop.transport.lane import ENV_SWITCH
    from fedhop.transport.netcomm import NetComm
    from fedhop.transport.parent import serve_parent
    from fedhop.transport.session import HubConfig, ParentHub

    os.environ[ENV_SWITCH] = "1" if lane else "0"  # this process (the parent) and the client it starts
    sec = _security("ps", tls_dir)
    spec = RunSpec.parse({"name": "bench", "device": "cpu", "topology": {"clients": 1},
                          "data": {"dataset": "digits"}, "model": {"name": "mlp", "hidden": [8]},
                          "transport": {"chunk_bytes": chunk_bytes, "round_deadline_s": 300}})
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig("ps", spec, topo, "bench", security=sec), ByteMeter())
    server = make_loop_server(sec)
    serve_parent(hub, server)
    port = add_port(server, "127.0.0.1:0", sec)
    server.start()
    child = subprocess.Popen([sys.executable, __file__, "--sink-child", f"127.0.0.1:{port}",
                              *(["--plain-buffers"] if plain_buffers else []),
                              *(["--tls", tls_dir] if tls_dir else [])], stderr=subprocess.DEVNULL)
    try:
        assert hub.wait_ready(120) == [], "the client did not join"
        link = hub.roster.links["client-0"]
        assert (link.lane is not None) == lane, f"lane wanted: {lane}, lane open: {link.lane is not None}"
        missing = MissingLog()
        comm = NetComm("ps", topo, missing, hub, spec)
        NodeContext(node_id="ps", role="server", ws=Workspace(spec, "cpu"), comm=comm)  # binds comm to it
        bundle = {"w": payload}
        times = []
        for rep in range(reps + 1):  # one untimed call first (first-call costs; the client builds its tensor)
            t0 = time.perf_counter()
            if upload:
                got = comm.scatter(["client-0"], "bench.source", {}, {"numel": payload.numel()})
                assert got["client-0"].bundle["w"].numel() == payload.numel(), (got, missing.entries)
            else:
                got = comm.scatter(["client-0"], "bench.sink", bundle)
                assert got["client-0"].scalars["bytes"] == payload.numel() * 4, (got, missing.entries)
            del got
            if rep:
                times.append(time.perf_counter() - t0)
        if lane:
            assert link.lane is not None and link.lane.sent_bytes + link.lane.received_bytes >= reps * payload.numel()
        hub.shutdown(10, finished=True)
        return times
    finally:
        child.wait(20) if child.poll() is None else None
        if child.poll() is None:
            child.kill()
        server.stop(0)


def _child_main(argv: list[str]) -> int | None:
    if argv[:1] == ["--sink-child"]:
        tls = argv[argv.index("--tls") + 1] if "--tls" in argv else None
        return _sink_child(argv[1], "--plain-buffers" in argv[2:], tls)
    if argv[:1] == ["--tcp-child"]:
        return _tcp_child(int(argv[1]), int(argv[2]), int(argv[3]), argv[4] == "1", None if argv[5] == "-" else argv[5])
    return None


def main() -> int:
    code = _child_main(sys.argv[1:])
    if code is not None:
        return code
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256, help="bundle size in MiB")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk-mib", type=float, default=1.0, help="transport.chunk_bytes in MiB")
    p.add_argument("--no-lane", action="store_true", help="skip the fedhop rows with the bulk lane")
    p.add_argument("--no-grpc", action="store_true", help="skip the fedhop rows without it (chunk frames on gRPC)")
    p.add_argument("--no-tls", action="store_true", help="skip the TLS rows")
    p.add_argument("--ablation", action="store_true", help="add fedhop (gRPC) with 4 KiB-page decode buffers")
    a = p.parse_args()
    torch.set_num_threads(1)
    payload = torch.randn((a.mb << 20) // 4, generator=torch.Generator().manual_seed(0))
    nbytes = payload.numel() * 4
    chunk = int(a.chunk_mib * (1 << 20))
    load_before = os.getloadavg()
    rows: list[tuple[str, str, float, float]] = []  # (path, security, median seconds, its reference's seconds)
    fresh = statistics.median(bench_tcp(payload, a.reps, fresh=True))
    rows.append(("raw TCP (sendall / recv_into)", "plain", statistics.median(bench_tcp(payload, a.reps)), fresh))
    rows.append(("raw TCP into a fresh buffer", "plain", fresh, fresh))
    lanes = ([True] if not a.no_lane else []) + ([False] if not a.no_grpc else [])
    with tempfile.TemporaryDirectory() as d:
        tls_dirs: list[str | None] = [None]
        if not a.no_tls:
            from fedhop.transport.certs import init_folder

            init_folder(Path(d), list(NODES))
            tls_dirs.append(d)
            tls_fresh = statistics.median(bench_tcp(payload, a.reps, fresh=True, tls_dir=d))
            rows.append(("TLS socket into a fresh buffer", "mTLS", tls_fresh, tls_fresh))
        for tls in tls_dirs:
            for lane in lanes:
                how = "lane" if lane else "gRPC"
                for upload, what in ((False, "scatter PS -> client"), (True, "reply client -> PS")):
                    # its reference again, right before it: the machine's load moves between rows
                    ref = statistics.median(bench_tcp(payload, a.reps, fresh=True, tls_dir=tls))
                    t = bench_fedhop(payload, a.reps, chunk, upload=upload, lane=lane, tls_dir=tls)
                    rows.append((f"fedhop {what} ({how})", "plain" if tls is None else "mTLS", statistics.median(t),
                                 ref))
    if a.ablation:
        ref = statistics.median(bench_tcp(payload, a.reps, fresh=True))
        t = bench_fedhop(payload, a.reps, chunk, plain_buffers=True, lane=False)
        rows.append(("  fedhop scatter (gRPC), 4 KiB-page buffer", "plain", statistics.median(t), ref))
    print(f"\nloopback transfer of one {nbytes / 1e6:.0f} MB bundle ({nbytes:,} B), median of {a.reps}, chunk "
          f"{a.chunk_mib:g} MiB; load average {' '.join(f'{v:.2f}' for v in load_before)} before, "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())} after; {os.cpu_count()} CPUs")
    print(f"| {'path':44s} | {'security':8s} | {'seconds':>7s} | {'MB/s':>7s} | {'reference s':>11s} | "
          f"{'vs reference':>12s} |")
    print(f"|{'-' * 46}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 13}|{'-' * 14}|")
    for name, security, sec_, ref in rows:
        print(f"| {name:44s} | {security:8s} | {sec_:7.3f} | {nbytes / 1e6 / sec_:7.1f} | {ref:11.3f} | "
              f"{ref / sec_:12.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
