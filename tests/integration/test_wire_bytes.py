"""The wire level in a plain ``fedhop launch`` (no root): every parent reads its children's connections' TCP
counters (sock_diag, transport/tcp_counters.py) once per round, so links.csv has wire bytes per link, direction
and round, and payload <= message <= wire on every link that carries a model."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import pytest

from fedhop.common.engine.results import LINKS_HEADER
from fedhop.common.wire.meter import WIRE_KIND, WIRE_PHASE
from fedhop.transport.tcp_counters import TcpCounters
from tests.integration.netutil import launch_here, small_spec


def sock_diag_works() -> bool:
    counters = TcpCounters("probe")
    counters.read()
    return counters.available


@pytest.mark.skipif(not sock_diag_works(), reason="this kernel does not answer sock_diag (inet_diag) to this user")
def test_launch_writes_wire_bytes_per_link_direction_and_round(tmp_path: Path) -> None:
    spec = small_spec("fedavg", clients=4, edges=2, rounds=2)
    out = launch_here(spec, tmp_path)  # launch's own run folder, as `fedhop launch` writes it
    totals = json.loads((out / "results.json").read_text())["totals"]
    with (out / "links.csv").open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == LINKS_HEADER
        rows = list(reader)

    wire = [r for r in rows if r["kind"] == WIRE_KIND]
    others = [r for r in rows if r["kind"] != WIRE_KIND]
    assert wire and others
    assert all(r["wire_bytes"] == r["wire_segments"] == r["wire_retrans"] == "" for r in others)
    assert all(r["phase"] == WIRE_PHASE and r["messages"] == r["payload_bytes"] == r["message_bytes"] == "0"
               for r in wire)

    level: dict[str, dict[tuple[str, str], int]] = {k: defaultdict(int) for k in ("payload", "message", "wire")}
    wire_rounds: dict[tuple[str, str], set[int]] = defaultdict(set)
    for r in others:
        if r["kind"] == "bye":  # sent after the parent's last read of a connection that may close at once
            continue
        level["payload"][(r["src"], r["dst"])] += int(r["payload_bytes"])
        level["message"][(r["src"], r["dst"])] += int(r["message_bytes"])
    for r in wire:
        level["wire"][(r["src"], r["dst"])] += int(r["wire_bytes"])
        if int(r["wire_bytes"]):
            wire_rounds[(r["src"], r["dst"])].add(int(r["round"]))

    edges = [f"edge-{m}" for m in range(2)]
    clients = [f"client-{i}" for i in range(4)]
    model_links = {k for k, v in level["payload"].items() if v > 0}
    # every link of the tree carries a model one way or the other: PS <-> edges, edges <-> their clients
    assert {("ps", e) for e in edges} | {(e, "ps") for e in edges} <= model_links
    assert {c for link in model_links for c in link if c.startswith("client-")} == set(clients)
    for link in model_links:
        p, m, w = level["payload"][link], level["message"][link], level["wire"][link]
        assert 0 < p <= m <= w, f"{link}: payload {p}, message {m}, wire {w}"
        assert wire_rounds[link] >= set(range(1, spec.rounds + 1)), (link, sorted(wire_rounds[link]))
    # no connection is counted twice: the wire level only names links of the tree (parent <-> child)
    tree = model_links | {(b, a) for a, b in model_links}
    assert set(level["wire"]) <= tree
    assert totals["wire_bytes"] == sum(level["wire"].values()) >= totals["message_bytes"]
