"""Loopback throughput of one big bundle between two fedhop processes, beside a raw TCP socket.

    python tests/bench/bench_transfer.py [--mb 256] [--reps 3] [--chunk-mib 1 4]

fedhop: this process is a parent (``ParentHub`` + ``NetComm``, as in the PS); a separate ``fedhop client``
process joins it over gRPC; one ``scatter`` pushes the bundle to the client, which decodes it into one buffer,
validates it (finite values) and answers with an empty Result. Timed: scatter start to reply, i.e. snapshot,
encode + checksum, chunked gRPC stream, decode, checksum, validation. Raw TCP: the same bytes from the
tensor's memory with ``sendall`` to a child process that ``recv_into``s a preallocated buffer and answers
one byte. Both on 127.0.0.1, same run. Prints MB/s (1 MB = 10^6 bytes) and the ratio.

Two more rows put the ratio in context: raw TCP into a fresh buffer of the bundle's size per transfer (as a
receiver that keeps the model must have; its page faults are part of the cost), and fedhop with the codec's
huge-page decode buffers switched off (``--plain-buffers`` ablation: every 4 KiB page of the decode buffer
faults on first write). And a prototype of a bulk byte lane (``--no-lane`` skips it): the header travels
length-prefixed on a plain TCP socket, the payload follows as the tensors' bytes (``sendall`` from their
memory), the receiver decodes with ``BundleDecoder.fill(sock.recv_into)`` (straight into its decode buffer,
xxh3 on both sides, the same finiteness check as the client) and answers one byte: what fedhop's transfer
would cost if bundles bypassed gRPC's message copies.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import time

import torch


def _sink_child(addr: str, plain_buffers: bool = False) -> int:
    """A client process that knows one extra task: take the bundle, say how many bytes it got."""
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

    return run_client(NodeConfig("client-0", addr, device="cpu"))


def _tcp_child(port: int, nbytes: int, reps: int, fresh: bool) -> int:
    buf = bytearray(1 << 22)
    view = memoryview(buf)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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


def _lane_child(port: int, reps: int) -> int:
    from fedhop.common.wire.bundle import non_finite
    from fedhop.common.wire.codec import BundleDecoder
    from fedhop.v1 import fedhop_pb2 as pb

    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(reps):
            (n,) = struct.unpack("<I", s.recv(4, socket.MSG_WAITALL))
            header = pb.BundleHeader.FromString(s.recv(n, socket.MSG_WAITALL))
            decoder = BundleDecoder(header)
            decoder.fill(s.recv_into)
            bundle = decoder.finish()
            assert not non_finite(bundle)
            s.sendall(b"k")
            del bundle
    return 0


def bench_lane(payload: torch.Tensor, reps: int) -> list[float]:
    from fedhop.common.wire.codec import encode_views

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        child = subprocess.Popen([sys.executable, __file__, "--lane-child", str(port), str(reps)])
        conn, _ = srv.accept()
        times = []
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(reps):
                t0 = time.perf_counter()
                header, chunks = encode_views({"w": payload}, 64 << 20)
                head = header.SerializeToString()
                conn.sendall(struct.pack("<I", len(head)) + head)
                for c in chunks:
                    conn.sendall(c.data)
                assert conn.recv(1) == b"k"
                times.append(time.perf_counter() - t0)
        child.wait(30)
    return times


def bench_tcp(payload: torch.Tensor, reps: int, fresh: bool = False) -> list[float]:
    nbytes = payload.numel() * payload.element_size()
    data = memoryview(payload.view(torch.uint8).numpy())
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        child = subprocess.Popen([sys.executable, __file__, "--tcp-child", str(port), str(nbytes), str(reps),
                                  str(int(fresh))])
        conn, _ = srv.accept()
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
                 upload: bool = False) -> list[float]:
    """Best-of times of a scatter that pushes ``payload`` to the client, or (``upload``) of one that sends an
    empty task and gets ``payload``'s size back as the client's reply (the client -> parent direction, whose
    flow-control windows the parent's gRPC server sets)."""
    from fedhop.common.engine.api import NodeContext
    from fedhop.common.engine.base import MissingLog
    from fedhop.common.engine.workspace import Workspace
    from fedhop.common.spec import RunSpec
    from fedhop.common.topology import build_topology
    from fedhop.common.wire.meter import ByteMeter
    from fedhop.transport.channels import add_port, make_server
    from fedhop.transport.netcomm import NetComm
    from fedhop.transport.parent import serve_parent
    from fedhop.transport.session import HubConfig, ParentHub

    spec = RunSpec.parse({"name": "bench", "device": "cpu", "topology": {"clients": 1},
                          "data": {"dataset": "digits"}, "model": {"name": "mlp", "hidden": [8]},
                          "transport": {"chunk_bytes": chunk_bytes, "round_deadline_s": 300}})
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig("ps", spec, topo, "bench"), ByteMeter())
    server = make_server(8)
    serve_parent(hub, server)
    port = add_port(server, "127.0.0.1:0")
    server.start()
    child = subprocess.Popen([sys.executable, __file__, "--sink-child", f"127.0.0.1:{port}",
                              *(["--plain-buffers"] if plain_buffers else [])], stderr=subprocess.DEVNULL)
    try:
        assert hub.wait_ready(120) == [], "the client did not join"
        missing = MissingLog()
        comm = NetComm("ps", topo, missing, hub, spec)
        NodeContext(node_id="ps", role="server", ws=Workspace(spec, "cpu"), comm=comm)  # binds comm to it
        bundle = {"w": payload}
        times = []
        for rep in range(reps + upload):  # upload: one untimed call first, in which the client builds its tensor
            t0 = time.perf_counter()
            if upload:
                got = comm.scatter(["client-0"], "bench.source", {}, {"numel": payload.numel()})
                assert got["client-0"].bundle["w"].numel() == payload.numel(), (got, missing.entries)
                del got
                if rep == 0:
                    continue
            else:
                got = comm.scatter(["client-0"], "bench.sink", bundle)
                assert got["client-0"].scalars["bytes"] == payload.numel() * 4, (got, missing.entries)
            times.append(time.perf_counter() - t0)
        hub.shutdown(10, finished=True)
        return times
    finally:
        child.wait(20) if child.poll() is None else None
        if child.poll() is None:
            child.kill()
        server.stop(0)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--sink-child":
        return _sink_child(sys.argv[2], "--plain-buffers" in sys.argv[3:])
    if len(sys.argv) > 1 and sys.argv[1] == "--lane-child":
        return _lane_child(int(sys.argv[2]), int(sys.argv[3]))
    if len(sys.argv) > 1 and sys.argv[1] == "--tcp-child":
        return _tcp_child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256, help="bundle size in MiB")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk-mib", type=float, nargs="+", default=[1.0, 4.0])
    p.add_argument("--no-lane", action="store_true", help="skip the bulk-lane prototype row")
    p.add_argument("--no-ablation", action="store_true", help="skip the 4 KiB-page decode buffer row")
    a = p.parse_args()
    torch.set_num_threads(1)
    payload = torch.randn((a.mb << 20) // 4, generator=torch.Generator().manual_seed(0))
    nbytes = payload.numel() * 4
    rows = []
    tcp = bench_tcp(payload, a.reps)
    rows.append(("raw TCP socket (sendall / recv_into)", "-", min(tcp)))
    rows.append(("raw TCP into a fresh bundle-size buffer", "-", min(bench_tcp(payload, a.reps, fresh=True))))
    for c in a.chunk_mib:
        t = bench_fedhop(payload, a.reps, int(c * (1 << 20)))
        rows.append(("fedhop scatter PS -> client (gRPC)", f"{c:g} MiB", min(t)))
    for c in a.chunk_mib:
        t = bench_fedhop(payload, a.reps, int(c * (1 << 20)), upload=True)
        rows.append(("fedhop reply client -> PS (gRPC)", f"{c:g} MiB", min(t)))
    if not a.no_lane:
        rows.append(("prototype bulk lane: TCP + codec fill()", "-", min(bench_lane(payload, a.reps))))
    if not a.no_ablation:
        t = bench_fedhop(payload, a.reps, int(a.chunk_mib[0] * (1 << 20)), plain_buffers=True)
        rows.append(("  same, 4 KiB-page decode buffer", f"{a.chunk_mib[0]:g} MiB", min(t)))
    print(f"\nloopback transfer of one {nbytes / 1e6:.0f} MB bundle ({nbytes:,} B), best of {a.reps}; load "
          f"average {' '.join(f'{v:.1f}' for v in os.getloadavg())}, {os.cpu_count()} CPUs")
    print(f"{'path':40s} {'chunk':>8s} {'seconds':>8s} {'MB/s':>9s} {'vs TCP':>7s}")
    for name, chunk, s in rows:
        print(f"{name:40s} {chunk:>8s} {s:8.3f} {nbytes / 1e6 / s:9.1f} {min(tcp) / s:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
