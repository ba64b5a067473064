"""The network-namespace testbed (``fedhop testbed up``): real namespaces, veths, htb and nftables counters.

Root only; run by ``make test-testbed`` (or ``.venv/bin/pytest tests/testbed/test_netns.py``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                                reason="needs root, ip and tc (run by make test-testbed)")

HEADER = 52  # IPv4 (20) + TCP (20) + timestamps option (12) per packet
RUN_TIMEOUT_S = 300


def write_spec(tmp: Path, name: str, *, algorithm: str, options: dict[str, Any], clients: int, edges: int,
               rounds: int, hidden: list[int], testbed: str = "", edge_graph: str = "ring") -> Path:
    opts = "\n".join(f"{k} = {json.dumps(v) if not isinstance(v, dict) else _inline(v)}" for k, v in options.items())
    text = f"""name = "{name}"
rounds = {rounds}
seed = 5
device = "cpu"

[algorithm]
name = "{algorithm}"
[algorithm.options]
{opts}

[topology]
clients = {clients}
edges = {edges}
edge_graph = "{edge_graph}"

[data]
dataset = "digits"
partition = "iid"

[model]
name = "mlp"
hidden = {json.dumps(hidden)}

[transport]
round_deadline_s = 90.0
join_timeout_s = 120.0

{testbed}
"""
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def _inline(d: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + "}"


def up_cmd(spec: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fedhop", "testbed", "up", str(spec), "--out", str(out),
            "--timeout", str(RUN_TIMEOUT_S), *extra]


def run_up(spec: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    p = subprocess.run(up_cmd(spec, out, *extra), capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 60)
    print(f"testbed up {spec.name}: {time.monotonic() - t0:.1f}s\n{p.stdout}")
    assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr}\n{logs(out)}"
    return p


def logs(out: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text()[-2000:]}" for f in sorted((out / "logs").glob("*.log"))) \
        if (out / "logs").is_dir() else "(no logs)"


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def our_namespaces(tag: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(f"{tag}-")]


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {ln.split(":")[1].strip() for ln in out.splitlines()}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").is_dir() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def assert_distinct_addresses(out: Path, n_nodes: int) -> None:
    plan = json.loads((out / "testbed.json").read_text())
    addrs = {n: v["address"] for n, v in plan["nodes"].items()}
    assert len(addrs) == n_nodes and len(set(addrs.values())) == n_nodes, addrs
    # every child joined its parent from its own namespace address, not loopback
    joined = {}
    for f in (out / "logs").glob("*.log"):
        for m in re.finditer(r": (\S+) joined from ipv4:([\d.]+):\d+", f.read_text()):
            joined[m[1]] = m[2]
    children = [n for n in addrs if n != "ps"]
    assert sorted(joined) == sorted(children), joined
    assert all(joined[n] == addrs[n] for n in children), (joined, addrs)


def assert_levels_reconciled(out: Path, mtu: int, big_bytes: int | None, header: int = HEADER) -> list[dict[str, str]]:
    """payload <= message <= wire on every link; wire holds at least one TCP/IP header (``header`` bytes) per
    MSS of message bytes; links carrying >= ``big_bytes`` of payload have wire/payload <= 1.05 once the
    retransmissions are set aside (a loaded machine drops segments on an unshaped veth too; their bytes are real
    wire bytes, but not the protocol's overhead). What may be set aside on a link: every segment its sender
    retransmitted (tcp.csv), at a full MTU each."""
    rows = read_csv(out / "link_bytes.csv")
    resent = {r["node"]: int(r["RetransSegs"]) * mtu for r in read_csv(out / "tcp.csv")}
    meters = read_csv(out / "links.csv")
    assert {(r["src"], r["dst"]) for r in meters} <= {(r["src"], r["dst"]) for r in rows}
    mss = mtu - header
    for r in rows:
        payload, message = int(r["payload_bytes"]), int(r["message_bytes"])
        assert r["wire_bytes"] != "", f"no wire count for {r['src']} -> {r['dst']}"
        wire = int(r["wire_bytes"])
        assert payload <= message <= wire, r
        assert wire >= message + header * math.ceil(message / mss), f"fewer headers than packets: {r}"
        if big_bytes is not None and payload >= big_bytes:
            assert (wire - resent.get(r["src"], 0)) / payload <= 1.05, (r, resent)
    wire = read_csv(out / "wire.csv")
    assert all(r["source"] == "nft" for r in wire)
    strays = [r for r in wire if "other" in (r["src"], r["dst"]) and int(r["wire_bytes"])]
    assert not strays, f"traffic outside the run's links: {strays}"
    for r in wire:  # the sender's output counter and the receiver's input counter agree
        assert r["wire_bytes_at_dst"] == r["wire_bytes"], r
    return rows


def test_fedchs_over_namespaces_reconciles_three_byte_levels(tmp_path: Path) -> None:
    """Fed-CHS (2 edges in a ring, 4 clients) with a ~1 MB model; jumbo frames (mtu 9000)."""
    spec = write_spec(tmp_path, "tb-fedchs", algorithm="fedchs", options={"K": 2, "batch_size": 16}, clients=4,
                      edges=2, rounds=2, hidden=[512, 448], testbed="[testbed]\nmtu = 9000\n")
    out = tmp_path / "run"
    p = run_up(spec, out)
    assert len(read_csv(out / "rounds.csv")) == 2
    assert_distinct_addresses(out, 7)
    rows = assert_levels_reconciled(out, mtu=9000, big_bytes=1 << 20)
    handoffs = [r for r in rows if r["src"].startswith("edge-") and r["dst"].startswith("edge-")]
    assert handoffs and all(int(r["payload_bytes"]) >= 1_000_000 for r in handoffs)
    assert "wire/pay" in p.stdout and "edge-0 -> edge-1" in p.stdout


def test_focus_bernoulli_flat_over_namespaces(tmp_path: Path) -> None:
    """FOCUS, clients straight to the PS, Bernoulli participation; standard mtu 1500 without TCP timestamps
    (40-byte IP+TCP headers). The levels reconcile; wire/payload is printed, not bounded by 1.05: at mtu 1500 the
    headers alone are 2.8% and each direction also carries the ACKs of the other's model (one per one or two
    segments, depending on how loaded the receiver is), so it measured 1.03-1.06 here. The 1.05 bound is asserted
    at mtu 9000 (test_fedchs_over_namespaces_reconciles_three_byte_levels)."""
    options = {"lr": 0.05, "local_steps": 2, "participation": {"kind": "bernoulli", "p": [0.9, 0.6, 0.6, 0.3]}}
    spec = write_spec(tmp_path, "tb-focus", algorithm="focus", options=options, clients=4, edges=0, rounds=3,
                      hidden=[512, 448], testbed="[testbed]\ntcp_timestamps = false\n")
    out = tmp_path / "run"
    run_up(spec, out)
    assert len(read_csv(out / "rounds.csv")) == 3
    assert_distinct_addresses(out, 5)
    rows = assert_levels_reconciled(out, mtu=1500, big_bytes=None, header=40)
    ratios = {f"{r['src']}->{r['dst']}": r["wire_per_payload"] for r in rows if r["wire_per_payload"]}
    print("wire/payload at mtu 1500, no TCP timestamps:", ratios)
    assert {r["dst"] for r in rows if r["src"] == "ps"} == {f"client-{i}" for i in range(4)}


def test_edge_to_edge_bandwidth_limit_shows_in_round_time(tmp_path: Path) -> None:
    """A 10 Mbit/s edge-edge link: each Fed-CHS round hands a ~4.2 MB model over it, so it lasts at least
    the hand-off's bytes at 10 Mbit/s (~3.4 s); htb shows it held the traffic back."""
    spec = write_spec(tmp_path, "tb-bw", algorithm="fedchs", options={"K": 1, "batch_size": 16}, clients=2, edges=2,
                      rounds=2, hidden=[1024, 960], testbed="[testbed.mbit]\nedge_edge = 10\n")
    out = tmp_path / "run"
    run_up(spec, out)
    handoff_bits = {}
    for r in read_csv(out / "links.csv"):
        if r["kind"] == "handoff" and r["phase"] == "request":
            rnd = int(r["round"])  # links.csv numbers rounds from 1, as round_times.csv does
            handoff_bits[rnd] = handoff_bits.get(rnd, 0) + 8 * int(r["message_bytes"])
    assert handoff_bits and all(b >= 8 * 4_000_000 for b in handoff_bits.values()), handoff_bits
    times = {int(r["round"]): float(r["round_s"]) for r in read_csv(out / "round_times.csv")}
    print("round times (s):", times, "hand-off Mbit:", {k: v / 1e6 for k, v in handoff_bits.items()})
    for rnd, bits in handoff_bits.items():
        assert times[rnd] >= bits / 10e6, (rnd, times[rnd], bits)
    stats = json.loads((out / "tc.json").read_text())
    edge_edge = [s for s in stats if s["node"].startswith("edge-") and s["peer"].startswith("edge-")]
    assert len(edge_edge) == 4 and all(s["mbit"] == 10.0 for s in edge_edge)
    sent = sum(s["bytes"] for s in edge_edge if s["direction"] == "out")
    assert sent >= sum(handoff_bits.values()) / 8
    assert all(s["overlimits"] > 0 for s in edge_edge if s["bytes"] > 1_000_000)
    assert not [s for s in stats if not s["peer"].startswith("edge-")]  # only the edge-edge links are shaped


def _start_and_wait_for_round(tmp_path: Path) -> tuple[subprocess.Popen, Path, dict[str, Any], set[str]]:
    spec = write_spec(tmp_path, "tb-fail", algorithm="fedchs", options={"K": 1, "batch_size": 16}, clients=2,
                      edges=2, rounds=50, hidden=[32])
    out = tmp_path / "run"
    before = root_links()
    proc = subprocess.Popen(up_cmd(spec, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 180
    while time.monotonic() < end:
        journal = out / "rounds.jsonl"
        if journal.is_file() and journal.read_text().count("\n") >= 1 and (out / "testbed.json").is_file():
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"no round finished within 180 s\n{logs(out)}")
    plan = json.loads((out / "testbed.json").read_text())
    assert our_namespaces(plan["tag"])
    return proc, out, plan, before


def _assert_clean(plan: dict[str, Any], before: set[str]) -> None:
    assert our_namespaces(plan["tag"]) == [], "namespaces left behind"
    alive = {n: p for n, p in plan["pids"].items() if pid_alive(p)}
    assert not alive, f"processes left behind: {alive}"
    assert root_links() == before, "links left behind in the root namespace"
    assert not Path(f"/run/fedhop/testbed-{plan['tag']}.json").exists()


def test_teardown_after_the_ps_is_killed_mid_run(tmp_path: Path) -> None:
    proc, out, plan, before = _start_and_wait_for_round(tmp_path)
    os.kill(plan["pids"]["ps"], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0, stdout
    assert "the PS exited with code" in stderr, stderr
    _assert_clean(plan, before)


def test_teardown_on_sigterm(tmp_path: Path) -> None:
    proc, out, plan, before = _start_and_wait_for_round(tmp_path)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr)
    assert "interrupted (SIGTERM)" in stderr, stderr
    _assert_clean(plan, before)


def _get_json(url: str) -> dict[str, Any]:
    import httpx

    return httpx.get(url, timeout=10).json()


def test_tls_delay_and_live_page_in_one_run(tmp_path: Path) -> None:
    """One FOCUS run (2 clients straight to the PS, ~1 MB model) with three things on:

    - ``--tls DIR`` from ``fedhop certs init`` (the PS's certificate names its testbed address): every link is
      mutual TLS, and payload <= message <= wire still holds per link (TLS records on top); the ratio is printed;
    - a 400 ms one-way delay on client <-> PS (held in the kernel): each round crosses that link at least twice in
      sequence (task down, result up), so every round lasts at least 2 x 400 ms;
    - ``--http 127.0.0.1:0``: the PS's live API, served inside its namespace, is read from the host while the PS
      is held before round 3 (the gate hook), and agrees with the run's results afterwards.
    A certificate folder without the testbed's addresses is refused first, naming the command that fixes it.
    """
    delay_ms = 400
    spec = write_spec(tmp_path, "tb-tls", algorithm="focus", options={"lr": 0.05, "local_steps": 2}, clients=2,
                      edges=0, rounds=3, hidden=[512, 448],
                      testbed=f"[testbed.delay_ms]\nclient_ps = {delay_ms}\n")
    fedhop = [sys.executable, "-m", "fedhop"]
    plain = tmp_path / "certs-plain"
    subprocess.run([*fedhop, "certs", "init", str(spec), "--out", str(plain)], check=True, capture_output=True)
    refused = subprocess.run(up_cmd(spec, tmp_path / "refused", "--tls", str(plain)), capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S)
    assert refused.returncode == 2, refused
    assert "do not name the testbed address" in refused.stderr and "--host ps=10.231.0.1" in refused.stderr

    certs = tmp_path / "certs"  # addresses: the subnet's hosts in node order, the PS first
    subprocess.run([*fedhop, "certs", "init", str(spec), "--out", str(certs), "--host", "ps=10.231.0.1"],
                   check=True, capture_output=True)
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "stop-2").touch()
    out = tmp_path / "run"
    proc = subprocess.Popen(up_cmd(out=out, spec=spec) + ["--tls", str(certs), "--http", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FEDHOP_TEST_GATE": str(gate)})
    try:
        end = time.monotonic() + RUN_TIMEOUT_S
        while not (gate / "at-2").exists():
            assert proc.poll() is None, (proc.communicate(), logs(out))
            assert time.monotonic() < end, f"round 2 did not end within {RUN_TIMEOUT_S}s\n{logs(out)}"
            time.sleep(0.1)
        url = json.loads((out / "testbed.json").read_text())["http"]
        while not _get_json(f"{url}api/timeline?since=1")["rows"]:  # the page's process: round 2's last event
            assert time.monotonic() < end, f"the live page did not show round 2 within {RUN_TIMEOUT_S}s"
            time.sleep(0.1)
        status = _get_json(f"{url}api/status")
        live_rounds = _get_json(f"{url}api/rounds")["rounds"]
        (gate / "go-2").touch()
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(f"testbed up with --tls, delay and --http:\n{stdout}")
    assert proc.returncode == 0, (stdout, stderr, logs(out))
    assert f"live page: {url}" in stderr and "mutual TLS" in stderr

    # TLS on every link: each role says so, and the byte levels still reconcile
    for node in ("ps", "client-0", "client-1"):
        assert "links: mutual TLS" in (out / "logs" / f"{node}.log").read_text(), node
    rows = assert_levels_reconciled(out, mtu=1500, big_bytes=None)
    big = {f"{r['src']}->{r['dst']}": float(r["wire_per_payload"]) for r in rows if int(r["payload_bytes"]) >= 1 << 20}
    print("wire/payload with TLS on, mtu 1500:", big)
    assert set(big) == {"ps->client-0", "ps->client-1", "client-0->ps", "client-1->ps"}

    # the live API, read mid-run from the host, agrees with the results
    res = json.loads((out / "results.json").read_text())
    assert status["phase"] == "running" and status["rounds_completed"] == 2 and status["rounds_total"] == 3
    assert status["nodes"]["joined"] == 2
    assert [r["accuracy"] for r in live_rounds] == [r["accuracy"] for r in res["rounds"][:2]]

    # the delay: rounds 1 and 2 (round 3 includes the gate's hold) each cross client <-> PS twice in sequence
    times = {int(r["round"]): float(r["round_s"]) for r in read_csv(out / "round_times.csv")}
    print("round times with a", delay_ms, "ms one-way delay (s):", times)
    assert all(times[k] >= 2 * delay_ms / 1000 for k in (1, 2)), times
    held = (out / "logs" / "kdelay-ps.log").read_text()  # the delay is held in the kernel (deploy/kernel_delay.py)
    assert "kernel delay (NFQUEUE)" in held and "10.231.0.2" in held
