"""The ``[network]`` profile in the namespace testbed: loss by an nftables rule on the receiver, delay and jitter
held in the kernel (deploy/kernel_delay.py), rate by htb; and the nodes' own wire level (tcp_info) against the
kernel's per-link counters. Root only, like tests/testbed/test_netns.py (whose helpers it uses)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fedhop.common.timeline import read_csv as read_timeline
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

    held = {n: (out / "logs" / f"kdelay-{n}.log").read_text() for n in ("ps", "client-0", "client-1")}
    assert all("kernel delay (NFQUEUE)" in t and "40~30" in t for t in held.values()), held  # 40 ms +- 30 ms
    assert json.loads((out / "testbed.json").read_text())["delay"] == "kernel"
    times = [float(r["round_s"]) for r in read_csv(out / "round_times.csv")]
    predicted = [r["predicted_s"] for r in read_timeline(out / "timeline.csv")
                 if r["phase"] == "round" and r["round"] >= 1 and "predicted_s" in r]
    print("round times (s):", times, "the PS predicted:", [round(x, 3) for x in predicted])
    assert all(t >= 2 * 0.010 for t in times), times
    stats = json.loads((out / "tc.json").read_text())
    assert stats and all(s["mbit"] == 50.0 for s in stats)


def test_a_rate_trace_changes_round_times_as_the_profile_says(tmp_path: Path) -> None:
    """FedAvg, 2 clients straight to the PS; the client <-> PS links follow a trace (read from the spec's folder)
    that repeats 1 s at 100 Mbit/s, then 4 s at 2 Mbit/s. Rounds that lie wholly inside a 2 Mbit/s period (from
    0.5 s after it began: a step may be applied late) last about what moving the model down and up at 2 Mbit/s
    takes (within 0.8x - 1.4x), at least 3x as long as the rounds wholly inside a 100 Mbit/s period; every step of
    the trace was applied within 0.5 s of its time."""
    fast_s, slow_s, slow, fast, margin = 1.0, 4.0, 2.0, 100.0, 0.5
    cycle = fast_s + slow_s
    rows = [f"{k * cycle + off:g},{rate:g}" for k in range(60) for off, rate in ((0, fast), (fast_s, slow))]
    (tmp_path / "rate.csv").write_text("time_s,mbit\n" + "\n".join(rows) + "\n")
    rounds = 30
    spec = write_spec(tmp_path, "tb-trace", algorithm="fedavg",
                      options={"lr": 0.05, "local_steps": 1, "batch_size": 16}, clients=2, edges=0, rounds=rounds,
                      hidden=[512], testbed='[network.client_ps]\ntrace = "rate.csv"\n')
    out = tmp_path / "run"
    run_up(spec, out)
    res = json.loads((out / "results.json").read_text())
    assert len(res["rounds"]) == rounds and res["missing"] == [], logs(out)
    trace = json.loads((out / "trace.json").read_text())
    assert trace["errors"] == [] and trace["steps"], trace
    assert all(s["late_s"] < margin for s in trace["steps"]), trace["steps"]
    offset = (trace["rounds_start_unix_ns"] - trace["t0_unix_ns"]) / 1e9  # the rounds' clock on the trace's
    spans = [(offset + float(r["end_s"]) - float(r["round_s"]), offset + float(r["end_s"]))
             for r in read_csv(out / "round_times.csv")]
    by_rate: dict[float, list[float]] = {slow: [], fast: []}
    for s, e in spans:
        k, into = divmod(s, cycle)
        rate, begin, end = (fast, 0.0, fast_s) if into < fast_s else (slow, fast_s, cycle)
        if begin + margin <= into and e - k * cycle <= end:  # wholly inside one period, after its step
            by_rate[rate].append(e - s)
    wire = {(r["src"], r["dst"]): int(r["wire_bytes"]) for r in read_csv(out / "wire.csv")}
    per_round = max(wire[("ps", "client-0")], wire[("client-0", "ps")]) / rounds  # bytes each way, one client
    predicted = 2 * per_round * 8 / (slow * 1e6)  # the model down, then the update up
    print(f"rounds at {slow:g} Mbit/s: {[round(x, 2) for x in by_rate[slow]]} (predicted {predicted:.2f} s); at "
          f"{fast:g} Mbit/s: {[round(x, 2) for x in by_rate[fast]]}; trace steps late by "
          f"{max(s['late_s'] for s in trace['steps']):.3f} s at most")
    assert by_rate[slow] and by_rate[fast], (spans, trace)
    mean_slow = sum(by_rate[slow]) / len(by_rate[slow])
    mean_fast = sum(by_rate[fast]) / len(by_rate[fast])
    assert 0.8 * predicted <= mean_slow <= 1.4 * predicted, (mean_slow, predicted)
    assert mean_slow >= 3 * mean_fast, (mean_slow, mean_fast)


def test_tcp_info_wire_bytes_match_the_kernel_counters_per_link(tmp_path: Path) -> None:
    """FedAvg, 2 clients straight to the PS, a ~1 MB model, 20 ms each way (held in the kernel), no loss: per
    directed link, the wire level the nodes read from their sockets' tcp_info (links.csv's ``wire`` rows: stream
    bytes, plus a 52-byte IPv4 + TCP + timestamps header per segment) is within 1% of the kernel's counter of
    that link (wire.csv: every IP packet src -> dst, counted by nftables on the sender's output hook). What
    tcp_info cannot see and the counter does: the few packets after a node's last read (its Bye, the FINs),
    TCP options beyond timestamps (the SYNs' 8 bytes more, SACK blocks) and retransmitted bytes (none here)."""
    spec = write_spec(tmp_path, "tb-wire", algorithm="fedavg",
                      options={"lr": 0.05, "local_steps": 1, "batch_size": 16}, clients=2, edges=0, rounds=3,
                      hidden=[512, 448], testbed="[network.client_ps]\ndelay_ms = 20\n")
    out = tmp_path / "run"
    run_up(spec, out)
    tcp: dict[tuple[str, str], list[int]] = {}
    for r in read_csv(out / "links.csv"):
        if r["kind"] == "wire":
            t = tcp.setdefault((r["src"], r["dst"]), [0, 0, 0])
            t[0] += int(r["wire_bytes"])
            t[1] += int(r["wire_segments"])
            t[2] += int(r["wire_retrans"])
    kernel = {(r["src"], r["dst"]): int(r["wire_bytes"]) for r in read_csv(out / "wire.csv")
              if "other" not in (r["src"], r["dst"])}
    ratio = {f"{s}->{d}": (b + 52 * n) / kernel[(s, d)] for (s, d), (b, n, _) in tcp.items()}
    print("tcp_info (stream bytes + 52 per segment) / nft counter per link:",
          {k: f"{v:.4f}" for k, v in ratio.items()}, "retransmitted:", {f"{s}->{d}": x for (s, d), (*_, x) in
                                                                        tcp.items()})
    assert set(tcp) == set(kernel) == {("ps", "client-0"), ("ps", "client-1"), ("client-0", "ps"),
                                       ("client-1", "ps")}, (tcp, kernel)
    assert all(kernel[k] > 1_000_000 for k in (("ps", "client-0"), ("client-0", "ps"))), kernel
    assert all(abs(v - 1) <= 0.01 for v in ratio.values()), ratio


def test_a_compute_trace_is_replayed_by_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """client-1's own table has a trace whose compute column alternates 1.0 and 0.25 every 0.4 s (from the
    testbed's replay start, trace.json's t0; short, so that a quick run on an idle host still sees both): every
    task client-1 ran took the factor of the trace at its end (timing event ``compute``, FEDHOP_TIMERS, written
    where the factor is read; tasks within 20 ms of a step are not judged), both factors occurred, and a task at
    0.25 waited out 3x its handler time; client-0 (no trace) always ran at 1.0."""
    period, margin = 0.4, 0.02
    rows = [f"{k * 2 * period:g},1\n{(2 * k + 1) * period:g},0.25" for k in range(1000)]
    (tmp_path / "speed.csv").write_text("time_s,compute\n" + "\n".join(rows) + "\n")
    spec = write_spec(tmp_path, "tb-compute", algorithm="fedavg",
                      options={"lr": 0.05, "local_steps": 30, "batch_size": 16}, clients=2, edges=0, rounds=16,
                      hidden=[256], testbed='[network.nodes.client-1]\ntrace = "speed.csv"\n')
    timers = tmp_path / "timers"
    monkeypatch.setenv("FEDHOP_TIMERS", str(timers))
    out = tmp_path / "run"
    run_up(spec, out)
    offset = time.time() - time.monotonic()  # the timing events' clock (monotonic) on the trace's (unix)
    t0 = json.loads((out / "trace.json").read_text())["t0_unix_ns"] / 1e9
    events = [json.loads(line) for f in timers.glob("*.jsonl") for line in f.read_text().splitlines() if line]
    compute = [e for e in events if e["kind"] == "compute"]
    judged = []
    for e in (e for e in compute if e["at"] == "client-1"):
        into = (e["t"] + offset - t0) % (2 * period)
        if min(abs(into - b) for b in (0, period, 2 * period)) < margin:
            continue
        judged.append((1.0 if into < period else 0.25, e))
    print("client-1's tasks (trace factor, factor applied, handler s, waited s):",
          [(f, e["factor"], round(e["handler_s"], 3), round(e["slowed_s"], 3)) for f, e in judged])
    assert all(e["factor"] == f for f, e in judged), judged
    assert {f for f, _ in judged} == {1.0, 0.25}, judged
    assert all(e["slowed_s"] == pytest.approx(3 * e["handler_s"]) for f, e in judged if f == 0.25)
    assert {e["factor"] for e in compute if e["at"] == "client-0"} == {1.0}
