"""The kernel's TCP counters of this process's own connections, read without root (the ``wire`` level).

Linux answers ``sock_diag`` (inet_diag over netlink) to any user for the sockets it may see; with the
``INET_DIAG_INFO`` extension every TCP socket comes with its ``struct tcp_info``. A node keeps only the sockets
it owns (their inodes are the ``socket:[N]`` links in ``/proc/self/fd``) and attributes each to a peer node by
the socket's remote address (:func:`attribute`): a parent knows each child's address as gRPC saw it
(``ipv4:10.0.0.7:53122``, the remote end of the accepted socket), so every child's connection is read by its
parent and by nobody else (no connection is counted twice).

Counters per connection and direction (this node -> peer, peer -> this node):

* ``wire_bytes``: the TCP stream bytes the peer acknowledged (``tcpi_bytes_acked``) / this node received
  (``tcpi_bytes_received``): HTTP/2 and TLS framing included, retransmissions and TCP/IP headers not;
* ``wire_segments``: segments sent (``tcpi_segs_out``) / received (``tcpi_segs_in``), so a reader may add
  headers (about 52 bytes each for IPv4 with timestamps);
* ``wire_retrans``: segments this node retransmitted (``tcpi_total_retrans``); the peer's retransmissions
  are known only to the peer (0 in the other direction).

A small netlink reader (no dependency): the request is ``inet_diag_req_v2`` and the reply ``inet_diag_msg``
followed by route attributes (``linux/inet_diag.h``, ``linux/tcp.h``). The kernel is asked only for the
sockets that can be this node's links (:func:`port_filter`: an ``INET_DIAG_REQ_BYTECODE`` filter on the local
port, the ports this process listens on, or the remote port of a dialed node): a dump of every TCP socket of
the machine (4 per client where the PS and its clients' hosts share it) cost the PS's round thread ~0.3 s a
round at 1,000 clients (issue 19). Where the kernel refuses (no
``inet_diag`` module, a seccomp filter, not Linux) :class:`TcpCounters` says so once in the log and reads
nothing: the wire level stays empty rather than wrong.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fedhop.common.wire.meter import ByteMeter

log = logging.getLogger("fedhop.wire")

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
INET_DIAG_INFO = 2
INET_DIAG_REQ_BYTECODE = 1  # the request's attribute that carries a filter program
# struct inet_diag_bc_op's codes (linux/inet_diag.h): JMP, and the port comparisons every kernel since 2.6 has
INET_DIAG_BC_JMP, INET_DIAG_BC_S_GE, INET_DIAG_BC_S_LE, INET_DIAG_BC_D_GE, INET_DIAG_BC_D_LE = 1, 2, 3, 4, 5
TCP_LISTEN = 10  # linux/tcp_states.h
ALL_STATES = 0xFFFFFFFF
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQ = struct.Struct("=BBBxI")  # family, protocol, ext, pad, states (then a 48-byte inet_diag_sockid of zeros)
_MSG = struct.Struct("=BBBBHH16s16sI8sIIIII")  # inet_diag_msg: 72 bytes
_RTA = struct.Struct("=HH")
_OP = struct.Struct("=BBH")  # struct inet_diag_bc_op: code, yes, no (byte offsets from this op)
# offsets in struct tcp_info (linux/tcp.h)
_TOTAL_RETRANS, _BYTES_ACKED, _BYTES_RECEIVED, _SEGS_OUT, _SEGS_IN = 100, 120, 128, 136, 140
_TCP_INFO_MIN = _SEGS_IN + 4  # Linux >= 4.2 (bytes_received, segs_in)

Address = tuple[str, int]  # (normalised ip, port)


@dataclass(frozen=True)
class TcpInfo:
    """One TCP socket: its addresses, inode and cumulative counters (this socket's side of the connection)."""

    local: Address
    remote: Address
    inode: int
    bytes_acked: int  # stream bytes this side sent that the other side acknowledged
    bytes_received: int
    segs_out: int
    segs_in: int
    total_retrans: int


@dataclass(frozen=True)
class WireDelta:
    """What one directed link carried since the previous read."""

    src: str
    dst: str
    wire_bytes: int
    wire_segments: int
    wire_retrans: int


@functools.lru_cache(maxsize=1 << 16)
def normalise_ip(ip: str) -> str:
    """``::ffff:10.0.0.1`` -> ``10.0.0.1``; IPv6 compressed; anything else unchanged.

    Cached: a read parses every TCP socket of the machine (two addresses each; ~4,500 sockets while 1,000
    clients run on it), and ``ipaddress`` takes ~3 us an address, on the PS's round thread, for the same few
    addresses (issue 19)."""
    try:
        a = ipaddress.ip_address(ip.strip("[]").split("%")[0])
    except ValueError:
        return ip
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        return str(a.ipv4_mapped)
    return str(a)


def parse_grpc_peer(peer: str) -> Address | None:
    """gRPC's ``context.peer()`` (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``ipv6:%5B::1%5D:5000``) as an
    address; None for a peer without one (``unix:``, ``local:``)."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6") or ":" not in rest:
        return None
    host, _, port = rest.replace("%5B", "[").replace("%5D", "]").rpartition(":")
    try:
        return normalise_ip(host), int(port)
    except ValueError:
        return None


def resolve(target: str) -> list[Address]:
    """The addresses a ``host:port`` dial target resolves to ([] where it does not)."""
    host, _, port = target.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return []
    return sorted({(normalise_ip(str(sa[0])), int(sa[1])) for *_, sa in infos})


def parse_tcp_info(buf: bytes) -> tuple[int, int, int, int, int] | None:
    """(bytes_acked, bytes_received, segs_out, segs_in, total_retrans) of a ``struct tcp_info``; None when the
    kernel's struct is too old to hold them."""
    if len(buf) < _TCP_INFO_MIN:
        return None
    (total_retrans,) = struct.unpack_from("=I", buf, _TOTAL_RETRANS)
    acked, received = struct.unpack_from("=QQ", buf, _BYTES_ACKED)
    segs_out, segs_in = struct.unpack_from("=II", buf, _SEGS_OUT)
    return acked, received, segs_out, segs_in, total_retrans


def _ip(family: int, raw: bytes) -> str:
    return normalise_ip(socket.inet_ntop(family, raw[:4] if family == socket.AF_INET else raw))


def parse_diag_messages(data: bytes) -> tuple[list[TcpInfo], bool]:
    """The TCP sockets in one netlink reply buffer, and whether the dump ended (NLMSG_DONE) in it.
    Raises OSError for an NLMSG_ERROR."""
    out: list[TcpInfo] = []
    off = 0
    while off + _NLMSG.size <= len(data):
        length, mtype, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
        if length < _NLMSG.size:
            break
        body = data[off + _NLMSG.size: off + length]
        off += (length + 3) & ~3
        if mtype == NLMSG_DONE:
            return out, True
        if mtype == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", body, 0)
            if err:
                raise OSError(-err, f"sock_diag: {os.strerror(-err)}")
            continue
        if mtype != SOCK_DIAG_BY_FAMILY or len(body) < _MSG.size:
            continue
        family, _state, _timer, _retrans, sport, dport, src, dst, _if, _cookie, _exp, _rq, _wq, _uid, inode = \
            _MSG.unpack_from(body, 0)
        info = None
        a = _MSG.size
        while a + _RTA.size <= len(body):
            rlen, rtype = _RTA.unpack_from(body, a)
            if rlen < _RTA.size:
                break
            if rtype == INET_DIAG_INFO:
                info = parse_tcp_info(body[a + _RTA.size: a + rlen])
            a += (rlen + 3) & ~3
        if info is None:
            continue
        out.append(TcpInfo((_ip(family, src), socket.ntohs(sport)), (_ip(family, dst), socket.ntohs(dport)),
                           inode, *info))
    return out, False


def _port_is(side: str, port: int) -> bytes:
    """A filter program accepting the sockets whose ``side`` ("local" or "remote") port is ``port``: >= then
    <= (each op followed by an op that holds the port in its ``no``), a failed test jumps 4 bytes past the
    program's end (the kernel's "reject")."""
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"not a TCP port: {port}")
    ge, le = (INET_DIAG_BC_S_GE, INET_DIAG_BC_S_LE) if side == "local" else (INET_DIAG_BC_D_GE, INET_DIAG_BC_D_LE)
    return (_OP.pack(ge, 8, 16 + 4) + _OP.pack(0, 0, port)
            + _OP.pack(le, 8, 8 + 4) + _OP.pack(0, 0, port))


def port_filter(local_ports: Iterable[int] = (), remote_ports: Iterable[int] = ()) -> bytes:
    """An ``inet_diag`` filter program (``INET_DIAG_REQ_BYTECODE``, ``linux/inet_diag.h``) that accepts a
    socket whose local port is one of ``local_ports`` or whose remote port is one of ``remote_ports``; b"" for
    none (nothing to ask for).

    The kernel runs it op by op: an op's test true moves ``yes`` bytes on, false ``no`` bytes; a socket is
    accepted when the program ends exactly at its last byte, rejected when a jump lands past it. The tests are
    ORed as ``ss`` does: each test's reject lands 4 bytes past its own end, on the next test, behind a ``JMP``
    whose ``no`` (a JMP always takes ``no``) jumps to the program's end, i.e. accepts (the kernel's audit wants
    every jump target on the chain of ``yes`` jumps from the start: the JMP's ``yes`` of 4 puts the next test
    there)."""
    tests = [_port_is("local", p) for p in sorted(set(local_ports))]
    tests += [_port_is("remote", p) for p in sorted(set(remote_ports))]
    prog = b""
    for t in reversed(tests):
        prog = t if not prog else t + _OP.pack(INET_DIAG_BC_JMP, 4, len(prog) + 4) + prog
    return prog


def diag_request(family: int, seq: int, bytecode: bytes = b"", states: int = ALL_STATES) -> bytes:
    """A dump request for the TCP sockets of ``family`` in ``states`` (a bit per ``linux/tcp_states.h`` state)
    with their tcp_info; ``bytecode``: a filter program (:func:`port_filter`), b"" for every socket."""
    req = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), states) + bytes(48)
    if bytecode:
        req += _RTA.pack(_RTA.size + len(bytecode), INET_DIAG_REQ_BYTECODE) + bytecode
    return _NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + req


def dump_tcp_sockets(bytecode: bytes = b"", states: int = ALL_STATES) -> list[TcpInfo]:
    """The TCP sockets (IPv4 and IPv6) in ``states`` that the kernel shows this user and ``bytecode`` accepts
    (every one for b""), with their counters. Raises OSError where sock_diag is unavailable."""
    out: list[TcpInfo] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as s:
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            s.sendall(diag_request(family, seq, bytecode, states))
            while True:
                infos, done = parse_diag_messages(s.recv(1 << 16))
                out.extend(infos)
                if done:
                    break
    return out


def own_socket_inodes(fd_dir: str = "/proc/self/fd") -> set[int]:
    """The inodes of the sockets this process holds open."""
    out: set[int] = set()
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def attribute(me: str, infos: Iterable[TcpInfo], peers: Mapping[Address, str],
              last: dict[tuple[Address, Address], TcpInfo]) -> list[WireDelta]:
    """Deltas per directed link since ``last`` (updated in place), for the sockets whose remote address is in
    ``peers`` (address -> node id). A socket not in ``last`` counts from zero (a new connection); sockets that
    closed since are forgotten. Deltas of several sockets to one peer are summed; empty ones are left out."""
    sums: dict[tuple[str, str], list[int]] = {}
    seen: set[tuple[Address, Address]] = set()
    for t in infos:
        peer = peers.get(t.remote)
        if peer is None:
            continue
        key = (t.local, t.remote)
        seen.add(key)
        before = last.get(key)
        last[key] = t
        if before is not None and before.inode != t.inode:
            before = None  # the 4-tuple was reused by a new connection
        d = [t.bytes_acked, t.bytes_received, t.segs_out, t.segs_in, t.total_retrans]
        if before is not None:
            d = [a - b for a, b in zip(d, [before.bytes_acked, before.bytes_received, before.segs_out,
                                           before.segs_in, before.total_retrans], strict=True)]
        out_ = sums.setdefault((me, peer), [0, 0, 0])
        in_ = sums.setdefault((peer, me), [0, 0, 0])
        out_[0] += d[0]
        out_[1] += d[2]
        out_[2] += d[4]
        in_[0] += d[1]
        in_[1] += d[3]
    for key in [k for k in last if k not in seen]:
        del last[key]
    return [WireDelta(src, dst, *v) for (src, dst), v in sorted(sums.items()) if any(v)]


class TcpCounters:
    """Reads this process's TCP sockets that can be a node's links; :attr:`available` is False (said once in
    the log) where it cannot.

    Two dumps per read, both filtered by the kernel: the listening sockets (a few on any machine), whose ports
    this process's own give the local ports of its accepted connections (the gRPC server's, a bulk lane
    listener's); then the sockets on those ports or to a dialed node's port (:func:`port_filter`), of which the
    process's own (their inodes) are kept. A port once listened on stays asked for (connections accepted on it
    outlive a closed listener)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.available = True
        self.last_read_s = 0.0  # seconds the latest read took (docs/benchmarks.md)
        self.listening: set[int] = set()  # the local ports this process listened on (seen by a read)

    def read(self, remote_ports: Iterable[int] = ()) -> list[TcpInfo]:
        """This process's TCP sockets on a port it listens on, or to one of ``remote_ports`` (the nodes it dials),
        with their counters; [] (and a warning, once) where sock_diag fails."""
        if not self.available:
            return []
        t0 = time.perf_counter()
        try:
            mine = own_socket_inodes()
            self.listening.update(t.local[1] for t in dump_tcp_sockets(states=1 << TCP_LISTEN) if t.inode in mine)
            bytecode = port_filter(self.listening, remote_ports)
            infos = [t for t in dump_tcp_sockets(bytecode) if t.inode in mine] if bytecode else []
        except OSError as e:
            self.available = False
            log.warning("%s: the kernel's TCP counters (sock_diag / inet_diag) cannot be read (%s); links.csv "
                        "gets no wire level from this node", self.node, e)
            return []
        self.last_read_s = time.perf_counter() - t0
        return infos


class WireProbe:
    """A node's wire level: at each round boundary (the first call of a later round) and once at the end
    (:meth:`flush`), reads this process's TCP counters and records what each child's connection carried since
    the previous read as wire rows of the round that just ended (``ByteMeter.record_wire``).

    ``peers()`` names the remote addresses this node attributes (address -> node id); a parent gives its
    children's addresses as gRPC saw them. ``dialed()`` (optional) names the nodes this node dials itself
    (node id -> ``host:port``, an edge's neighbours for hand-offs): its connections to their listening address
    are its own to read (the neighbour sees only an unnamed ephemeral port). One read per round, whatever the
    number of messages."""

    def __init__(self, node: str, meter: ByteMeter, peers: Callable[[], Mapping[Address, str]],
                 counters: TcpCounters | None = None) -> None:
        self.node = node
        self.meter = meter
        self.peers = peers
        self.counters = counters if counters is not None else TcpCounters(node)
        self.round = -1  # the round whose traffic the next read is counted in
        self._last: dict[tuple[Address, Address], TcpInfo] = {}
        self._lock = threading.Lock()
        self.dialed: Callable[[], Mapping[str, str]] | None = None
        self._resolved: dict[str, list[Address]] = {}

    def addresses(self) -> dict[Address, str]:
        """Remote address -> node id: the children's (``peers()``) and the dialed nodes' (resolved once)."""
        return {**self._dialed_addresses(), **self.peers()}

    def _dialed_addresses(self) -> dict[Address, str]:
        out: dict[Address, str] = {}
        for node, target in list((self.dialed() if self.dialed is not None else {}).items()):
            if target not in self._resolved:
                self._resolved[target] = resolve(target)
            for a in self._resolved[target]:
                out.setdefault(a, node)
        return out

    def round_boundary(self, round_idx: int) -> None:
        """A call of ``round_idx``: when it is a later round than the current one, the current round's traffic
        is read and recorded."""
        if round_idx <= self.round:
            return
        with self._lock:
            if round_idx > self.round:
                self._sample()
                self.round = round_idx

    def flush(self) -> None:
        """Read and record what the connections carried since the last read (before the session ends)."""
        with self._lock:
            self._sample()

    def _sample(self) -> None:
        dialed = self._dialed_addresses()
        infos = self.counters.read(sorted({port for _, port in dialed}))  # their connections' remote port
        if not infos:
            return
        for d in attribute(self.node, infos, {**dialed, **self.peers()}, self._last):
            self.meter.record_wire(d.src, d.dst, self.round, d.wire_bytes, d.wire_segments, d.wire_retrans)
