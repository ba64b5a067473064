"""Loopback throughput of one big bundle between two fedhop processes, beside a raw TCP (or TLS) socket.

    python tests/bench/bench_transfer.py [--mb 256] [--reps 3] [--chunk-mib 1] [--no-lane] [--no-grpc] [--no-tls]
        [--no-plain] [--direction both|scatter|reply] [--trace] [--ablation]
    python tests/bench/bench_transfer.py --fresh-memory [--mb 256]

fedhop: this process is a parent (``ParentHub`` + ``NetComm`` on the PS's asyncio server); a separate ``fedhop
client`` process joins it; one ``scatter`` pushes the bundle to the client, which decodes it into one buffer,
validates it (finite values) and answers with an empty Result (scatter PS -> client); or one scatter sends an
empty task and gets the bundle back as the client's reply (reply client -> PS); one untimed call first. Timed:
scatter start to reply, i.e. snapshot, encode + checksum, transfer, decode, checksum, validation. The fedhop
rows run with the bulk lane (transport/lane.py: the chunk frames on a second connection of the session, written
from the tensors' memory and received straight into the decode buffer) and, for comparison, without it
(``FEDHOP_BULK_LANE=0``: chunk frames on the gRPC stream); plaintext and mutual TLS (certificates from a
throwaway CA).

References: a socket of the same security (raw TCP, or a TLS socket with the lane's own ``ssl`` contexts): the same
bytes from the tensor's memory with ``sendall`` to a child process that ``recv_into``s a buffer and answers one
byte. The buffer is reused, or fresh for every transfer (as a receiver that keeps the model must have: its page
faults are part of the cost; the issue's target is >= 0.9x of this), allocated two ways: ``4k`` (``torch.empty``:
the ordinary allocator's 4 KiB pages) and ``decoder`` (``codec._allocate``, as fedhop's decoder allocates it: 2 MiB
pages advised). Each fedhop row is measured rep by rep beside its references (one call, one transfer into each kind
of fresh buffer, alternating order, after one untimed of each), so that both sides of each ratio see the same
machine: its load, and how fresh the memory a new buffer gets is (on this VM a 2 MiB block that stayed free a few
seconds is reported to the host, which takes it back; touching it again costs tens of times what a recently freed
one costs: ``--fresh-memory`` shows it; docs/benchmarks.md). The ratio printed is the median over the reps of
reference seconds / fedhop seconds. ``--trace`` prints every call's phases (the client's encode, the lane's write,
the decoder's fill, finish; the socket's receives) with their threads' CPU, system CPU, context switches, page
faults and the machine's huge-page counters. ``--ablation`` adds fedhop (gRPC) with the codec's huge-page decode
buffers switched off; ``--small-pages`` switches them off in every fedhop row. Prints medians of ``--reps`` in
seconds and MB/s (1 MB = 10^6 bytes) and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

NODES = ("ps", "client-0")
TRACE_ENV = "FEDHOP_BENCH_TRACE"  # a JSON-lines file: every process of the bench appends its phases' times there


def _thread_stats() -> dict:
    """This thread's counters now: CPU seconds, context switches (voluntary / forced), page faults, its CPU."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_THREAD)
    try:
        with open("/proc/thread-self/stat") as f:
            cpu = int(f.read().rpartition(")")[2].split()[36])
    except (OSError, IndexError, ValueError):
        cpu = -1
    return {"t": time.perf_counter(), "cpu_s": time.thread_time(), "sys_s": ru.ru_stime, "vcsw": ru.ru_nvcsw,
            "icsw": ru.ru_nivcsw, "minflt": ru.ru_minflt, "core": cpu, "vm": _vmstat()}


_VMSTAT = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "compact_migrate_scanned", "pgmigrate_success")


def _vmstat() -> dict[str, int]:
    """The machine's counters of huge-page faults and memory compaction (/proc/vmstat; {} where unreadable)."""
    try:
        with open("/proc/vmstat") as f:
            return {k: int(v) for k, v in (line.split() for line in f) if k in _VMSTAT}
    except (OSError, ValueError):
        return {}


def _trace(what: str, before: dict, **extra: object) -> None:
    """Append one phase (``before``: :func:`_thread_stats` at its start) to the trace file."""
    import json

    after = _thread_stats()
    row = {"what": what, "pid": os.getpid(), "t0": before["t"], "t1": after["t"],
           **{k: after[k] - before[k] for k in ("cpu_s", "sys_s", "vcsw", "icsw", "minflt")},
           "vm": {k: v - before["vm"].get(k, 0) for k, v in after["vm"].items() if v != before["vm"].get(k, 0)},
           "cores": f"{before['core']}->{after['core']}", **extra}
    with open(os.environ[TRACE_ENV], "a") as f:
        f.write(json.dumps(row) + "\n")


def _install_trace() -> None:
    """With ``FEDHOP_BENCH_TRACE`` set: time the phases of a lane transfer in this process (the encode, the lane's
    write, the decoder's fill and finish), each with its thread's CPU, context switches and page faults."""
    if not os.environ.get(TRACE_ENV):
        return
    from fedhop.common.wire import codec, messages
    from fedhop.transport import lane as lane_mod

    def timed(owner: object, name: str, what: str) -> None:
        inner = getattr(owner, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            before = _thread_stats()
            try:
                return inner(*args, **kwargs)
            finally:
                _trace(what, before)

        setattr(owner, name, wrapper)

    timed(messages, "encode_bundle", "encode")
    timed(lane_mod.Lane, "_write_all", "lane write")
    timed(codec.BundleDecoder, "fill", "lane fill")
    timed(codec.BundleDecoder, "finish", "finish")


def _security(node: str, tls_dir: str | None):  # noqa: ANN202 (fedhop imported lazily: the children import it late)
    from fedhop.transport.credentials import PLAINTEXT, Security

    return PLAINTEXT if tls_dir is None else Security.load(node, tls_dir)


def _small_pages() -> None:
    """Decode buffers of 4 KiB pages in this process: the codec's huge-page advice off, and numpy's (numpy advises
    ``MADV_HUGEPAGE`` for every array of 4 MiB or more by itself, so the codec's fallback ``np.empty`` would still
    get 2 MiB pages)."""
    import numpy as np

    from fedhop.common.wire import codec

    codec._HUGE_BUFFER_BYTES = 1 << 62
    core = getattr(np, "_core", None) or np.core
    core.multiarray._set_madvise_hugepage(False)


def _sink_child(addr: str, plain_buffers: bool = False, tls_dir: str | None = None) -> int:
    """A client process that knows two extra tasks: take the bundle and say how many bytes it got; send one."""
    _install_trace()
    from fedhop.client.main import run_client
    from fedhop.transport.node_config import NodeConfig

    if plain_buffers:
        _small_pages()  # ablation: decode buffers of 4 KiB pages
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


#: how a reference receiver gets its buffer for each transfer (one byte before the transfer tells the child)
BUFFERS = {
    b"r": "reused",  # one preallocated buffer for every transfer (no page faults: the socket's own speed)
    b"4": "4k",  # fresh: torch.empty of the whole bundle (the ordinary allocator: 4 KiB pages, a fault each)
    b"d": "decoder",  # fresh: allocated as fedhop's decoder allocates it (codec._allocate: 2 MiB pages advised)
}


def _fresh_buffer(kind: str, nbytes: int) -> object:
    if kind == "4k":
        return torch.empty(nbytes, dtype=torch.uint8).numpy()
    from fedhop.common.wire import codec

    return codec._allocate(nbytes)


def _receive(s: socket.socket, nbytes: int) -> int:
    """Serve transfers until the parent closes: a byte naming the buffer (:data:`BUFFERS`), ``nbytes`` into it, an
    answer of one byte."""
    reused = memoryview(bytearray(1 << 22))
    while True:
        mode = s.recv(1)
        if not mode:
            return 0
        kind = BUFFERS[mode]
        before = _thread_stats()
        calls = 0
        if kind == "reused":
            left = nbytes
            while left:
                n = s.recv_into(reused[:min(left, len(reused))])
                if n == 0:
                    return 1
                left -= n
                calls += 1
        else:  # a new buffer of the whole bundle each time, as a receiver that keeps the model needs
            fresh_buf = _fresh_buffer(kind, nbytes)
            view = memoryview(fresh_buf)  # type: ignore[arg-type]
            pos = 0
            while pos < nbytes:
                n = s.recv_into(view[pos:])
                if n == 0:
                    return 1
                pos += n
                calls += 1
            del view, fresh_buf
        s.sendall(b"k")
        if os.environ.get(TRACE_ENV):
            _trace("socket recv", before, calls=calls, buffer=kind)


def _tcp_child(port: int, nbytes: int, tls_dir: str | None) -> int:
    _install_trace()
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls_dir is None:
            return _receive(raw, nbytes)
        from fedhop.transport.lane import client_context

        with client_context(_security("client-0", tls_dir)).wrap_socket(raw, server_hostname="127.0.0.1") as s:
            return _receive(s, nbytes)


class SocketReference:
    """A raw TCP (or, with ``tls_dir``, a TLS: the lane's own contexts) socket to a child process that receives
    ``payload``'s bytes, sent with ``sendall`` from the tensor's memory, into a buffer of the kind each
    :meth:`transfer` names, and answers one byte."""

    def __init__(self, payload: torch.Tensor, tls_dir: str | None = None) -> None:
        self.tls_dir = tls_dir
        self.nbytes = payload.numel() * payload.element_size()
        self.data = memoryview(payload.view(torch.uint8).numpy())
        self.conn: socket.socket | None = None
        self.child: subprocess.Popen | None = None

    def __enter__(self) -> SocketReference:
        with socket.socket() as srv:
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            port = srv.getsockname()[1]
            self.child = subprocess.Popen([sys.executable, __file__, "--tcp-child", str(port), str(self.nbytes),
                                           self.tls_dir or "-"])
            conn, _ = srv.accept()
        if self.tls_dir is not None:
            from fedhop.transport.lane import server_context

            ctx = server_context(_security("ps", self.tls_dir))
            assert ctx is not None
            conn = ctx.wrap_socket(conn, server_side=True)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = conn
        return self

    def transfer(self, buffer: str) -> float:
        """Seconds of one transfer into a buffer of kind ``buffer`` (a value of :data:`BUFFERS`)."""
        assert self.conn is not None
        mode = next(k for k, v in BUFFERS.items() if v == buffer)
        before = _thread_stats()
        t0 = time.perf_counter()
        self.conn.sendall(mode)
        self.conn.sendall(self.data)
        assert self.conn.recv(1) == b"k"
        took = time.perf_counter() - t0
        if os.environ.get(TRACE_ENV):
            _trace("socket call", before, row=f"{'TLS' if self.tls_dir else 'plain'} socket, {buffer} buffer")
        return took

    def __exit__(self, *exc: object) -> None:
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
        if self.child is not None:
            self.child.wait(30)


def bench_tcp(payload: torch.Tensor, reps: int, fresh: bool = False, tls_dir: str | None = None,
              buffer: str | None = None) -> list[float]:
    """Seconds per transfer of ``payload``'s bytes over a plain (or, with ``tls_dir``, a TLS) socket, into one
    reused buffer, or (``fresh``) a new 4 KiB-page one each time, or a buffer of kind ``buffer``."""
    with SocketReference(payload, tls_dir) as ref:
        return [ref.transfer(buffer or ("4k" if fresh else "reused")) for _ in range(reps)]


class FedhopPeer:
    """This process as a parent (``ParentHub`` + ``NetComm`` on the PS's asyncio server) and a ``fedhop client``
    process joined to it; :meth:`call` times one scatter that pushes ``payload`` to the client, or (``upload``)
    one that sends an empty task and gets ``payload``'s size back as the client's reply (client -> parent).
    ``lane``: the sessions' bulk lane on (else ``FEDHOP_BULK_LANE=0``: chunk frames on the gRPC stream)."""

    def __init__(self, payload: torch.Tensor, chunk_bytes: int, plain_buffers: bool = False, upload: bool = False,
                 lane: bool = True, tls_dir: str | None = None) -> None:
        self.payload = payload
        self.chunk_bytes = chunk_bytes
        self.plain_buffers = plain_buffers
        self.upload = upload
        self.lane = lane
        self.tls_dir = tls_dir
        self.calls = 0

    def __enter__(self) -> FedhopPeer:
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

        os.environ[ENV_SWITCH] = "1" if self.lane else "0"  # this process (the parent) and the client it starts
        sec = _security("ps", self.tls_dir)
        spec = RunSpec.parse({"name": "bench", "device": "cpu", "topology": {"clients": 1},
                              "data": {"dataset": "digits"}, "model": {"name": "mlp", "hidden": [8]},
                              "transport": {"chunk_bytes": self.chunk_bytes, "round_deadline_s": 300}})
        topo = build_topology(spec.topology, spec.seed)
        self.hub = ParentHub(HubConfig("ps", spec, topo, "bench", security=sec), ByteMeter())
        self.server = make_loop_server(sec)
        serve_parent(self.hub, self.server)
        port = add_port(self.server, "127.0.0.1:0", sec)
        self.server.start()
        self.child = subprocess.Popen([sys.executable, __file__, "--sink-child", f"127.0.0.1:{port}",
                                       *(["--plain-buffers"] if self.plain_buffers else []),
                                       *(["--tls", self.tls_dir] if self.tls_dir else [])], stderr=subprocess.DEVNULL)
        try:
            assert self.hub.wait_ready(120) == [], "the client did not join"
            self.link = self.hub.roster.links["client-0"]
            lane_open = self.link.lane is not None
            assert lane_open == self.lane, f"lane wanted: {self.lane}, lane open: {lane_open}"
            self.missing = MissingLog()
            self.comm = NetComm("ps", topo, self.missing, self.hub, spec)
            NodeContext(node_id="ps", role="server", ws=Workspace(spec, "cpu"), comm=self.comm)  # binds comm to it
        except BaseException:
            self._stop()
            raise
        return self

    def call(self) -> float:
        """Seconds of one call (scatter start to its reply)."""
        before = _thread_stats()
        t0 = time.perf_counter()
        n = self.payload.numel()
        if self.upload:
            got = self.comm.scatter(["client-0"], "bench.source", {}, {"numel": n})
            assert got["client-0"].bundle["w"].numel() == n, (got, self.missing.entries)
        else:
            got = self.comm.scatter(["client-0"], "bench.sink", {"w": self.payload})
            assert got["client-0"].scalars["bytes"] == n * 4, (got, self.missing.entries)
        del got
        took = time.perf_counter() - t0
        if os.environ.get(TRACE_ENV):
            row = f"{'reply' if self.upload else 'scatter'} {'mTLS' if self.tls_dir else 'plain'}"
            _trace("call", before, rep=self.calls, row=row)
        self.calls += 1
        return took

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None and self.lane:
            lane = self.link.lane
            assert lane is not None and lane.sent_bytes + lane.received_bytes >= self.calls * self.payload.numel()
        if exc_type is None:
            self.hub.shutdown(10, finished=True)
        self._stop()

    def _stop(self) -> None:
        if self.child.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(20)
        if self.child.poll() is None:
            self.child.kill()
        self.server.stop(0)


def bench_fedhop(payload: torch.Tensor, reps: int, chunk_bytes: int, plain_buffers: bool = False,
                 upload: bool = False, lane: bool = True, tls_dir: str | None = None) -> list[float]:
    """Times of ``reps`` calls of a :class:`FedhopPeer` after one untimed call (first-call costs; the client
    builds its tensor)."""
    with FedhopPeer(payload, chunk_bytes, plain_buffers, upload, lane, tls_dir) as peer:
        peer.call()
        return [peer.call() for _ in range(reps)]


@dataclass(frozen=True)
class Interleaved:
    """One fedhop row measured rep by rep beside its references: per rep, one call and one socket transfer into
    a fresh buffer of each kind (``4k``, ``decoder``), in alternating order, after one untimed of each."""

    fedhop: list[float]
    refs: dict[str, list[float]]

    def ratio(self, buffer: str) -> float:
        """The median over the reps of reference seconds / fedhop seconds (each rep's pair measured together)."""
        return statistics.median(r / f for r, f in zip(self.refs[buffer], self.fedhop, strict=True))


REF_BUFFERS = ("4k", "decoder")


def bench_interleaved(payload: torch.Tensor, reps: int, chunk_bytes: int, upload: bool, lane: bool,
                      tls_dir: str | None, plain_buffers: bool = False) -> Interleaved:
    """A fedhop row and its references (a socket of the same security) rep by rep: the machine's state (its
    load, and how fresh the memory a new buffer gets is: see docs/benchmarks.md) is the same for both sides of
    each ratio."""
    fed: list[float] = []
    refs: dict[str, list[float]] = {b: [] for b in REF_BUFFERS}
    with SocketReference(payload, tls_dir) as ref, FedhopPeer(payload, chunk_bytes, plain_buffers, upload, lane,
                                                              tls_dir) as peer:
        peer.call()
        for b in REF_BUFFERS:
            ref.transfer(b)
        for rep in range(reps):
            order: list[str] = ["fedhop", *REF_BUFFERS]
            for what in order if rep % 2 else reversed(order):
                if what == "fedhop":
                    fed.append(peer.call())
                else:
                    refs[what].append(ref.transfer(what))
    return Interleaved(fed, refs)


def bench_sockets(payload: torch.Tensor, reps: int, tls_dir: str | None) -> dict[str, list[float]]:
    """The socket alone, rep by rep into each kind of buffer (reused, and fresh: ``4k``, ``decoder``), in
    alternating order after one untimed transfer of each."""
    kinds = ("reused", *REF_BUFFERS)
    out: dict[str, list[float]] = {k: [] for k in kinds}
    with SocketReference(payload, tls_dir) as ref:
        for k in kinds:
            ref.transfer(k)
        for rep in range(reps):
            for k in kinds if rep % 2 else reversed(kinds):
                out[k].append(ref.transfer(k))
    return out


def fresh_memory(nbytes: int, gaps: tuple[float, ...] = (0.0, 1.0, 3.0, 6.0), reps: int = 3) -> None:
    """First touch of a fresh ``nbytes`` buffer, allocated as each reference's kind (``decoder``: 2 MiB pages
    advised; ``4k``), after the last one was freed ``gap`` seconds before: wall and system milliseconds, faults,
    and the machine's huge-page and compaction counters. Shows whether recently freed memory is cheaper to
    touch again than memory that stayed free (e.g. reported to a hypervisor that took it back)."""
    import resource

    _fresh_buffer("decoder", 1 << 20)  # imports the codec before anything is timed
    print(f"first touch of a fresh {nbytes / 1e6:.0f} MB buffer, one byte per 4 KiB; load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for kind in REF_BUFFERS:
        for gap in gaps:
            cells = []
            for _ in range(reps):
                time.sleep(gap)
                vm0, r0, t0 = _vmstat(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                buf = _fresh_buffer(kind, nbytes)
                buf[::4096] = 1  # type: ignore[index]
                t1, r1, vm1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF), _vmstat()
                del buf
                vm = {k: v - vm0.get(k, 0) for k, v in vm1.items() if v != vm0.get(k, 0)}
                cells.append(f"{1e3 * (t1 - t0):.0f}/{1e3 * (r1.ru_stime - r0.ru_stime):.0f} ms "
                             f"({r1.ru_minflt - r0.ru_minflt} faults, {vm.get('thp_fault_alloc', 0)} THP)")
            print(f"  {kind:8s} freed {gap:3.0f} s before: wall/sys {'; '.join(cells)}")
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())} after")


def _print_trace() -> None:
    """Print the phases traced since the last call (``--trace``), each call's within it, in ms from its start;
    then empty the trace file."""
    import json

    path = os.environ[TRACE_ENV]
    with open(path) as f:
        rows = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: r["t0"])
    open(path, "w").close()
    calls = [r for r in rows if r["what"] in ("call", "socket call")]
    for c in calls:
        print(f"  {c.get('row', '')} {c['what']} {c.get('rep', '')}: {1e3 * (c['t1'] - c['t0']):.0f} ms")
        for r in rows:
            if r is c or r["what"] in ("call", "socket call") or not c["t0"] <= r["t0"] <= c["t1"]:
                continue
            extra = f" calls {r['calls']}" if "calls" in r else ""
            print(f"    {r['what']:12s} pid {r['pid']:>7d} {1e3 * (r['t0'] - c['t0']):7.1f} -> "
                  f"{1e3 * (r['t1'] - c['t0']):7.1f} ms  ({1e3 * (r['t1'] - r['t0']):6.1f} ms, cpu "
                  f"{1e3 * r['cpu_s']:6.1f} ms of which sys {1e3 * r['sys_s']:6.1f}, csw {r['vcsw']}+{r['icsw']} "
                  f"forced, faults {r['minflt']}, core {r['cores']}{extra}) {r['vm'] or ''}")


def _child_main(argv: list[str]) -> int | None:
    if argv[:1] == ["--sink-child"]:
        tls = argv[argv.index("--tls") + 1] if "--tls" in argv else None
        return _sink_child(argv[1], "--plain-buffers" in argv[2:], tls)
    if argv[:1] == ["--tcp-child"]:
        return _tcp_child(int(argv[1]), int(argv[2]), None if argv[3] == "-" else argv[3])
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
    p.add_argument("--no-plain", action="store_true", help="skip the plaintext fedhop rows (their references stay)")
    p.add_argument("--direction", choices=("both", "scatter", "reply"), default="both",
                   help="only the scatter (PS -> client) or only the reply (client -> PS) fedhop rows")
    p.add_argument("--ablation", action="store_true", help="add fedhop (gRPC) with 4 KiB-page decode buffers")
    p.add_argument("--trace", action="store_true",
                   help="print each call's phases (encode, lane write, fill, finish; the sockets' receives) with their "
                        "threads' CPU, context switches and page faults")
    p.add_argument("--small-pages", action="store_true",
                   help="every fedhop row with 4 KiB-page decode buffers (the codec's huge-page advice off, both ends)")
    p.add_argument("--fresh-memory", action="store_true",
                   help="only time the first touch of fresh buffers (4 KiB and 2 MiB pages) after gaps of 0-6 s")
    a = p.parse_args()
    if a.fresh_memory:
        fresh_memory(a.mb << 20)
        return 0
    trace = None
    if a.trace:
        fd, trace = tempfile.mkstemp(prefix="bench-transfer-trace-", suffix=".jsonl")
        os.close(fd)
        os.environ[TRACE_ENV] = trace  # this process and every child it starts
        _install_trace()
    if a.small_pages:
        _small_pages()  # this process (the parent's decoder); the clients: --plain-buffers
    torch.set_num_threads(1)
    payload = torch.randn((a.mb << 20) // 4, generator=torch.Generator().manual_seed(0))
    nbytes = payload.numel() * 4
    chunk = int(a.chunk_mib * (1 << 20))
    load_before = os.getloadavg()
    rows: list[tuple[str, str, Interleaved]] = []  # (path, security, its times beside its references')
    socket_names = {"reused": "{} (sendall / recv_into)", "4k": "{} into a fresh 4 KiB-page buffer",
                    "decoder": "{} into a fresh decoder buffer (2 MiB pages)"}
    lanes = ([True] if not a.no_lane else []) + ([False] if not a.no_grpc else [])
    directions = [(u, w) for u, w in ((False, "scatter PS -> client"), (True, "reply client -> PS"))
                  if a.direction == "both" or (a.direction == "reply") == u]
    with tempfile.TemporaryDirectory() as d:
        tls_dirs: list[str | None] = [None]
        if not a.no_tls:
            from fedhop.transport.certs import init_folder

            init_folder(Path(d), list(NODES))
            tls_dirs.append(d)
        for tls in tls_dirs:
            security, sock = ("plain", "raw TCP") if tls is None else ("mTLS", "TLS socket")
            alone = bench_sockets(payload, a.reps, tls)
            refs = {b: alone[b] for b in REF_BUFFERS}
            for kind, name in socket_names.items():
                rows.append((name.format(sock), security, Interleaved(alone[kind], refs)))
            if trace is not None:
                _print_trace()
            if tls is None and a.no_plain:
                continue
            for lane in lanes:
                how = "lane" if lane else "gRPC"
                for upload, what in directions:
                    got = bench_interleaved(payload, a.reps, chunk, upload, lane, tls, plain_buffers=a.small_pages)
                    rows.append((f"fedhop {what} ({how})", security, got))
                    if trace is not None:
                        _print_trace()
        if a.ablation:
            got = bench_interleaved(payload, a.reps, chunk, False, False, None, plain_buffers=True)
            rows.append(("  fedhop scatter (gRPC), 4 KiB-page buffer", "plain", got))
    print(f"\nloopback transfer of one {nbytes / 1e6:.0f} MB bundle ({nbytes:,} B), median of {a.reps}, chunk "
          f"{a.chunk_mib:g} MiB; load average {' '.join(f'{v:.2f}' for v in load_before)} before, "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())} after; {os.cpu_count()} CPUs")
    print("references: a socket of the same security into a fresh buffer, 4 KiB pages (torch.empty) or the "
          "decoder's (codec._allocate), measured rep by rep beside each row; 'vs' = median of the reps' ratios"
          + ("; fedhop's decode buffers: 4 KiB pages (--small-pages)" if a.small_pages else ""))
    print(f"| {'path':52s} | {'security':8s} | {'seconds':>7s} | {'MB/s':>7s} | {'4k ref s':>8s} | {'vs 4k':>5s} | "
          f"{'dec ref s':>9s} | {'vs dec':>6s} |")
    print(f"|{'-' * 54}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 10}|{'-' * 7}|{'-' * 11}|{'-' * 8}|")
    for name, security, got in rows:
        sec_ = statistics.median(got.fedhop)
        print(f"| {name:52s} | {security:8s} | {sec_:7.3f} | {nbytes / 1e6 / sec_:7.1f} | "
              f"{statistics.median(got.refs['4k']):8.3f} | {got.ratio('4k'):5.2f} | "
              f"{statistics.median(got.refs['decoder']):9.3f} | {got.ratio('decoder'):6.2f} |")
    print("each rep (seconds: the row's, then its 4k and decoder references'):")
    for name, security, got in rows:
        if name.startswith(("fedhop", "  fedhop")):
            reps = "; ".join(f"{f:.3f} {r4:.3f} {rd:.3f}" for f, r4, rd in
                             zip(got.fedhop, got.refs["4k"], got.refs["decoder"], strict=True))
            print(f"  {name.strip()} {security}: {reps}")
    if trace is not None:
        os.unlink(trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
