"""What a run's end prints, and what ``fedhop compare`` reads: bytes per link and per link class, the route.

Works on meter rows (``results.json``'s ``links`` or :attr:`RunResult.links`): dicts with ``src``, ``dst``,
``messages``, ``payload_bytes`` and ``message_bytes`` (and ``wire_bytes`` on the networked engine's wire rows).
The per-link table is the testbeds' one (deploy/link_table.py: one row type, one formatter).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fedhop.deploy.link_table import SUMMARY_COLUMNS, LinkBytes, format_table, from_meter_rows

LINK_CLASSES = ("client-edge", "edge-edge", "edge-ps", "client-ps", "client-client")
CLASS_TITLES = {"client-client": "client<->client", "client-edge": "client<->edge", "edge-edge": "edge<->edge",
                "edge-ps": "edge<->PS",
                "client-ps": "client<->PS"}


def role_of(node: str) -> str:
    """``ps``, ``edge`` or ``client``, from the node id (``ps``, ``edge-N``, ``client-N``)."""
    if node == "ps":
        return "ps"
    head = node.split("-", 1)[0]
    if head not in ("edge", "client"):
        raise ValueError(f"cannot tell the role of node {node!r} (expected ps, edge-N or client-N)")
    return head


def link_class(src: str, dst: str) -> str:
    """The undirected class of a link: one of :data:`LINK_CLASSES`."""
    roles = sorted((role_of(src), role_of(dst)), key=("client", "edge", "ps").index)
    name = "-".join(roles)
    if name not in LINK_CLASSES:
        raise ValueError(f"link {src} -> {dst} is of no known class ({name})")
    return name


def bytes_by_class(links: Iterable[Mapping[str, Any]], level: str = "payload_bytes") -> dict[str, int]:
    """Bytes of every class (both directions), zero for classes the run did not use."""
    out = dict.fromkeys(LINK_CLASSES, 0)
    for r in links:
        out[link_class(r["src"], r["dst"])] += int(r[level])
    return out


def per_link(links: Iterable[Mapping[str, Any]]) -> list[LinkBytes]:
    """One row per directed link (src -> dst), summed over kinds, phases and rounds, its wire level from the
    run's wire rows (None without: the in-process engine); largest payload first (then message bytes, then
    names)."""
    return sorted(from_meter_rows(links), key=lambda x: (-x.payload, -x.message, x.src, x.dst))


def link_table(links: Iterable[Mapping[str, Any]], top: int = 20) -> str:
    """The run summary's per-link table (the testbeds' one formatter, deploy/link_table.py, with its summary
    columns: messages, payload, message and wire bytes; wire blank without a wire level), largest links first,
    at most ``top`` rows (the rest summed in one line)."""
    return format_table(per_link(links), SUMMARY_COLUMNS, top=top, total=False)


ROUTE_KEYS = {"edge": "the active edge server of each round (Fed-CHS)",
              "order": "the clusters each round visited, in order (FedCluster)",
              "client": "the client holding the model in each round (random walk)"}


def route(rounds: Iterable[Mapping[str, Any]], limit: int = 30) -> str | None:
    """The model's route for edge-walk algorithms (a round metric named in :data:`ROUTE_KEYS`), or None."""
    rounds = list(rounds)
    key = next((k for k in ROUTE_KEYS if any(k in r for r in rounds)), None)
    if key is None:
        return None
    steps = [(int(r["round"]), str(r[key])) for r in rounds if key in r]
    if key == "order":
        body = [f"  round {t}: {' -> '.join(v.split(','))}" for t, v in steps[:limit]]
    else:
        body = ["  " + " -> ".join(f"{v} (r{t})" for t, v in steps[:limit])]
    more = f"\n  ... {len(steps) - limit} more rounds (rounds.csv, column {key!r})" if len(steps) > limit else ""
    return f"route: {ROUTE_KEYS[key]}\n" + "\n".join(body) + more


def slowest_line(timeline_rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The run's slowest link (most transfer seconds) and slowest node (most compute seconds), from
    ``timeline.csv``'s rows (:attr:`RunResult.timeline`), as one line; None without timing rows."""
    from fedhop.common.timeline import slowest

    s = slowest(timeline_rows)
    if s.link is None and s.node is None:
        return None
    parts = []
    if s.link is not None:
        parts.append(f"slowest link {s.link[0]} -> {s.link[1]} ({s.link_s:.3f}s transfer in all)")
    if s.node is not None:
        parts.append(f"slowest node {s.node} ({s.node_s:.3f}s compute in all)")
    return "; ".join(parts) + " (timeline.csv has each round)"
