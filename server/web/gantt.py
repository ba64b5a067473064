"""The live page's per-round timeline: a Gantt row per node and each link's achieved rate beside its configured one.

From what ``/api/timeline`` already holds (``timeline.csv``'s rows: per round compute / encode / wait per node and
transfer per link, with ``predicted_s`` when the run has a ``[network]`` table), the byte meter's rows and the
spec's ``[network]`` profile. The rows are sums per round, not start times, so a node's row lays its phases end
to end: the transfer on the link to its parent (requests and replies), then its compute, encode and wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GANTT_PHASES = ("transfer", "compute", "encode", "wait")


def _configured(network: Mapping[str, Any] | None, a: str, b: str) -> dict[str, float | None] | None:
    """The profile's rate of a -> b and b -> a (Mbit/s; None: unlimited); None without a profile."""
    if not network:
        return None
    from fedhop.common.network_spec import NetworkSpec
    from fedhop.common.virtual_clock import shape_of

    net = NetworkSpec.model_validate(network)
    try:
        return {"out": shape_of(net, a, b).mbit, "back": shape_of(net, b, a).mbit}
    except ValueError:
        return None


def round_chart(rows: Iterable[Mapping[str, Any]], link_rows: Iterable[Mapping[str, Any]],
                network: Mapping[str, Any] | None, round_idx: int | None = None) -> dict[str, Any] | None:
    """The chart of round ``round_idx`` (driver rounds, 0-based; None: the last one with rows): ``nodes`` (one
    Gantt row each: segments ``phase``, ``start``, ``seconds`` laid end to end), ``links`` (per link of the
    round: bytes both ways, measured and predicted transfer seconds, the achieved rate = bytes * 8 / transfer
    time, and the configured rates ``out`` (node -> peer) and ``back``), the round's measured and predicted
    seconds. None before any round has rows."""
    rows = [r for r in rows if int(r["round"]) >= 0]
    if not rows:
        return None
    t = max(int(r["round"]) for r in rows) if round_idx is None else round_idx
    mine = [r for r in rows if int(r["round"]) == t]
    sizes: dict[frozenset[str], int] = {}
    for m in link_rows:
        if int(m["round"]) == t and m.get("kind") != "wire":
            k = frozenset((str(m["src"]), str(m["dst"])))
            sizes[k] = sizes.get(k, 0) + int(m["message_bytes"])
    phases: dict[str, dict[str, float]] = {}
    links: list[dict[str, Any]] = []
    out: dict[str, Any] = {"round": t, "round_s": None, "predicted_round_s": None}
    for r in mine:
        node, peer, phase, sec = str(r["node"]), str(r.get("peer") or ""), str(r["phase"]), float(r["seconds"])
        if phase == "round":
            out["round_s"], out["predicted_round_s"] = sec, r.get("predicted_s")
        elif phase == "transfer":
            nbytes = sizes.get(frozenset((node, peer)), 0)
            links.append({"src": node, "dst": peer, "bytes": nbytes, "transfer_s": sec,
                          "predicted_s": r.get("predicted_s"),
                          "achieved_mbit": nbytes * 8 / sec / 1e6 if sec > 0 else None,
                          "configured_mbit": _configured(network, node, peer)})
            d = phases.setdefault(peer, {})  # the child's (or receiver's) row: its link's time
            d["transfer"] = d.get("transfer", 0.0) + sec
        elif phase in GANTT_PHASES:
            d = phases.setdefault(node, {})
            d[phase] = d.get(phase, 0.0) + sec
    nodes = []
    for node in sorted(phases, key=_order):
        start, segs = 0.0, []
        for ph in GANTT_PHASES:
            sec = phases[node].get(ph, 0.0)
            if sec > 0:
                segs.append({"phase": ph, "start": start, "seconds": sec})
                start += sec
        nodes.append({"node": node, "segments": segs})
    out["nodes"], out["links"] = nodes, links
    return out


def _order(node: str) -> tuple[int, int]:
    role, _, k = node.partition("-")
    return {"ps": 0, "edge": 1, "client": 2}.get(role, 3), int(k) if k.isdigit() else 0
