"""Predicting a run's time from its ``[network]`` profile: the transfer model and the in-process virtual clock.

**Transfer model** (:func:`transfer_s`). A message of ``B`` message bytes (what the byte meter counts: the
serialized frames) on a directed link with rate ``R`` Mbit/s, one-way delay ``d``, jitter ``j`` and loss ``p``
takes

    T = d + E[lag] + S(W, R_eff, RTT),      W = B * (MSS + H) / MSS / (1 - p),   RTT = 2 d

- ``W``: the bytes on the wire: each MSS (1448 bytes) of TCP payload carries a ``H`` = 52-byte TCP/IP header
  (20 IP + 20 TCP + 12 timestamps; ``tc`` htb shapes whole packets), and each lost packet is sent again, so a
  fraction ``p`` of packets lost costs ``1 / (1 - p)`` times the volume.
- ``S``, the sending time (:func:`send_s`): on a warm connection (the default: the runs' gRPC channels are
  long-lived, and a window that idled a few hundred ms is halved once or twice, not reset; measured, the rounds
  of tests/testbed/test_predict.py) ``W * 8 / R_eff``. Cold (``cold=True``: a new connection, or one idle for
  many retransmission timeouts) TCP starts with 10 segments and doubles its window each round trip until it
  covers the path (``R_eff * RTT``): a flight smaller than that waits for its acknowledgements (an ``RTT``),
  the rest goes at ``R_eff``. Without a rate the bytes are free when warm, cost the round trips when cold.
- ``R_eff``: the rate ``R`` for a congestion control that does not read random loss as congestion (Linux's
  default BBR: it paces at the bottleneck rate it measures, the lost packets only resent); for a loss-based one
  (Reno, CUBIC) ``min(R, R_tcp)`` with the bound of Mathis, Semke, Mahdavi and Ott (1997),
  ``R_tcp = MSS * 8 / RTT * sqrt(3 / (2 p))`` bits/s (``RTT`` at least 1 ms). :class:`LinkModel` uses this
  host's congestion control (:func:`congestion_control`); :func:`transfer_s` alone assumes a loss-based one.
  Measured in the namespace testbed (docs/network.md): 4 MB at 10 Mbit/s, 50 ms, 1% loss takes ~4 s with BBR
  (Mathis would say ~24 s) and ~25 s with Reno (Mathis: 23.6 s).
- ``E[lag]`` (:func:`jitter_lag_s`): each packet is held ``d + u``, ``u`` uniform in ``[-j, +j]``, and never
  overtakes the one before it, so a message's last packet is held the longest of its predecessors' holds less
  their head start: 0 for a one-packet message, up to ``j`` for a long one. With BBR and ``j > d / 3``, its
  window caps the rate at ``R * 2 (d - j) / (d + j)`` (:func:`bbr_jitter_share`).

**Virtual clock** (:class:`VirtualClock`). The in-process engine runs every node's handler one after the other in
canonical order; the clock only observes (it never changes what runs, so the math stays bit-identical) and keeps a
virtual time per node through a round, as if the nodes ran in parallel on the profile's network:

- a handler's own compute (its measured wall time, less what it spent in calls to other nodes) advances its
  node's clock by ``seconds / compute`` (``[network.nodes.<id>] compute``);
- a task call parent -> child starts at the parent's clock; the child starts at ``start + T(request)``, runs
  (nested calls included), and the reply is in at ``child's end + T(reply)``;
- the calls of one ``scatter`` all start when the scatter starts (they go out in parallel): the parent's clock
  after the scatter is the latest reply (max over children); any other call (a submitted task) is awaited at
  once;
- a hand-off and a ``describe`` are sequential exchanges: the sender's clock advances by ``T(request) +
  T(reply)``.

Per round it writes raw timeline rows (common/timeline.py): ``p_round`` (the PS's clock at the round's end: the
predicted round time), ``p_compute`` per node and ``p_transfer`` per link (the same link keys as the measured
``transfer``), which become the ``predicted_s`` column of ``timeline.csv``. Torch-free.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from fedhop.common.network_spec import NetworkSpec, Shape, directed_shape
from fedhop.common.testbed_spec import link_class
from fedhop.common.timeline import Timeline

MSS = 1448  # TCP payload bytes per segment on a 1500-byte MTU with timestamps
HEADER = 52  # IPv4 (20) + TCP (20) + timestamps option (12) per segment
MIN_RTT_S = 0.001  # the round trip the loss bound assumes on an undelayed link
MATHIS_C = math.sqrt(1.5)  # Mathis et al.'s constant for periodic loss, delayed ACKs off
INITIAL_WINDOW = 10  # segments (Linux's initial congestion window, RFC 6928)
LOSS_BLIND = frozenset({"bbr"})  # congestion controls whose rate does not follow random loss
CC_FILE = Path("/proc/sys/net/ipv4/tcp_congestion_control")
JITTER_STEPS = 200  # the integration's steps in jitter_lag_s


def congestion_control() -> str:
    """This host's TCP congestion control (of this process's network namespace); ``cubic`` where unreadable."""
    try:
        return CC_FILE.read_text().strip() or "cubic"
    except OSError:
        return "cubic"


def role_of(node: str) -> str:
    """``ps`` -> server, ``edge-N`` -> edge, ``client-N`` -> client."""
    if node == "ps":
        return "server"
    role = node.partition("-")[0]
    if role not in ("edge", "client"):
        raise ValueError(f"not a node id: {node!r} (ps, edge-N or client-N)")
    return role


def shape_of(net: NetworkSpec, src: str, dst: str) -> Shape:
    """The resolved shape of the direction ``src`` -> ``dst``; a link of no class (client <-> client gossip, which
    no testbed shapes) is unshaped."""
    try:
        cls = link_class(role_of(src), role_of(dst))
    except (ValueError, KeyError):
        return Shape()
    return directed_shape(net, cls, src, dst)


def mathis_bps(loss: float, rtt_s: float, mss: int = MSS) -> float:
    """TCP's throughput bound under random loss ``loss`` (Mathis et al. 1997): ``MSS * 8 / RTT * C / sqrt(p)``
    bits/s, ``C = sqrt(3/2)``; infinite without loss."""
    if loss <= 0:
        return math.inf
    return mss * 8 / max(rtt_s, MIN_RTT_S) * MATHIS_C / math.sqrt(loss)


def wire_bytes(message_bytes: float, loss: float = 0.0) -> float:
    """The bytes a message of ``message_bytes`` puts on the wire: a header per MSS, lost packets sent again."""
    return message_bytes * (MSS + HEADER) / MSS / (1.0 - loss)


def send_s(wire: float, rate_bps: float, rtt_s: float, initial: float = INITIAL_WINDOW * (MSS + HEADER)) -> float:
    """From a message's first byte sent to its last: ``wire`` bytes from an ``initial`` window (bytes) doubled
    each round trip ``rtt_s`` until it covers the path (``rate_bps * rtt_s``), the rest at ``rate_bps``."""
    if wire <= 0:
        return 0.0
    path = rate_bps * rtt_s / 8
    sent, t, window = 0.0, 0.0, initial
    while window < path and sent + window < wire:
        sent, t, window = sent + window, t + rtt_s, 2 * window
    return t + ((wire - sent) * 8 / rate_bps if math.isfinite(rate_bps) else 0.0)


@lru_cache(maxsize=4096)
def _lag(jitter_s: float, spacing_s: float, packets: int) -> float:
    if jitter_s <= 0 or packets <= 1:
        return 0.0
    n = min(packets, int(2 * jitter_s / spacing_s) + 1 if spacing_s > 0 else packets)
    # E[max_k (u_k - k * spacing)], u_k uniform in [-j, j], k = 0 .. n-1: -j + integral of (1 - CDF) over [-j, j]
    step = 2 * jitter_s / JITTER_STEPS
    area = 0.0
    for i in range(JITTER_STEPS):
        x = -jitter_s + (i + 0.5) * step
        cdf = 1.0
        for k in range(n):
            cdf *= min(1.0, (x + k * spacing_s + jitter_s) / (2 * jitter_s))
        area += (1.0 - cdf) * step
    return area - jitter_s


def jitter_lag_s(shape: Shape, wire: float) -> float:
    """How much longer than ``d`` a message of ``wire`` bytes waits for its last packet, on average, with jitter:
    packets every ``(MSS + H) * 8 / R`` seconds (back to back without a rate), each held ``d + u``, none
    overtaking the one before it."""
    if not shape.jitter_ms:
        return 0.0
    spacing = (MSS + HEADER) * 8 / (shape.mbit * 1e6) if shape.mbit else 0.0
    return _lag(round(shape.jitter_ms / 1000.0, 6), round(spacing, 9), max(1, math.ceil(wire / (MSS + HEADER))))


def bbr_jitter_share(shape: Shape) -> float:
    """The share of the rate BBR reaches with jitter ``j`` on a delay ``d`` (1 without): its window is twice the
    rate times the minimum round trip it has seen, which on a long-lived connection approaches ``2 (d - j)``,
    while a stream's packets wait ``~d + j`` each way (none overtakes another): ``min(1, 2 (d - j) / (d + j))``,
    so a cap only where ``j > d / 3``."""
    d, j = shape.delay_ms, shape.jitter_ms
    return 1.0 if not j or d + j <= 0 else min(1.0, max(2 * (d - j), 0.01 * d) / (d + j))


def transfer_s(shape: Shape, message_bytes: float, cc: str = "cubic", cold: bool = False) -> float:
    """The predicted time of one message of ``message_bytes`` on a link of shape ``shape`` with the congestion
    control ``cc`` (the module's formula): delay + jitter's lag + the sending time at the effective rate, from a
    warm window or (``cold``) from TCP's initial one."""
    rtt = 2 * shape.delay_ms / 1000.0
    rate = shape.mbit * 1e6 if shape.mbit else math.inf
    if cc not in LOSS_BLIND:
        rate = min(rate, mathis_bps(shape.loss, rtt))
    else:
        rate *= bbr_jitter_share(shape)
    wire = wire_bytes(message_bytes, shape.loss)
    initial = INITIAL_WINDOW * (MSS + HEADER) if cold else math.inf
    return shape.delay_ms / 1000.0 + jitter_lag_s(shape, wire) + send_s(wire, rate, rtt, initial)


class LinkModel:
    """The transfer model of one run's profile, the shapes of its directed links cached; ``cc``: the congestion
    control (default: this host's)."""

    def __init__(self, net: NetworkSpec, cc: str | None = None) -> None:
        self.net = net
        self.cc = cc or congestion_control()
        self._shapes: dict[tuple[str, str], Shape] = {}

    def shape(self, src: str, dst: str) -> Shape:
        s = self._shapes.get((src, dst))
        if s is None:
            s = self._shapes[(src, dst)] = shape_of(self.net, src, dst)
        return s

    def seconds(self, src: str, dst: str, message_bytes: float) -> float:
        return transfer_s(self.shape(src, dst), message_bytes, self.cc)

    def speed(self, node: str) -> float:
        return self.net.compute(node)


# -- the in-process engine's virtual clock ---------------------------------------------------------------
@dataclass
class _Frame:
    """A node running a handler (or the PS's round step): its virtual time and where its own compute began."""

    node: str
    cursor: float  # virtual seconds since the round began
    mark: float  # perf_counter from which the node's own compute counts
    speed: float
    groups: list[list[float]] = field(default_factory=list)  # open scatters: [start, latest reply]


@dataclass
class _Call:
    parent: str
    child: str
    start: float  # the request leaves the parent (virtual)
    arrive: float | None = None  # the request is at the child
    end: float | None = None  # the child's result is ready
    done: float | None = None  # the reply is at the parent


class VirtualClock:
    """Observes the in-process engine (hooks in ``InProcessEngine.send`` and ``_LocalComm._one`` / ``scatter``)
    and keeps each node's virtual time through a round; writes ``p_*`` rows into ``timeline``."""

    def __init__(self, net: NetworkSpec, timeline: Timeline, server: str = "ps",
                 now: Callable[[], float] = time.perf_counter) -> None:
        self.links = LinkModel(net)
        self.timeline = timeline
        self.server = server
        self.now = now
        self.round = 0
        self.predicted: dict[int, float] = {}  # round -> predicted seconds (the PS's clock at its end)
        self._stack: list[_Frame] = []
        self._calls: list[_Call] = []
        self.begin_round(0)

    # -- rounds --------------------------------------------------------------------------------------------
    def begin_round(self, round_idx: int) -> None:
        self.round = round_idx
        self._stack = [_Frame(self.server, 0.0, self.now(), self.links.speed(self.server))]
        self._calls = []

    def end_round(self) -> float:
        """The round's predicted duration (the PS's clock now); recorded as ``p_round``."""
        root = self._stack[0]
        self._sync(root, self.now())
        self.predicted[self.round] = root.cursor
        self.timeline.add(self.round, self.server, "p_round", root.cursor)
        return root.cursor

    # -- frames --------------------------------------------------------------------------------------------
    def _sync(self, f: _Frame, now: float) -> None:
        """Advance ``f``'s clock by its own compute since its mark."""
        own = max(0.0, now - f.mark) / f.speed
        f.cursor += own
        f.mark = now
        self.timeline.add(self.round, f.node, "p_compute", own)

    def _top(self, node: str) -> _Frame:
        """The innermost frame of ``node`` (a node running no handler: a detached one at the current time)."""
        for f in reversed(self._stack):
            if f.node == node:
                return f
        return _Frame(node, self._stack[-1].cursor if self._stack else 0.0, self.now(), self.links.speed(node))

    # -- scatter: calls that go out together ------------------------------------------------------------------
    @contextmanager
    def scatter(self, node: str) -> Iterator[None]:
        f = self._top(node)
        self._sync(f, self.now())
        f.groups.append([f.cursor, f.cursor])
        try:
            yield
        finally:
            _, latest = f.groups.pop()
            self._sync(f, self.now())
            f.cursor = max(f.cursor, latest)

    # -- a task call -------------------------------------------------------------------------------------------
    @contextmanager
    def call(self, parent: str, child: str) -> Iterator[None]:
        f = self._top(parent)
        self._sync(f, self.now())
        start = f.groups[-1][0] if f.groups else f.cursor
        c = _Call(parent, child, start)
        self._calls.append(c)
        try:
            yield
        finally:
            self._calls.pop()
            done = c.done if c.done is not None else (c.end if c.end is not None else (c.arrive or start))
            if f.groups:
                f.groups[-1][1] = max(f.groups[-1][1], done)
            else:
                f.cursor = max(f.cursor, done)
            f.mark = self.now()  # the time spent in the call is not the parent's compute

    def handler_begin(self, child: str) -> None:
        c = self._calls[-1]
        at = c.arrive if c.arrive is not None else c.start
        self._stack.append(_Frame(child, at, self.now(), self.links.speed(child)))

    def handler_end(self, child: str) -> None:
        f = self._stack.pop()
        if f.node != child:
            raise RuntimeError(f"virtual clock: {child}'s handler ended inside {f.node}'s")
        self._sync(f, self.now())
        self._calls[-1].end = f.cursor

    # -- a message -------------------------------------------------------------------------------------------
    def message(self, src: str, dst: str, phase: str, message_bytes: int, began: float) -> None:
        """One message ``src`` -> ``dst`` of ``message_bytes``; ``began``: when the engine started sending it
        (perf_counter). A task's request or reply belongs to the open call; anything else (hand-off, describe)
        is a sequential exchange of the node that asked."""
        t = self.links.seconds(src, dst, message_bytes)
        c = self._calls[-1] if self._calls else None
        if c is not None and phase == "request" and (src, dst) == (c.parent, c.child) and c.arrive is None:
            c.arrive = c.start + t
            self.timeline.add(self.round, src, "p_transfer", t, peer=dst)
            return
        if c is not None and phase == "reply" and (src, dst) == (c.child, c.parent) and c.done is None \
                and c.end is not None:
            c.done = c.end + t
            self.timeline.add(self.round, dst, "p_transfer", t, peer=src)
            return
        asker, other = (src, dst) if phase == "request" else (dst, src)
        f = self._top(asker)
        self._sync(f, began)
        f.cursor += t
        f.mark = self.now()
        self.timeline.add(self.round, asker, "p_transfer", t, peer=other)


# -- a networked run: the same prediction from what the PS holds ------------------------------------------
SEQUENTIAL_KINDS = frozenset({"handoff", "describe"})  # exchanges the asking node waits out one after the other
SKIPPED_KINDS = frozenset({"hello", "welcome", "ready", "bye", "keepalive", "wire"})  # outside the rounds' calls
REPORT_KIND = "report"  # a child's Report goes just before its result on the same stream: bytes, no extra delay


def link_seconds(shape: Shape, messages: int, message_bytes: float, cc: str = "cubic") -> float:
    """The predicted time of ``messages`` messages of ``message_bytes`` in all on one direction of a link: each
    message of an equal share is a :func:`transfer_s`; no message (a report, riding with a result on the same
    stream): its bytes at the rate only."""
    if messages <= 0:
        rate = min(shape.mbit * 1e6 if shape.mbit else math.inf,
                   math.inf if cc in LOSS_BLIND else mathis_bps(shape.loss, 2 * shape.delay_ms / 1000.0))
        return wire_bytes(message_bytes, shape.loss) * 8 / rate if math.isfinite(rate) else 0.0
    return messages * transfer_s(shape, message_bytes / messages, cc)


def predict_rounds(derived: list[dict], meter_rows: list[dict], net: NetworkSpec,
                   children: dict[str, list[str]], server: str = "ps") -> list[dict]:
    """The prediction of a networked run (the PS, at the run's end), as raw ``p_*`` timeline rows, from each
    round's measured compute (``derived``: :func:`~fedhop.common.timeline.derive`'s rows, driver rounds) and its
    messages (``meter_rows``: the byte meter's rows, driver rounds) on the profile ``net``.

    The rows hold sums per round, not the order of the calls, so the clock is rebuilt bottom-up: a node's time
    in a round is its compute, plus the hand-offs and describes it asked for, plus, for its tasks' children,
    the slowest child's (task messages on the link + that child's time). Exact when the same child is the
    slowest in every scatter of the round (a lower bound otherwise). A node's measured compute already holds
    its emulated slow-down (``compute``) and its describes' time (the networked engine does not time those)."""
    links = LinkModel(net)
    compute: dict[tuple[int, str], float] = {}
    for r in derived:
        if r["phase"] == "compute":
            compute[(int(r["round"]), str(r["node"]))] = float(r["seconds"])
    # per round: task traffic per (parent, child) link, sequential traffic per (asker, other)
    task: dict[tuple[int, str, str], float] = {}
    seq: dict[tuple[int, str, str], float] = {}
    parent_of = {c: p for p, cs in children.items() for c in cs}
    rounds: set[int] = {k[0] for k in compute}
    for m in meter_rows:
        kind, src, dst, rnd = str(m["kind"]), str(m["src"]), str(m["dst"]), int(m["round"])
        if kind in SKIPPED_KINDS:
            continue
        messages = 0 if kind == REPORT_KIND else int(m.get("messages", 1))
        t = link_seconds(links.shape(src, dst), messages, float(m["message_bytes"]), links.cc)
        rounds.add(rnd)
        if kind in SEQUENTIAL_KINDS:
            asker, other = (src, dst) if m.get("phase") == "request" else (dst, src)
            seq[(rnd, asker, other)] = seq.get((rnd, asker, other), 0.0) + t
        else:
            parent, child = (src, dst) if parent_of.get(dst) == src else (dst, src)
            task[(rnd, parent, child)] = task.get((rnd, parent, child), 0.0) + t
    out: list[dict] = []

    def busy(rnd: int, node: str) -> float:
        own = compute.get((rnd, node), 0.0)
        waits = [task[(rnd, node, c)] + busy(rnd, c) for c in children.get(node, []) if (rnd, node, c) in task]
        return own + sum(v for (r, a, _), v in seq.items() if r == rnd and a == node) + max(waits, default=0.0)

    for rnd in sorted(rounds):
        out.append({"round": rnd, "node": server, "peer": "", "phase": "p_round", "seconds": busy(rnd, server)})
    for rnd, a, b in sorted({*task, *seq}):
        both = task.get((rnd, a, b), 0.0) + seq.get((rnd, a, b), 0.0)
        out.append({"round": rnd, "node": a, "peer": b, "phase": "p_transfer", "seconds": both})
    for (rnd, node), v in sorted(compute.items()):
        out.append({"round": rnd, "node": node, "peer": "", "phase": "p_compute", "seconds": v})
    return out
