"""The PS's HTTP API and /metrics against a running federation of real processes (`fedhop server --http`),
read while the PS is held between rounds 2 and 3 (the gate hook), then checked against the run's own
results.json after it ended: live bytes come from the children's per-task reports, so the edge <-> client
links must be there mid-run, not only after the Bye."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fedhop.common.wire.control import CONTROL_KINDS
from tests.integration.netutil import Federation, free_port, load_result, small_spec
from tests.integration.test_resume_network import wait_file
from tests.waiting import wait_until


def test_api_and_metrics_of_a_running_federation(tmp_path: Path, monkeypatch) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "stop-2").touch()
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(gate))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = small_spec("fedchs", clients=4, edges=2, rounds=4, edge_graph="ring", options={"K": 3})
    fed = Federation(spec, tmp_path, server_args=("--http", f"127.0.0.1:{port}"))
    try:
        wait_file(gate / "at-2", fed)
        # the page's own process applies the events a moment after the PS emitted them: round 2's last one
        wait_until(lambda: httpx.get(f"{url}/api/timeline?since=1", timeout=10).json()["rows"],
                   "the live page to show round 2's timeline", timeout=60)
        status = httpx.get(f"{url}/api/status", timeout=10).json()
        rounds = httpx.get(f"{url}/api/rounds", timeout=10).json()["rounds"]
        rows = httpx.get(f"{url}/api/links?rows=1", timeout=10).json()["rows"]
        topo = httpx.get(f"{url}/api/topology", timeout=10).json()
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        page = httpx.get(f"{url}/", timeout=10)
        (gate / "go-2").touch()
        assert fed.wait(240) == 0, fed.all_logs()
    finally:
        fed.close()
    res, _ = load_result(fed.out)

    assert status["phase"] == "running" and status["rounds_completed"] == 2 and status["rounds_total"] == 4
    assert status["nodes"]["joined"] == 2 + 4 and status["nodes"]["lost"] == {}  # every edge and client
    assert [r["accuracy"] for r in rounds] == [r["accuracy"] for r in res["rounds"][:2]]
    assert [s["edges"] for s in topo["route"]] == [[r["edge"]] for r in res["rounds"][:2]]
    assert page.status_code == 200 and "<html" in page.text.lower()

    # live rows: every task row of rounds 1-2 (0-based 0-1 in memory) equals the final table's, edge <-> client
    # links included (they reach the PS in the edges' per-task reports)
    def task_rows(rs: list[dict], shift: int) -> dict[tuple, int]:
        out: dict[tuple, int] = {}
        for r in rs:
            rnd = r["round"] - shift
            if r["kind"] not in CONTROL_KINDS and 0 <= rnd < 2:  # reports, session frames, wire: network-only
                out[(r["src"], r["dst"], r["kind"], r["phase"], rnd)] = r["payload_bytes"]
        return out

    live = task_rows(rows, 0)
    final = task_rows(res["links"], 1)  # the run folder numbers rounds from 1
    assert live == final
    assert any(k[0].startswith("client-") and k[1].startswith("edge-") for k in live)

    fams = {f.name: f for f in text_string_to_metric_families(metrics)}
    assert fams["fedhop_rounds_completed"].samples[0].value == 2
    assert fams["fedhop_nodes_connected"].samples[0].value == 6
    per_kind: dict[str, float] = defaultdict(float)
    for s in fams["fedhop_link_payload_bytes"].samples:
        if s.name.endswith("_total"):
            per_kind[s.labels["kind"]] += s.value
    want: dict[str, float] = defaultdict(float)
    for r in rows:
        want[r["kind"]] += r["payload_bytes"]
    assert dict(per_kind) == dict(want) and per_kind["fedchs.grad"] > 0
