"""The run's ``[network]`` profile as the links of its topology, over time; shared by every testbed.

:func:`run_links` resolves the profile (common/network_spec.py) into one :class:`Link` per pair of nodes that talk,
each direction with its own :class:`~fedhop.common.network_spec.Shape`, at a time ``t`` into the run where the
profile has traces. :func:`timeline` gives the links at every time a trace changes something, :class:`Replay`
calls back at those times (a small scheduler thread), and the helpers below say what one node applies to its own
namespace: the rate of what it sends (:func:`egress`), the loss of what it receives (:func:`ingress_loss`), the
delay and jitter of what it receives (:func:`inbound_holds`, held in the kernel by deploy/kernel_delay.py) and,
where that is unavailable, for a listening node, the delay proxy's holds per connecting peer
(:func:`proxy_holds`). The namespace testbed (deploy/testbed.py) and a container shaping itself
(deploy/container_net.py) both build their tc / nft / NFQUEUE / proxy settings from these.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedhop.common.network_spec import NetworkSpec, Shape, Traces, change_times, directed_shape
from fedhop.common.testbed_spec import link_class
from fedhop.common.topology import Topology
from fedhop.deploy.delay_proxy import Hold, PeerDelay

log = logging.getLogger("fedhop.testbed")


@dataclass(frozen=True)
class Link:
    """A link of the run and the shape of each direction (``ab``: a -> b, ``ba``: b -> a)."""

    a: str
    b: str
    cls: str
    ab: Shape
    ba: Shape

    @property
    def mbit(self) -> float | None:
        """The rate of a -> b (of both directions where the profile is symmetric)."""
        return self.ab.mbit

    @property
    def delay_ms(self) -> float:
        """The one-way delay of a -> b (of both directions where the profile is symmetric)."""
        return self.ab.delay_ms

    def directions(self) -> list[tuple[str, str, Shape]]:
        return [(self.a, self.b, self.ab), (self.b, self.a, self.ba)]


def run_links(topo: Topology, net: NetworkSpec, traces: Traces | None = None, t: float = 0.0) -> list[Link]:
    """Every pair of nodes that talk: parent-child and neighbour edges, shaped by the profile ``net`` (at ``t``
    seconds into the run, with ``traces``). Raises ValueError where a direction resolves to jitter > delay."""
    pairs = [(topo.parent[n], n) for n in (*topo.edges, *topo.clients)]
    pairs += [(a, b) for a in topo.edges for b in topo.neighbours[a] if topo.sort([a, b])[0] == a]
    out = []
    for a, b in pairs:
        cls = link_class(topo.role(a), topo.role(b))
        out.append(Link(a, b, cls, directed_shape(net, cls, a, b, traces, t),
                        directed_shape(net, cls, b, a, traces, t)))
    return out


def timeline(topo: Topology, net: NetworkSpec, traces: Traces | None = None) -> list[tuple[float, list[Link]]]:
    """The links at 0 s and at every later time a trace sets a value (each time checked: ValueError names it)."""
    times = sorted({0.0, *change_times(traces or {})})
    return [(t, run_links(topo, net, traces, t)) for t in times]


def peers_of(links: list[Link]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for lk in links:
        out.setdefault(lk.a, []).append(lk.b)
        out.setdefault(lk.b, []).append(lk.a)
    return out


def _sides(node: str, links: list[Link]) -> list[tuple[str, Shape, Shape]]:
    """(peer, node -> peer, peer -> node) for every link of ``node``."""
    out = []
    for lk in links:
        if lk.a == node:
            out.append((lk.b, lk.ab, lk.ba))
        elif lk.b == node:
            out.append((lk.a, lk.ba, lk.ab))
    return out


def egress(node: str, links: list[Link]) -> dict[str, float | None]:
    """Peer -> the rate (Mbit/s; None: unlimited) of what ``node`` sends it, for every peer of ``node``."""
    return {peer: out.mbit for peer, out, _ in _sides(node, links)}


def ingress_loss(node: str, links: list[Link]) -> dict[str, float]:
    """Peer -> the loss of what ``node`` receives from it, for every peer of ``node``."""
    return {peer: into.loss for peer, _, into in _sides(node, links)}


def proxy_holds(node: str, links: list[Link]) -> dict[str, PeerDelay]:
    """Peer -> the holds of a delay proxy in front of ``node``'s server (inbound: peer -> node, outbound: node ->
    peer) for every delayed link of ``node``. A peer that dials ``node`` is delayed there; a peer ``node`` dials
    listens behind its own proxy, which holds the same link in its own table."""
    return {peer: PeerDelay(Hold(into.delay_ms, into.jitter_ms), Hold(out.delay_ms, out.jitter_ms))
            for peer, out, into in _sides(node, links) if into.delay_ms or out.delay_ms}


def inbound_holds(node: str, links: list[Link]) -> dict[str, Hold]:
    """Peer -> the hold of what ``node`` receives from it (deploy/kernel_delay.py: a direction's delay is applied
    where it enters its receiver, like its loss), for every peer of ``node``; a hold of 0 where undelayed."""
    return {peer: Hold(into.delay_ms, into.jitter_ms) for peer, _, into in _sides(node, links)}


def ever_held(node: str, steps: list[tuple[float, list[Link]]]) -> set[str]:
    """The peers whose packets into ``node`` are delayed at some time of the run (:func:`timeline`)."""
    return {p for _, links in steps for p, h in inbound_holds(node, links).items() if h.delay_ms or h.jitter_ms}


def hold_arg(pd: PeerDelay) -> str:
    """The delay proxy's ``--delay`` value of ``pd`` after ``ADDRESS=``: ``IN~JITTER,OUT~JITTER`` in ms."""
    return (f"{pd.inbound.delay_ms:g}~{pd.inbound.jitter_ms:g},"
            f"{pd.outbound.delay_ms:g}~{pd.outbound.jitter_ms:g}")


def ever(node: str, steps: list[tuple[float, list[Link]]]) -> tuple[set[str], set[str], bool]:
    """Over the whole run (:func:`timeline`): the peers ``node`` ever sends to at a limited rate, those it ever
    receives from with loss, and whether its server ever needs the delay proxy."""
    rated, lossy, delayed = set(), set(), False
    for _, links in steps:
        rated |= {p for p, m in egress(node, links).items() if m is not None}
        lossy |= {p for p, x in ingress_loss(node, links).items() if x > 0}
        delayed = delayed or bool(proxy_holds(node, links))
    return rated, lossy, delayed


def write_holds(path: Path, holds: dict[str, PeerDelay]) -> None:
    """The delay proxy's control file (``--control``): peer address -> ``IN~J,OUT~J``, replaced atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({a: hold_arg(pd) for a, pd in sorted(holds.items())}))
    os.replace(tmp, path)


class Replay:
    """A scheduler thread: ``apply(t)`` at each time of ``times`` (seconds after :meth:`start`), in order, until
    :meth:`stop`. A failing ``apply`` is logged and the replay goes on (the run is not stopped for it); ``applied``
    lists (time due, seconds late) of every step done."""

    def __init__(self, times: list[float], apply: Callable[[float], None], name: str = "trace-replay") -> None:
        self.times = sorted(t for t in times if t > 0)
        self.apply = apply
        self.applied: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        if self.times:
            self._thread.start()

    def _run(self) -> None:
        for t in self.times:
            if self._stop.wait(max(0.0, self.t0 + t - time.monotonic())):
                return
            try:
                self.apply(t)
            except Exception as e:  # noqa: BLE001  (reported, the run goes on)
                self.errors.append(f"{t:g}s: {type(e).__name__}: {e}")
                log.error("trace step at %gs failed: %s", t, e)
            self.applied.append((t, time.monotonic() - self.t0 - t))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
