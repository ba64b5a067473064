"""The bulk lane: a second TCP (or TLS) connection per parent session that carries only bundle payloads.

gRPC stays the control plane: every frame of a message (its Task / Result / Post frame and its bundle's header
frame) still travels on the session stream, and only the chunk frames go on the lane: the very bytes the stream
would have carried (each frame's few head bytes, then its data), written from the tensors' memory (``sendmsg`` of
views, never joined) and received straight into the decode buffer (or the streamed fold's sink), each frame's
head checked on the way (its call, its offset, its length: a lane out of step fails before a wrong byte lands).
gRPC's message copies and HTTP/2 flow control are what kept a 256 MB transfer at a fifth of a raw socket's speed
(docs/benchmarks.md, issue 19).

Set-up (a session's, after its Hello): the parent's servicer offers a lane in the stream's initial metadata
(:data:`LANE_METADATA`: the lane port, a one-time token, and the smallest payload the lane carries); the child,
once it holds the Welcome and before it sends anything else, dials the parent's host at that port, says
:data:`MAGIC` and the token, and waits for one byte. The parent's :class:`LaneServer` accepts a token once, for
the session it was made for, from the host the session's stream comes from (loopback counts as one host); with
mutual TLS the lane is TLS with the same certificates and the client certificate must name the same node as the
session's; a connection without a good token (or with another node's certificate) is refused and logged, and
changes nothing. A lane from another address than its stream's (a delay proxy in front of the parent's gRPC port,
``deploy/delay_proxy.py``, whose emulated link the lane would skip) is refused too, and that session keeps its
bundles on the stream. The listener binds the host of the node's gRPC port (every interface for a wildcard ``--listen``;
``FEDHOP_BULK_LANE_HOST`` to choose) on a port of the system's choosing: a firewall or a container that
publishes only the gRPC port refuses the lane, and the sessions fall back. A child that cannot open the lane (port
refused, a firewall, a refusal, ``FEDHOP_BULK_LANE=0`` on either side) sends and receives its bundles as
chunk frames as before.

The rule both ends apply to each bundle: it goes on the lane iff the session's lane is up and its payload is at
least the offered ``min_bytes`` (``FEDHOP_BULK_LANE_MIN_BYTES`` at the parent, default 1 MiB: small bundles
stay on the stream). Payloads go in the order of their header frames (one writer per lane, fed in the order the
stream takes the messages). Counting does not change: the sender meters the bytes of the message's frames
(``BundleMessage.message_bytes``) and the receiver the same (``MessageAssembler``); the lane's TCP counters are
the child's connection's too (the wire level: the lane carries the chunk frames' bytes, so payload <= message <=
wire still holds per link). A lane that breaks (a peer that died mid-payload) fails the
message being read and ends its session, as a broken stream does: the reply is missing with a reason, the
child re-joins, and the new session gets a new lane.

Scope: the sessions of a :class:`~fedhop.transport.session.ParentHub` (PS and edge parents, both directions).
Edge-to-edge hand-offs and peer posts (``Edge.HandOff``) and sessions an edge accepted before it knew its run
(its ``PendingHub``) stay on gRPC.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import ipaddress
import logging
import os
import resource
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509

from fedhop.common.testhooks import mark
from fedhop.transport.certs import node_files, node_id_of
from fedhop.transport.credentials import Security
from fedhop.transport.tcp_counters import Address, normalise_ip, parse_grpc_peer

log = logging.getLogger("fedhop.lane")

LANE_METADATA = "fedhop-lane"  # the servicer's initial metadata: "<port> <token> <min_bytes>"
ENV_SWITCH = "FEDHOP_BULK_LANE"  # "0" (or off/false/no): no lane offered or dialed by this process
ENV_MIN_BYTES = "FEDHOP_BULK_LANE_MIN_BYTES"  # the smallest payload a parent's lanes carry
ENV_HOST = "FEDHOP_BULK_LANE_HOST"  # where a parent's lane listener binds (default: where its gRPC port does)
DEFAULT_MIN_BYTES = 1 << 20
MAGIC = b"FHLANE1\n"
TOKEN_CHARS = 32
OK = b"\x01"
HANDSHAKE_S = 5.0  # the lane's connect, TLS handshake and token exchange, each side
MAX_HANDSHAKES = 64  # lane connections a parent checks at once (each holds a thread for up to HANDSHAKE_S)
_DRAIN_PIECE = 1 << 20
_BATCH_BYTES = 16 << 20  # one sendmsg writes up to this much (several chunk frames) ...
_BATCH_BUFFERS = 512  # ... in at most this many buffers (IOV_MAX is 1024)


_listen_host: str | None = None  # the host of this process's gRPC port (note_listen_address), "" = every interface
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]", "*")


def note_listen_address(listen: str) -> None:
    """This process serves gRPC on ``listen`` (HOST:PORT; ``transport.channels.add_port`` calls this): its lane
    listener binds the same host, so a PS on 127.0.0.1 opens no lane port on the machine's other interfaces
    (a wildcard host: every interface). ``FEDHOP_BULK_LANE_HOST`` overrides."""
    global _listen_host
    host = listen.rpartition(":")[0]
    _listen_host = "" if host in WILDCARD_HOSTS else host.strip("[]")


def lane_host() -> str:
    """Where this process's lane listener binds: ``FEDHOP_BULK_LANE_HOST``, else the host of its gRPC port, else
    every interface ("")."""
    return os.environ.get(ENV_HOST) or _listen_host or ""


def max_lanes() -> int:
    """How many lanes a parent keeps open or offered at once: a quarter of its file-descriptor limit (each lane is
    one, beside its session's gRPC connection), so that lanes never starve the sessions themselves."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 256
    return 1 << 20 if soft == resource.RLIM_INFINITY else max(0, soft // 4)


def lane_enabled() -> bool:
    """Whether this process offers and dials bulk lanes (``FEDHOP_BULK_LANE``, on unless 0/off/false/no)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def lane_min_bytes() -> int:
    raw = os.environ.get(ENV_MIN_BYTES, "")
    try:
        return max(1, int(raw)) if raw.strip() else DEFAULT_MIN_BYTES
    except ValueError:
        log.warning("%s=%r is not a number of bytes; using %d", ENV_MIN_BYTES, raw, DEFAULT_MIN_BYTES)
        return DEFAULT_MIN_BYTES


@dataclass(frozen=True)
class LaneOffer:
    """What a parent's servicer tells a child about the lane of its session."""

    port: int
    token: str
    min_bytes: int

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((LANE_METADATA, f"{self.port} {self.token} {self.min_bytes}"),)

    @classmethod
    def parse(cls, metadata: Iterable[tuple[str, object]] | None) -> LaneOffer | None:
        """The offer in a stream's initial metadata (None: no offer, or one this node cannot read)."""
        for key, value in metadata or ():
            if key != LANE_METADATA:
                continue
            parts = str(value).split()
            try:
                port, token, min_bytes = int(parts[0]), parts[1], int(parts[2])
            except (IndexError, ValueError):
                log.warning("unreadable bulk-lane offer %r; bundles travel on the gRPC stream", value)
                return None
            if not 0 < port < 65536 or len(token) != TOKEN_CHARS or min_bytes < 1:
                log.warning("unreadable bulk-lane offer %r; bundles travel on the gRPC stream", value)
                return None
            return cls(port, token, min_bytes)
        return None


class Lane:
    """One end of a session's lane: payloads out (:meth:`send`, written in order by a writer thread that lives
    while there is something to write) and in (:meth:`recv_into`, called by the session's reader right after
    the header frame). ``on_broken(why)`` ends the session (called once, when the lane fails; not on
    :meth:`close`). ``sent_bytes`` / ``received_bytes``: the bytes through this end (the chunk frames')."""

    def __init__(self, sock: socket.socket, min_bytes: int, name: str,
                 on_broken: Callable[[str], None] | None = None) -> None:
        self.sock = sock
        self.min_bytes = min_bytes
        self.name = name
        self.on_broken = on_broken
        try:
            host, port = sock.getpeername()[:2]
            self.remote: Address | None = (normalise_ip(host), int(port))
        except OSError:
            self.remote = None
        self.sent_bytes = 0
        self.received_bytes = 0
        self._up = True
        self.broken = ""  # why the lane failed ("" while it did not)
        self._lock = threading.Lock()
        self._queue: collections.deque[Iterable[Sequence[bytes | memoryview]]] = collections.deque()
        self._writing = False
        self.on_closed: Callable[[], None] | None = None  # told once when the lane closes (its listener's count)
        self._shut_once = False

    @property
    def up(self) -> bool:
        return self._up

    def carries(self, total_bytes: int) -> bool:
        """Whether a bundle of ``total_bytes`` goes on this lane (the rule both ends apply)."""
        return self._up and total_bytes >= self.min_bytes

    # -- out ------------------------------------------------------------------------------------------------
    def send(self, chunks: Iterable[Sequence[bytes | memoryview]]) -> None:
        """Queue one payload: its chunk frames as buffers (``BundleMessage.lane_buffers``, taken lazily by the
        writer); written after those queued before it."""
        with self._lock:
            self._queue.append(chunks)
            if self._writing:
                return
            self._writing = True
        threading.Thread(target=self._write, daemon=True, name=f"lane-{self.name}").start()

    def _write(self) -> None:
        while True:
            with self._lock:
                if not self._queue or not self._up:
                    self._queue.clear()
                    self._writing = False
                    return
                chunks = self._queue.popleft()
            try:
                self._write_all(chunks)
            except Exception as e:  # never a writer that dies and leaves its queue waiting
                self.fail(f"writing a payload failed: {type(e).__name__}: {e}")

    def _write_all(self, chunks: Iterable[Sequence[bytes | memoryview]]) -> None:
        """Write the buffers in order, several chunk frames per system call (``sendmsg``: no joined copy); a TLS
        socket has no ``sendmsg`` and writes each buffer."""
        if isinstance(self.sock, ssl.SSLSocket):
            for bufs in chunks:
                for b in bufs:
                    self.sock.sendall(b)
                    self.sent_bytes += len(b) if isinstance(b, bytes) else b.nbytes
            return
        batch: list[memoryview] = []
        size = 0
        for bufs in chunks:
            for b in bufs:
                v = memoryview(b)
                batch.append(v)
                size += v.nbytes
            if size >= _BATCH_BYTES or len(batch) >= _BATCH_BUFFERS:
                self._sendmsg(batch)
                batch, size = [], 0
        if batch:
            self._sendmsg(batch)

    def _sendmsg(self, bufs: list[memoryview]) -> None:
        while bufs:
            n = self.sock.sendmsg(bufs)
            self.sent_bytes += n
            while n:
                if n >= bufs[0].nbytes:
                    n -= bufs[0].nbytes
                    bufs.pop(0)
                else:
                    bufs[0] = bufs[0][n:]
                    n = 0
            while bufs and bufs[0].nbytes == 0:
                bufs.pop(0)

    # -- in -------------------------------------------------------------------------------------------------
    def recv_into(self, view: memoryview) -> int:
        """Receive into all of ``view`` (the caller asks only for bytes that are on their way: the rest of a chunk
        frame, at most a decoder's piece), or less where the lane ends: one system call on a plain socket
        (``MSG_WAITALL``), a tight loop over TLS records (16 KiB each) on a TLS one, so that the decoder's loop
        (a checksum update per call) runs once per piece, not once per record."""
        if isinstance(self.sock, ssl.SSLSocket):
            got, want = 0, len(view)
            while got < want:
                n = self.sock.recv_into(view[got:], want - got)
                if n == 0:
                    break
                got += n
        else:
            got = self.sock.recv_into(view, len(view), socket.MSG_WAITALL)
        self.received_bytes += got
        return got

    def drain(self, nbytes: int) -> None:
        """Read and drop the payload of a bundle that was refused at its header (the lane stays in step); a lane
        that ends meanwhile fails without ending its session: the session's reader does that (:attr:`broken`)."""
        scratch = memoryview(bytearray(min(nbytes, _DRAIN_PIECE) or 1))
        left = nbytes
        try:
            while left > 0:
                n = self.recv_into(scratch[:min(left, len(scratch))])
                if n == 0:
                    raise OSError("the lane ended")
                left -= n
        except (OSError, ValueError) as e:
            self.fail(f"dropping a refused payload failed: {e}", notify=False)

    # -- the end --------------------------------------------------------------------------------------------
    def fail(self, why: str, *, notify: bool = True) -> None:
        """The lane is out of step or gone: close it (once) and, with ``notify``, end its session
        (``on_broken``). The session's reader passes ``notify=False`` and ends the session itself once the
        message being read is handled (:attr:`broken` says why), so that its call fails with the lane's reason."""
        with self._lock:
            if not self._up:
                return
            self._up = False
            self.broken = why
        log.warning("%s: bulk lane broken: %s; ending the session", self.name, why)
        self._shut()
        if notify and self.on_broken is not None:
            self.on_broken(why)

    def close(self) -> None:
        with self._lock:
            self._up = False
        self._shut()

    def _shut(self) -> None:
        with self._lock:
            first, self._shut_once = not self._shut_once, True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        if first and self.on_closed is not None:
            self.on_closed()


def server_context(security: Security) -> ssl.SSLContext | None:
    """The TLS context of a parent's lane listener (None in plaintext): its own certificate; with mutual TLS it
    requires a client certificate of the CA."""
    if security.plaintext:
        return None
    assert security.tls_dir is not None
    files = node_files(security.tls_dir, security.node_id)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(files.cert), str(files.key))
    if security.mode == "tls":  # mutual TLS: the child's certificate, checked against the session's identity
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=security.ca_pem.decode())
    return ctx


def client_context(security: Security) -> ssl.SSLContext:
    """The TLS context of a child's lane: the CA, and the node's own certificate where it has one."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the parent's certificate and the dialed name
    ctx.load_verify_locations(cadata=security.ca_pem.decode())
    if security.cert_pem:
        assert security.tls_dir is not None
        files = node_files(security.tls_dir, security.node_id)
        ctx.load_cert_chain(str(files.cert), str(files.key))
    return ctx


@dataclass(frozen=True)
class _Pending:
    attach: Callable[[Lane], None]
    identity: str | None  # the node the session's certificate proves (mutual TLS); None: the token alone binds
    name: str
    peer_ip: str | None  # where the session's stream comes from: its lane must come from there too


def same_host(a: str | None, b: str) -> bool:
    """Whether a lane from ``b`` comes from where its session's stream came from (``a``); loopback is one host."""
    if a is None:
        return False
    x, y = normalise_ip(a), normalise_ip(b)
    if x == y:
        return True
    try:
        return ipaddress.ip_address(x).is_loopback and ipaddress.ip_address(y).is_loopback
    except ValueError:
        return False


class LaneServer:
    """A parent's lane listener: one-time tokens for its sessions (:meth:`offer`), and an accept thread that
    checks each connection (token, and with mutual TLS the certificate's node) before it hands the lane to
    its session. Refusals are logged; lanes opened and refused are marked (``lane-up-<node>``,
    ``lane-refused-<node>``: common/testhooks.py)."""

    def __init__(self, node: str, security: Security, min_bytes: int | None = None, host: str | None = None) -> None:
        self.node = node
        self.security = security
        self.min_bytes = lane_min_bytes() if min_bytes is None else min_bytes
        self._tls = server_context(security)
        host = lane_host() if host is None else host
        if not host and socket.has_dualstack_ipv6():
            self._sock = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self._sock = socket.create_server((host, 0))
        self.port = self._sock.getsockname()[1]
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self.max_lanes = max_lanes()  # lanes open or offered at once: a file descriptor each, beside gRPC's
        self._live = 0
        threading.Thread(target=self._accept, daemon=True, name=f"{node}-lanes").start()

    def offer(self, attach: Callable[[Lane], None], identity: str | None, name: str,
              peer: str = "") -> LaneOffer | None:
        """A token for one session (``peer``: its stream's remote address as gRPC gives it, ``ipv4:IP:PORT``);
        ``attach(lane)`` runs once its child connects with it, from the same host. None when :attr:`max_lanes`
        lanes are open or offered already (the session keeps its bundles on the stream)."""
        token = secrets.token_hex(TOKEN_CHARS // 2)
        where = parse_grpc_peer(peer) if peer else None
        with self._lock:
            if self._live + len(self._pending) >= self.max_lanes:
                return None
            self._pending[token] = _Pending(attach, identity, name, where[0] if where is not None else None)
        return LaneOffer(self.port, token, self.min_bytes)

    def _closed_one(self) -> None:
        with self._lock:
            self._live -= 1

    def withdraw(self, token: str) -> None:
        with self._lock:
            self._pending.pop(token, None)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._pending.clear()
        with contextlib.suppress(OSError):
            self._sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, addr = self._sock.accept()
            except OSError as e:
                if self._closed or e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return
                log.warning("%s: cannot accept a bulk-lane connection: %s", self.node, e)
                time.sleep(0.1)  # out of file descriptors for now: the child's handshake times out and falls back
                continue
            if not self._handshakes.acquire(blocking=False):  # a flood of connections gets no thread each
                self._refuse(conn, addr, f"more than {MAX_HANDSHAKES} lane handshakes at once")
                continue
            threading.Thread(target=self._handshake_once, args=(conn, addr), daemon=True,
                             name=f"{self.node}-lane-handshake").start()

    def _handshake_once(self, conn: socket.socket, addr: object) -> None:
        try:
            self._handshake(conn, addr)
        finally:
            self._handshakes.release()

    def _refuse(self, conn: socket.socket, addr: object, why: str) -> None:
        log.warning("%s: refused a bulk-lane connection from %s: %s", self.node, addr, why)
        mark(f"lane-refused-{self.node}")
        with contextlib.suppress(OSError):
            conn.close()

    def _handshake(self, conn: socket.socket, addr: object) -> None:
        try:
            conn.settimeout(HANDSHAKE_S)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            got = _recv_exactly(conn, len(MAGIC) + TOKEN_CHARS)
        except (OSError, ValueError) as e:
            self._refuse(conn, addr, f"no lane handshake ({e})")
            return
        if got[:len(MAGIC)] != MAGIC:
            self._refuse(conn, addr, "not a fedhop lane (bad greeting)")
            return
        token = got[len(MAGIC):].decode("ascii", "replace")
        with self._lock:
            pending = self._pending.pop(token, None)
        if pending is None:
            self._refuse(conn, addr, "unknown or used token")
            return
        if not same_host(pending.peer_ip, str(addr[0]) if isinstance(addr, tuple) else ""):
            # e.g. a delay proxy in front of the gRPC port (deploy/delay_proxy.py): a lane around it would skip
            # the emulated link, so the session keeps its bundles on the stream
            log.info("%s: the bulk lane of %s comes from %s, its session from %s (a proxy between them?): refused; "
                     "its bundles travel on the gRPC stream", self.node, pending.name, addr, pending.peer_ip)
            with contextlib.suppress(OSError):
                conn.close()
            return
        if self.security.mode == "tls":
            der = conn.getpeercert(binary_form=True) if isinstance(conn, ssl.SSLSocket) else None
            who = node_id_of(x509.load_der_x509_certificate(der)) if der else None
            if who is None or who != pending.identity:
                self._refuse(conn, addr, f"the certificate names {who!r}, the session is {pending.identity!r}")
                return
        lane = Lane(conn, self.min_bytes, f"{self.node}<->{pending.name}")
        with self._lock:
            self._live += 1
        lane.on_closed = self._closed_one
        pending.attach(lane)  # before the child hears OK: everything it sends after that may use the lane
        try:
            conn.sendall(OK)
            conn.settimeout(None)
        except OSError as e:
            lane.fail(f"the lane handshake failed: {e}")
            return
        log.debug("%s: bulk lane up with %s from %s", self.node, lane.name, addr)
        mark(f"lane-up-{self.node}")


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            raise OSError(f"the peer closed after {len(buf)} of {n} bytes")
        buf += got
    return bytes(buf)


_UNREACHABLE: set[tuple[str, int]] = set()  # lane listeners this process could not connect to (not dialed again)


def dial_lane(parent_addr: str, offer: LaneOffer | None, security: Security, node: str,
              on_broken: Callable[[str], None] | None = None) -> Lane | None:
    """A child's end of its session's lane (call it after the Welcome, before sending anything else on the
    session); None (logged) where there is no offer, the lane is switched off here, or it cannot be opened:
    bundles then travel as chunk frames. ``parent_addr``: the ``host:port`` the session dialed. A listener that
    could not be reached once (refused, or dropped by a firewall: a 5 s wait) is not dialed again by this
    process (a client host's thousand sessions would each wait)."""
    if offer is None or not lane_enabled():
        return None
    host = parent_addr.rpartition(":")[0].strip("[]") or "127.0.0.1"
    if (host, offer.port) in _UNREACHABLE:  # a firewall dropped it once: the sessions after that do not wait
        return None
    sock: socket.socket | None = None
    try:
        try:
            sock = socket.create_connection((host, offer.port), timeout=HANDSHAKE_S)
        except OSError:
            _UNREACHABLE.add((host, offer.port))
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not security.plaintext:
            sock = client_context(security).wrap_socket(sock, server_hostname=host)
        sock.sendall(MAGIC + offer.token.encode("ascii"))
        if _recv_exactly(sock, 1) != OK:
            raise OSError("the parent did not accept the lane")
        sock.settimeout(None)
    except (OSError, ValueError) as e:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        log.info("%s: no bulk lane to %s:%d (%s); bundles travel on the gRPC stream", node, host, offer.port, e)
        return None
    return Lane(sock, offer.min_bytes, f"{node}->{parent_addr}", on_broken)
