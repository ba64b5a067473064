"""The ``[network]`` profile in the namespace testbed: loss by an nftables rule on the receiver, delay and jitter
by the proxy, rate by htb. Root only, like tests/testbed/test_netns.py (whose helpers it uses)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.testbed.test_netns import logs, pytestmark, read_csv, run_up, write_spec

__all__ = ["pytestmark"]


def test_lossy_jittery_link_drops_retransmits_and_the_run_finishes(tmp_path: Path) -> None:
    """FedAvg, 2 clients straight to the PS over client <-> PS links with 1% loss, 40 ms +- 30 ms and 50 Mbit/s:
    the rule drops about 1% of the packets crossing each direction, the senders retransmit them, every round
    still completes with all clients, and each round lasts at least one model down and up (2 x (40 - 30) ms)."""
    profile = ("[network.client_ps]\nmbit = 50\ndelay_ms = 40\njitter_ms = 30\nloss = 0.01\n")
    spec = write_spec(tmp_path, "tb-loss", algorithm="fedavg",
                      options={"lr": 0.05, "local_steps": 2, "batch_size": 16}, clients=2, edges=0, rounds=3,
                      hidden=[1024, 960], testbed=profile)
    out = tmp_path / "run"
    p = run_up(spec, out)
    assert "lossy" in p.stderr
    res = json.loads((out / "results.json").read_text())
    assert len(res["rounds"]) == 3 and res["missing"] == [], logs(out)

    drops = json.loads((out / "loss.json").read_text())
    assert {(d["src"], d["dst"]) for d in drops} == {("ps", "client-0"), ("ps", "client-1"), ("client-0", "ps"),
                                                     ("client-1", "ps")}
    wire = {(r["src"], r["dst"]): int(r["packets"]) for r in read_csv(out / "wire.csv")}
    achieved = {f"{d['src']}->{d['dst']}": d["dropped_packets"] / wire[(d["src"], d["dst"])] for d in drops}
    print("configured loss 1%, achieved:", {k: f"{v:.2%}" for k, v in achieved.items()},
          "packets:", {f"{s}->{d}": n for (s, d), n in wire.items()})
    assert all(d["dropped_packets"] > 0 for d in drops), drops
    total_dropped = sum(d["dropped_packets"] for d in drops)
    total_sent = sum(wire[(d["src"], d["dst"])] for d in drops)
    assert 0.004 < total_dropped / total_sent < 0.025, (total_dropped, total_sent)
    retrans = {r["node"]: int(r["RetransSegs"]) for r in read_csv(out / "tcp.csv")}
    print("retransmitted segments:", retrans)
    assert sum(retrans.values()) > 0

    proxy = (out / "logs" / "proxy-ps.log").read_text()
    assert "40~30" in proxy, proxy  # the proxy holds each chunk 40 ms +- 30 ms
    times = [float(r["round_s"]) for r in read_csv(out / "round_times.csv")]
    print("round times (s):", times)
    assert all(t >= 2 * 0.010 for t in times), times
    stats = json.loads((out / "tc.json").read_text())
    assert stats and all(s["mbit"] == 50.0 for s in stats)
