"""Link delay and jitter inside TCP's loop: each packet held in the kernel's NFQUEUE, released after its delay.

This kernel has neither ``netem`` nor ``fq`` (so no eBPF earliest-departure-time delay either: nothing honours
``skb->tstamp``). What it has is ``nfnetlink_queue``: an iptables ``NFQUEUE`` rule parks a packet in a kernel queue
until a program says what to do with it. This module is that program. In the **receiver's** namespace (where the
loss rule of deploy/loss.py also sits), every delayed inbound direction peer -> node gets a rule::

    iptables -t mangle -A PREROUTING -s PEER/32 -j NFQUEUE --queue-num K --queue-bypass

and a loop bound to queue ``K`` reads each packet's id only (``COPY_META``: the packet itself stays in the kernel)
and accepts it ``delay + u`` ms after it arrived, ``u`` uniform in ``[-jitter, +jitter]`` from a generator seeded by
``--seed`` and the peer; a packet never overtakes the one before it (like netem with a FIFO child), so one
``NFQNL_MSG_VERDICT_BATCH`` releases every packet that is due. The packets themselves are delayed, so both TCP ends
see the round trip grow by the two directions' delays: slow start, the congestion window, loss recovery and
the bandwidth-delay product feel the delay, unlike behind the userspace proxy (deploy/delay_proxy.py), which
terminates TCP and stays the fallback where this is unavailable (no ``iptables``, no NFQUEUE target, no
CAP_NET_ADMIN).

The clock is userspace's (a packet's time is when the loop read it, its release a ``select`` timeout), so the
loop asks for real-time scheduling (``SCHED_FIFO``, else the highest nice level; netem would run in the kernel's
softirq, ahead of every process): on a host loaded far beyond its cores a loop at normal priority waits for the CPU
and every packet with it. See docs/network.md for the measured fidelity.

With ``--control FILE`` the holds change while the run goes on (a trace, a peer whose address became known):
``{"ADDRESS": "MS[~JITTER]", ...}``, re-read when the
file changes (polled every 50 ms); a new address gets its queue and rule then, a removed one a hold of 0.

``python -m fedhop.deploy.kernel_delay --probe`` says whether this namespace can do it (exit 0) or why not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fedhop.deploy.delay_proxy import Hold, next_due

log = logging.getLogger("fedhop.kernel_delay")

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 1, 2, 3
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NLA_TYPE_MASK = 0x3FFF
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5

QUEUE_MAXLEN = 1 << 17  # packets held per direction at most (~190 MB of 1500-byte packets)
RCVBUF = 8 << 20
CONTROL_POLL_S = 0.05
FIRST_QUEUE = 4200  # queue numbers used: FIRST_QUEUE, FIRST_QUEUE + 1, ... (per namespace)
CHAIN = ("-t", "mangle", "PREROUTING")


class Unavailable(RuntimeError):
    """The kernel mechanism cannot run here; the message says why (the caller falls back to the proxy)."""


# -- the netlink messages ----------------------------------------------------------------------------------------
def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute (host-order header, payload padded to 4 bytes)."""
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n % 4)


def message(msg: int, queue: int, attrs: bytes, seq: int = 0, flags: int = NLM_F_REQUEST) -> bytes:
    """An nfnetlink_queue message ``msg`` for queue ``queue``: nlmsghdr, nfgenmsg (AF_UNSPEC, v0, queue), attrs."""
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def bind_messages(queue: int, seq: int) -> list[bytes]:
    """Bind ``queue`` (IPv4), copy only the packets' metadata, and let it hold :data:`QUEUE_MAXLEN` packets."""
    return [
        message(NFQNL_MSG_CONFIG, queue, attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET)),
                seq, NLM_F_REQUEST | NLM_F_ACK),
        message(NFQNL_MSG_CONFIG, queue, attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
                + attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)), seq + 1, NLM_F_REQUEST | NLM_F_ACK),
    ]


def verdict_batch(queue: int, last_id: int) -> bytes:
    """Accept every packet of ``queue`` whose id is at most ``last_id``."""
    return message(NFQNL_MSG_VERDICT_BATCH, queue, attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, last_id)))


def parse(buf: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(queue, packet id) of each queued packet in one datagram, and (seq, errno) of each acknowledgement."""
    packets, acks = [], []
    off = 0
    while off + 16 <= len(buf):
        length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", buf, off)
        if length < 16:
            break
        if kind == NLMSG_ERROR:
            acks.append((seq, -struct.unpack_from("=i", buf, off + 16)[0]))
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            queue = struct.unpack_from("!H", buf, off + 18)[0]
            a, end = off + 20, off + length
            while a + 4 <= end:
                alen, atype = struct.unpack_from("=HH", buf, a)
                if alen < 4:
                    break
                if atype & NLA_TYPE_MASK == NFQA_PACKET_HDR:
                    packets.append((queue, struct.unpack_from("!I", buf, a + 4)[0]))
                    break
                a += (alen + 3) & ~3
        off += (length + 3) & ~3
    return packets, acks


# -- iptables ----------------------------------------------------------------------------------------------------
def rule(addr: str, queue: int) -> list[str]:
    """The rule's arguments after ``-A`` / ``-D``: packets from ``addr`` into queue ``queue``."""
    return [CHAIN[2], "-s", f"{addr}/32", "-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]


def iptables(*args: str) -> None:
    """Run ``iptables -w -t mangle ARGS``; raises Unavailable with its message."""
    exe = shutil.which("iptables")
    if exe is None:
        raise Unavailable("no iptables (Debian: apt-get install -y iptables)")
    p = subprocess.run([exe, "-w", *CHAIN[:2], *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise Unavailable(f"`iptables {' '.join(args)}` failed: {(p.stderr or p.stdout).strip()}")


# -- the queue ---------------------------------------------------------------------------------------------------
@dataclass
class Direction:
    """One delayed inbound direction: its queue, hold, random draws and the packets it holds (due, id)."""

    addr: str
    queue: int
    hold: Hold
    rng: random.Random
    held: deque = field(default_factory=deque)
    last_due: float = float("-inf")
    packets: int = 0


class KernelDelay:
    """The delayed inbound directions of one namespace (the one this process runs in), and the loop that holds
    their packets. :meth:`set_holds` binds a queue and adds a rule for each new address; :meth:`run` holds and
    releases until :meth:`stop` (or a signal); :meth:`close` removes the rules."""

    def __init__(self, seed: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.seed = seed
        self.clock = clock
        self.dirs: dict[str, Direction] = {}
        self.by_queue: dict[int, Direction] = {}
        self.seq = 1
        self._stop = False
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        except OSError as e:
            raise Unavailable(f"no netfilter netlink socket: {e}") from None
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root), else the default
        with contextlib.suppress(OSError):
            self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))

    def _request(self, msgs: list[bytes]) -> None:
        """Send requests that ask for an acknowledgement; Unavailable with the kernel's errno if one fails."""
        want = set()
        for m in msgs:
            want.add(struct.unpack_from("=I", m, 8)[0])
            self.sock.send(m)
        end = time.monotonic() + 2.0
        while want:
            if not select.select([self.sock], [], [], max(0.0, end - time.monotonic()))[0]:
                raise Unavailable("nfnetlink_queue did not answer (no NFQUEUE support in this kernel?)")
            packets, acks = parse(self.sock.recv(1 << 16))
            self._hold(packets)  # packets of the queues bound earlier: held as usual
            for seq, err in acks:
                if seq in want and err:
                    raise Unavailable(f"nfnetlink_queue refused ({os.strerror(err)}; CAP_NET_ADMIN needed)")
                want.discard(seq)

    def set_holds(self, holds: dict[str, Hold]) -> None:
        """Make ``holds`` (peer address -> hold) the table; a new address gets its queue and rule, an address no
        longer listed holds nothing (its rule stays: a later step may delay it again)."""
        for addr, d in self.dirs.items():
            if addr not in holds:
                d.hold = Hold()
        for addr, hold in holds.items():
            if addr in self.dirs:
                self.dirs[addr].hold = hold
                continue
            queue = FIRST_QUEUE + len(self.dirs)
            self._request(bind_messages(queue, self.seq))
            self.seq += 2
            iptables("-A", *rule(addr, queue))
            d = Direction(addr, queue, hold, random.Random(f"{self.seed}:{addr}:kernel"))
            self.dirs[addr] = d
            self.by_queue[queue] = d
        log.info("kernel delay (NFQUEUE): %s", {a: str(d.hold) for a, d in self.dirs.items()})

    def close(self) -> None:
        """Remove the rules (packets then pass undelayed) and the socket."""
        for d in self.dirs.values():
            with contextlib.suppress(Unavailable):
                iptables("-D", *rule(d.addr, d.queue))
        self.dirs.clear()
        self.sock.close()

    def stop(self, *_: object) -> None:
        self._stop = True

    def _receive(self) -> None:
        while True:
            try:
                buf = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            self._hold(parse(buf)[0])

    def _hold(self, packets: list[tuple[int, int]]) -> None:
        """Schedule each (queue, packet id) that just arrived; one of no queue of ours is released at once."""
        now = self.clock()
        for queue, pid in packets:
            d = self.by_queue.get(queue)
            if d is None:
                self.sock.send(verdict_batch(queue, pid))
                continue
            d.last_due = next_due(d.last_due, now, d.hold, d.rng)
            d.held.append((d.last_due, pid))
            d.packets += 1

    def _release(self) -> float:
        """Accept every packet that is due; the time the next one is (inf: none held)."""
        now, nxt = self.clock(), float("inf")
        for d in self.dirs.values():
            last = None
            while d.held and d.held[0][0] <= now:
                last = d.held.popleft()[1]
            if last is not None:
                self.sock.send(verdict_batch(d.queue, last))
            if d.held:
                nxt = min(nxt, d.held[0][0])
        return nxt

    def run(self, control: Path | None = None) -> None:
        """Hold and release until :meth:`stop`; with ``control``, follow that file's table (module docstring)."""
        seen: int | None = None
        next_poll = 0.0
        while not self._stop:
            now = self.clock()
            if control is not None and now >= next_poll:
                next_poll = now + CONTROL_POLL_S
                seen = self._follow(control, seen)
            nxt = self._release()
            wait = min(nxt, next_poll if control is not None else now + 0.5) - self.clock()
            with contextlib.suppress(InterruptedError):
                if select.select([self.sock], [], [], max(0.0, wait))[0]:
                    self._receive()

    def _follow(self, control: Path, seen: int | None) -> int | None:
        try:
            mtime = control.stat().st_mtime_ns
        except FileNotFoundError:
            return seen
        if mtime != seen:
            try:
                self.set_holds(read_control(control))
            except (ValueError, OSError, Unavailable) as e:
                log.error("control file ignored: %s", e)
        return mtime


def read_control(path: Path) -> dict[str, Hold]:
    """The table of a ``--control`` file (``{"ADDRESS": "MS[~JITTER]"}``); ValueError if malformed."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object ADDRESS -> delay")
    try:
        return {a: parse_hold(str(v)) for a, v in raw.items()}
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"{path}: {e}") from None


def write_control(path: Path, holds: dict[str, Hold]) -> None:
    """Write ``holds`` as a ``--control`` file, replaced atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({a: str(h) for a, h in sorted(holds.items())}))
    os.replace(tmp, path)


def parse_hold(text: str) -> Hold:
    """``MS[~JITTER]`` as a :class:`Hold`; ArgumentTypeError if malformed or jitter > delay."""
    ms, _, jitter = text.partition("~")
    try:
        hold = Hold(float(ms), float(jitter or 0))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MS[~JITTER], got {text!r}") from None
    if hold.delay_ms < 0 or hold.jitter_ms < 0 or hold.jitter_ms > hold.delay_ms:
        raise argparse.ArgumentTypeError(f"expected 0 <= JITTER <= MS, got {text!r}")
    return hold


def _peer_hold(text: str) -> tuple[str, Hold]:
    addr, sep, rest = text.partition("=")
    if not sep or not addr:
        raise argparse.ArgumentTypeError(f"expected ADDRESS=MS[~JITTER], got {text!r}")
    return addr, parse_hold(rest)


def prioritise() -> str:
    """Run this process ahead of ordinary ones (SCHED_FIFO priority 10, else nice -20); what it got."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return "SCHED_FIFO 10"
    with contextlib.suppress(OSError):
        os.nice(-20)
        return "nice -20"
    return "normal priority"


def probe() -> str | None:
    """None if this namespace can hold packets in the kernel (a queue binds, an NFQUEUE rule is accepted), else
    why not. Leaves nothing behind."""
    try:
        kd = KernelDelay()
        try:
            kd._request(bind_messages(FIRST_QUEUE - 1, 1))
            probe_rule = rule("192.0.2.1", FIRST_QUEUE - 1)  # TEST-NET-1: never a testbed address
            iptables("-A", *probe_rule)
            iptables("-D", *probe_rule)
        finally:
            kd.sock.close()
    except Unavailable as e:
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedhop.deploy.kernel_delay", description=__doc__.split("\n")[0])
    p.add_argument("--hold", type=_peer_hold, action="append", default=[],
                   help="PEER_ADDRESS=MS[~JITTER] (repeatable): hold what PEER sends to this namespace")
    p.add_argument("--seed", type=int, default=0, help="seed of the jitter's random draws")
    p.add_argument("--control", type=Path, metavar="FILE", help="JSON ADDRESS -> MS[~JITTER], followed while running")
    p.add_argument("--ready", type=Path, metavar="FILE", help="written once every rule is in place")
    p.add_argument("--probe", action="store_true", help="only say whether this namespace can do it (exit 0) or not")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    if a.probe:
        why = probe()
        print(why or "ok")
        return 0 if why is None else 1
    try:
        kd = KernelDelay(a.seed)
        holds = dict(a.hold)
        if a.control is not None and a.control.exists():
            holds.update(read_control(a.control))
        kd.set_holds(holds)
    except (Unavailable, ValueError) as e:
        log.error("kernel delay unavailable: %s", e)
        return 1
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, kd.stop)
    log.info("scheduling: %s", prioritise())
    if a.ready is not None:
        a.ready.write_text(str(os.getpid()))
    try:
        kd.run(a.control)
    finally:
        log.info("packets held: %s", {d.addr: d.packets for d in kd.dirs.values()})
        kd.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
