"""The PS's web face (server/web): RunStatus fed by lifecycle events, the JSON API, /metrics, the SSE feed,
bearer tokens and the --http flags, against synthetic events and a real in-process run served by uvicorn."""

from __future__ import annotations

import argparse
import json
import math
import re
import socket
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.inprocess import FaultPlan
from fedhop.common.engine.results import RunResult
from fedhop.common.topology import build_topology
from fedhop.server.web.cli import add_http_args
from fedhop.server.web.live import open_page
from fedhop.server.web.serve import HttpConfigError, start_http
from fedhop.server.web.status import RunStatus
from tests.live_run import run_with_events
from tests.unit.test_fedchs import spec as fedchs_spec

TOKEN = "s3cret-token-0123456789"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def row(src: str, dst: str, kind: str, phase: str, rnd: int, payload: int, message: int, **extra: int) -> dict:
    return {"src": src, "dst": dst, "kind": kind, "phase": phase, "round": rnd, "messages": 1,
            "payload_bytes": payload, "message_bytes": message, **extra}


# -- RunStatus from synthetic events --------------------------------------------------------------------------

def test_status_follows_a_run_from_joining_to_finished() -> None:
    clock = Clock()
    st = RunStatus(clock=clock)
    s = fedchs_spec({"K": 2}, clients=6, edges=3, rounds=4, graph="ring")
    assert st.status()["phase"] == "waiting"
    st("run_started", {"run_id": "r-1", "spec": s.model_dump(mode="json"), "nodes": None, "resumed_at": 0})
    st("node_joined", {"node": "edge-0", "role": "edge"})
    st("node_joined", {"node": "client-0", "role": "client"})
    got = st.status()
    assert (got["phase"], got["run_id"], got["algorithm"]) == ("joining", "r-1", "fedchs")
    assert got["nodes"]["expected"] == 9 and got["nodes"]["joined"] == 2
    assert got["nodes"]["waiting"] == ["edge-1", "edge-2", "client-1", "client-2", "client-3", "client-4",
                                       "client-5"]
    assert got["eta_s"] is None

    clock.t = 101.0
    st("round_started", {"round": 0})
    clock.t = 103.0
    st("round_ended", {"round": 0, "duration_s": 2.0,
                       "record": {"round": 1, "edge": "edge-1", "accuracy": 0.5, "loss": 1.25}})
    st("links", {"rows": [row("ps", "edge-1", "fedchs.round", "request", 0, 0, 40),
                          row("edge-1", "client-2", "fedchs.grad", "request", 0, 400, 450),
                          row("edge-1", "client-2", "fedchs.grad", "request", -1, 10, 20)]})
    st("round_started", {"round": 1})
    st("node_lost", {"node": "client-0", "reason": "stream closed"})
    clock.t = 107.0
    st("round_ended", {"round": 1, "duration_s": 4.0,
                       "record": {"round": 2, "edge": "edge-2", "redo": "edge-1 failed", "train_loss": 0.9}})
    st("links", {"rows": [row("ps", "edge-1", "fedchs.round", "request", 0, 0, 40),
                          row("edge-1", "client-2", "fedchs.grad", "request", 0, 400, 450),
                          row("edge-1", "client-2", "fedchs.grad", "request", -1, 10, 20),
                          row("edge-2", "client-4", "fedchs.grad", "reply", 1, 1000, 1100, wire_bytes=1300),
                          row("edge-1", "client-2", "fedchs.grad", "request", 1, 400, 450)]})
    st("missing", {"entry": {"round": 2, "by": "edge-1", "node": "client-3", "task": "fedchs.grad",
                             "reason": "down"}})
    st("round_started", {"round": 2})

    got = st.status()
    assert got["phase"] == "running" and got["round"] == 3 and got["rounds_completed"] == 2
    assert got["mean_round_s"] == 3.0
    assert got["eta_s"] == 3.0 * (4 - 2)
    assert got["elapsed_s"] == 7.0
    assert got["last"] == {"accuracy": 0.5, "loss": 1.25}  # round 2 did not evaluate
    assert got["nodes"]["joined"] == 1 and got["nodes"]["lost"] == {"client-0": "stream closed"}

    rounds = st.rounds()
    assert [r["round"] for r in rounds] == [1, 2]
    # bytes of every row with round <= the round's index; set-up rows (-1) count from round 1 on
    assert [(r["payload_bytes"], r["message_bytes"]) for r in rounds] == [(410, 510), (1810, 2060)]
    assert [r["duration_s"] for r in rounds] == [2.0, 4.0] and [r["elapsed_s"] for r in rounds] == [3.0, 7.0]
    assert rounds[1]["redo"] == "edge-1 failed" and st.rounds(since=1) == rounds[1:]

    links = st.links()
    assert [(x["src"], x["dst"], x["payload_bytes"], x["message_bytes"], x["wire_bytes"]) for x in links["links"]] \
        == [("edge-2", "client-4", 1000, 1100, 1300), ("edge-1", "client-2", 810, 920, 0), ("ps", "edge-1", 0, 40, 0)]
    assert links["totals"] == {"messages": 5, "payload_bytes": 1810, "message_bytes": 2060, "wire_bytes": 1300}
    kinds = {(x["src"], x["dst"], x["kind"], x["phase"]): (x["messages"], x["last_round"]) for x in links["by_kind"]}
    assert kinds[("edge-1", "client-2", "fedchs.grad", "request")] == (3, 1)

    topo = st.topology()
    ref = build_topology(s.topology, s.seed)
    assert topo["edges"] == list(ref.edges) and topo["clients"] == list(ref.clients)
    assert topo["parent"] == ref.parent
    assert topo["edge_graph"] == [["edge-0", "edge-1"], ["edge-0", "edge-2"], ["edge-1", "edge-2"]]  # ring of 3
    assert topo["route"] == [{"round": 1, "edges": ["edge-1"]},
                             {"round": 2, "edges": ["edge-2"], "redo": "edge-1 failed"}]
    assert topo["nodes"]["client-0"] == {"role": "client", "state": "lost", "reason": "stream closed"}
    assert topo["nodes"]["edge-0"]["state"] == "joined" and topo["nodes"]["edge-2"]["state"] == "waiting"
    assert topo["missing_nodes"] == ["client-3"]
    assert st.missing() == [{"round": 2, "by": "edge-1", "node": "client-3", "task": "fedchs.grad",
                             "reason": "down"}]

    clock.t = 110.0
    st("run_finished", {"ok": False, "wall_s": 9.5, "error": "RoundFailed: round 3"})
    got = st.status()
    assert (got["phase"], got["error"], got["wall_s"], got["eta_s"], got["round"]) == \
        ("failed", "RoundFailed: round 3", 9.5, 0.0, None)
    clock.t = 500.0
    assert st.status()["elapsed_s"] == 10.0  # frozen at the end


def test_fedcluster_route_is_the_visiting_order_and_setup_is_apart() -> None:
    st = RunStatus()
    s = fedchs_spec(clients=6, edges=3, rounds=3)
    st("run_started", {"run_id": "r", "spec": s, "nodes": ["ps", "edge-0"], "resumed_at": 1})
    st("round_started", {"round": -1})
    st("round_ended", {"round": -1, "record": {}, "duration_s": 0.5})
    st("round_ended", {"round": 1, "record": {"round": 2, "order": "edge-2,edge-0"}, "duration_s": 1.0})
    st("round_ended", {"round": 2, "record": {"round": 3, "order": ""}, "duration_s": 1.0})
    assert st.topology()["route"] == [{"round": 2, "edges": ["edge-2", "edge-0"]}, {"round": 3, "edges": []}]
    assert st.setup_round() == {"duration_s": 0.5, "elapsed_s": st.setup_round()["elapsed_s"]}
    got = st.status()
    assert got["rounds_completed"] == 3 and got["nodes"]["expected"] == 1  # resumed at 1; the nodes it was given


def test_unknown_event_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event kind 'bogus'"):
        RunStatus()("bogus", {})


def test_concurrent_events_and_reads_stay_consistent() -> None:
    st = RunStatus()
    st("run_started", {"run_id": "r", "spec": fedchs_spec(rounds=400), "nodes": None, "resumed_at": 0})
    n = 400
    errors: list[str] = []
    done = threading.Event()

    def writer() -> None:
        rows = []
        for t in range(n):
            st("round_started", {"round": t})
            st("round_ended", {"round": t, "record": {"round": t + 1, "accuracy": t / n}, "duration_s": 0.01})
            rows.append(row("ps", "edge-0", "k", "request", t, 3, 5))
            st("links", {"rows": list(rows)})
        done.set()

    def reader() -> None:
        while not done.is_set():
            rounds = st.rounds()
            for r in rounds:  # each round's cumulative bytes is consistent with the rows seen so far
                if r["payload_bytes"] not in (3 * r["round"], 3 * (r["round"] - 1)):
                    errors.append(f"round {r['round']}: {r['payload_bytes']}")
            links = st.links()
            if links["links"] and links["totals"]["payload_bytes"] != links["links"][0]["payload_bytes"]:
                errors.append("totals disagree with the only link")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert st.status()["rounds_completed"] == n and st.rounds()[-1]["payload_bytes"] == 3 * n


# -- a real in-process run served by uvicorn -------------------------------------------------------------------

def _spec():
    return fedchs_spec({"K": 2}, clients=6, edges=3, rounds=4)


# clients 0, 2, 4 (one per edge) are down in round 2, wherever the model is
FAULTS = FaultPlan(lambda node, task, rnd: node in ("client-0", "client-2", "client-4") and rnd == 1)


@pytest.fixture(scope="module")
def served_run() -> Iterator[tuple[RunResult, str]]:
    status = RunStatus()
    events = RunEvents()
    events.subscribe(status)
    server = start_http(status, "127.0.0.1", 0)
    try:
        result = run_with_events(_spec(), events, run_id="api-run", faults=FAULTS)
        yield result, server.url
    finally:
        server.stop()


def get(url: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.get(url + path.lstrip("/"), timeout=30, **kw)


def test_status_endpoint_matches_the_run(served_run: tuple[RunResult, str]) -> None:
    result, url = served_run
    got = get(url, "api/status").json()
    evaluated = [r for r in result.rounds if "accuracy" in r]
    assert got["phase"] == "finished" and got["run_id"] == "api-run" and got["error"] is None
    assert got["rounds_completed"] == got["rounds_total"] == len(result.rounds) == 4
    assert got["last"] == {"accuracy": evaluated[-1]["accuracy"], "loss": evaluated[-1]["loss"]}
    assert got["nodes"] == {"expected": 9, "joined": 9, "lost": {}, "waiting": []}
    assert got["wall_s"] == result.wall_s and got["spec"] == result.spec.model_dump(mode="json")


def test_rounds_endpoint_matches_the_run(served_run: tuple[RunResult, str]) -> None:
    result, url = served_run
    got = get(url, "api/rounds").json()["rounds"]
    assert len(got) == len(result.rounds)
    for mine, ref in zip(got, result.rounds, strict=True):
        sent = [r for r in result.links if r["round"] <= ref["round"] - 1]
        assert mine["payload_bytes"] == sum(r["payload_bytes"] for r in sent) == ref["cum_payload_bytes"]
        assert mine["message_bytes"] == sum(r["message_bytes"] for r in sent)
        for k in ("round", "edge", "accuracy", "loss", "train_loss", "client_steps"):
            assert mine[k] == ref[k], k
        assert mine["duration_s"] > 0
    assert get(url, "api/rounds?since=3").json()["rounds"] == got[3:]
    assert get(url, "api/rounds?since=x").status_code == 400


def test_links_endpoint_matches_the_meter(served_run: tuple[RunResult, str]) -> None:
    result, url = served_run
    got = get(url, "api/links").json()
    per_link: dict[tuple[str, str], int] = defaultdict(int)
    for r in result.links:
        per_link[(r["src"], r["dst"])] += r["payload_bytes"]
    assert {(x["src"], x["dst"]): x["payload_bytes"] for x in got["links"]} == dict(per_link)
    assert [x["payload_bytes"] for x in got["links"]] == sorted(per_link.values(), reverse=True)
    assert got["totals"]["payload_bytes"] == sum(r["payload_bytes"] for r in result.links)
    assert got["totals"]["message_bytes"] == sum(r["message_bytes"] for r in result.links)
    assert "wire_bytes" not in got["totals"]  # the in-process meter has no kernel counts
    assert get(url, "api/links?rows=1").json()["rows"] == result.links


def test_topology_and_missing_endpoints_match_the_run(served_run: tuple[RunResult, str]) -> None:
    result, url = served_run
    topo = get(url, "api/topology").json()
    ref = build_topology(result.spec.topology, result.spec.seed)
    assert topo["edges"] == list(ref.edges) and topo["clients"] == list(ref.clients)
    assert {tuple(p) for p in topo["edge_graph"]} == {(a, b) for a in ref.edges for b in ref.neighbours[a]
                                                       if ref.ordinal(a) < ref.ordinal(b)}
    assert [s["edges"] for s in topo["route"]] == [[r["edge"] for r in result.rounds][i:i + 1]
                                                   for i in range(len(result.rounds))]
    assert result.missing, "the fault plan must have produced missing entries"
    assert topo["missing_nodes"] == sorted({m["node"] for m in result.missing})
    assert all(n["state"] == "joined" for n in topo["nodes"].values())
    assert get(url, "api/missing").json()["missing"] == result.missing


def test_timeline_endpoint_has_every_round_node_and_hand_off(served_run: tuple[RunResult, str]) -> None:
    result, url = served_run
    got = get(url, "api/timeline").json()
    rows = got["rows"]
    final = {(r["round"], r["node"], r["peer"], r["phase"]) for r in result.timeline}
    assert {(r["round"], r["node"], r["peer"], r["phase"]) for r in rows} <= final
    assert {r["round"] for r in rows if r["phase"] == "round"} == {0, 1, 2, 3}
    ref = build_topology(result.spec.topology, result.spec.seed)
    computed = {r["node"] for r in rows if r["phase"] == "compute"}
    assert set(ref.edges) <= computed and "ps" in computed
    # Fed-CHS hands the model from edge to edge: those hand-offs are timed links between edges
    assert any(r["node"] in ref.edges and r["peer"] in ref.edges for r in rows if r["phase"] == "transfer")
    assert all(r["seconds"] >= 0 for r in rows)
    assert got["slowest_node"]["node"] in computed and got["slowest_link"]["transfer_s"] >= 0
    later = get(url, "api/timeline?since=2").json()["rows"]
    assert later == [r for r in rows if r["round"] >= 2] and later
    assert get(url, "api/timeline?since=x").status_code == 400


def test_metrics_endpoint_parses_and_matches_the_run(served_run: tuple[RunResult, str]) -> None:
    result, url = served_run
    resp = get(url, "metrics")
    assert resp.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(resp.text)}
    value = {f: fams[f].samples[0].value for f in ("fedhop_rounds_completed", "fedhop_nodes_connected",
                                                     "fedhop_nodes_expected", "fedhop_test_accuracy")}
    assert value == {"fedhop_rounds_completed": 4, "fedhop_nodes_connected": 9, "fedhop_nodes_expected": 9,
                     "fedhop_test_accuracy": result.rounds[-1]["accuracy"]}
    phase = {s.labels["phase"]: s.value for s in fams["fedhop_run_phase"].samples}
    assert phase["finished"] == 1 and sum(phase.values()) == 1

    want: dict[tuple[str, ...], int] = defaultdict(int)
    for r in result.links:
        want[(r["src"], r["dst"], r["kind"], r["phase"])] += r["payload_bytes"]
    got = {(s.labels["src"], s.labels["dst"], s.labels["kind"], s.labels["phase"]): s.value
           for s in fams["fedhop_link_payload_bytes"].samples if s.name.endswith("_total")}
    assert got == want

    hist = {(s.name, s.labels.get("le")): s.value for s in fams["fedhop_round_duration_seconds"].samples}
    durations = [r["duration_s"] for r in get(url, "api/rounds").json()["rounds"]]
    assert hist[("fedhop_round_duration_seconds_count", None)] == 4
    assert hist[("fedhop_round_duration_seconds_bucket", "+Inf")] == 4
    assert math.isclose(hist[("fedhop_round_duration_seconds_sum", None)], sum(durations))
    assert hist[("fedhop_round_duration_seconds_bucket", "600.0")] == sum(d <= 600 for d in durations)


def test_page_and_its_static_files_are_served(served_run: tuple[RunResult, str]) -> None:
    _, url = served_run
    page = get(url, "/")
    assert page.status_code == 200 and 'src="static/app.js"' in page.text
    js = get(url, "static/app.js")
    assert js.status_code == 200 and "EventSource" in js.text
    assert get(url, "static/style.css").status_code == 200
    # nothing is loaded from elsewhere: every src/href of the page and every URL the script opens is relative
    assert not re.search(r'(src|href)="(https?:)?//', page.text)
    assert re.findall(r"https?://[^\s\"]+", js.text) == ["http://www.w3.org/2000/svg"]


def test_loopback_server_refuses_foreign_host_headers(served_run: tuple[RunResult, str]) -> None:
    _, url = served_run
    assert get(url, "api/status", headers={"Host": "evil.example"}).status_code == 400
    assert get(url, "api/status", headers={"Host": "localhost:1234"}).status_code == 200


# -- live: the SSE feed during a run ---------------------------------------------------------------------------

def sse_messages(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    event, data = None, []
    for line in resp.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            if event == "update":
                yield json.loads("\n".join(data))
            event, data = None, []


def test_event_stream_follows_a_run_live() -> None:
    """The page's feed: the test holds the run at the start of round 3 until the stream has shown round 2,
    then lets it finish and checks that the stream ends at the run's results."""
    status = RunStatus()
    events = RunEvents()
    reached, release = threading.Event(), threading.Event()

    def reach(kind: str, data: dict[str, Any]) -> None:
        if kind == "round_started" and data["round"] == 2:
            reached.set()

    def hold(kind: str, data: dict[str, Any]) -> None:
        if kind == "round_started" and data["round"] == 2:
            release.wait(120)

    # `reached` is set before the status sees round 3 start, and the run is held after it: every message that
    # shows round 3 running comes after `reached` (set in the status's own listener, the feed could send that
    # message before the gate had set it, and then no later message came while the run was held)
    events.subscribe(reach)
    events.subscribe(status)
    events.subscribe(hold)
    server = start_http(status, "127.0.0.1", 0)
    out: dict[str, Any] = {}
    run = threading.Thread(target=lambda: out.update(result=run_with_events(_spec(), events, faults=FAULTS)))
    try:
        with httpx.stream("GET", server.url + "api/events", timeout=60) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            msgs = sse_messages(resp)
            first = next(msgs)
            assert first["reset"] and first["status"]["phase"] == "waiting" and first["rounds"] == []
            run.start()
            rounds: list[dict[str, Any]] = []
            route: list[dict[str, Any]] = []
            seen_live = None
            links: dict[str, Any] | None = None
            for m in msgs:
                assert not m["reset"]
                rounds += m["rounds"]
                route += m["route"]
                for i, (p, b) in enumerate(zip(m.get("cumulative", {}).get("payload_bytes", []),
                                               m.get("cumulative", {}).get("message_bytes", []), strict=True)):
                    rounds[m["cumulative"]["from"] + i].update(payload_bytes=p, message_bytes=b)
                links = m.get("links", links)
                if m["status"]["phase"] == "running" and m["status"]["rounds_completed"] == 2 and reached.is_set():
                    seen_live = dict(m["status"])
                    release.set()
                if m["status"]["phase"] == "finished":
                    break
    finally:
        release.set()
        run.join(120)
        server.stop()
    result = out["result"]
    assert seen_live is not None and seen_live["round"] == 3, "the stream never showed the held run"
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    for mine, ref in zip(rounds, result.rounds, strict=True):
        assert (mine["accuracy"], mine["payload_bytes"], mine["message_bytes"]) == \
            (ref["accuracy"], ref["cum_payload_bytes"], ref["cum_message_bytes"])
    assert [s["edges"][0] for s in route] == [r["edge"] for r in result.rounds]
    assert links is not None and links["totals"]["payload_bytes"] == sum(r["payload_bytes"] for r in result.links)


def test_stop_ends_open_streams() -> None:
    status = RunStatus()
    server = start_http(status, "127.0.0.1", 0)
    with httpx.stream("GET", server.url + "api/events", timeout=30) as resp:
        msgs = sse_messages(resp)
        assert next(msgs)["reset"]
        server.stop()
        assert list(msgs) == []  # the server closed the stream: the iteration ends instead of hanging
    assert not server._thread.is_alive()


# -- tokens, addresses and flags ---------------------------------------------------------------------------------

def test_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(HttpConfigError, match="bearer token is required"):
        start_http(RunStatus(), "0.0.0.0", 0)
    with pytest.raises(HttpConfigError, match="at least 16 characters"):
        start_http(RunStatus(), "127.0.0.1", 0, token="short")


def test_token_is_checked_on_every_route() -> None:
    server = start_http(RunStatus(), "0.0.0.0", 0, token=TOKEN)
    base = f"http://127.0.0.1:{server.port}/"
    try:
        with httpx.Client(base_url=base) as c:
            for path in ("/", "/api/status", "/api/rounds", "/api/links", "/api/topology", "/api/missing",
                         "/api/timeline", "/api/events", "/metrics", "/static/app.js"):
                assert c.get(path).status_code == 401, path
                wrong = c.get(path, headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"})
                assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer"), path
                if path != "/api/events":  # an endless stream; its 401s above are what matters
                    assert c.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, path
        # a browser: /?token=... sets a cookie and redirects; the cookie then opens every route
        with httpx.Client(base_url=base) as browser:
            assert browser.get("/?token=nope").status_code == 401
            first = browser.get(f"/?token={TOKEN}")
            assert first.status_code == 303 and first.headers["location"] == "/"
            assert browser.get("/api/status").status_code == 200
    finally:
        server.stop()


def test_taken_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve the live page on 127.0.0.1:{port}"):
            start_http(RunStatus(), "127.0.0.1", port)


def test_http_flags() -> None:
    p = argparse.ArgumentParser()
    add_http_args(p, default="127.0.0.1:0")
    lines: list[str] = []
    page = open_page(p.parse_args([]).http, announce=lines.append)
    server = page.http
    try:
        assert server is not None and lines == [f"live page: http://127.0.0.1:{server.port}/"]
        assert get(server.url, "api/status").status_code == 200
    finally:
        page.close()
    assert open_page(p.parse_args(["--http", "off"]).http).http is None
    with pytest.raises(HttpConfigError, match="bearer token is required"):
        open_page("0.0.0.0:0", token=None)
    for bad in ("8080", "localhost:http", "127.0.0.1:70000", ":80"):
        with pytest.raises(SystemExit):
            p.parse_args(["--http", bad])

    q = argparse.ArgumentParser()
    add_http_args(q)
    assert q.parse_args([]).http == "off"
    assert q.parse_args(["--http", "[::1]:0", "--http-token", TOKEN]).http_token == TOKEN
