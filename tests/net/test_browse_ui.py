"""``fedhop ui`` (server/web/browse.py) served by uvicorn over a folder of runs written by hand: the run list,
a finished run's page API answered from its files, a running run's event stream following its journal, the
overlay's curves, tokens and Host headers; and the PS's own stream when a page connects while it closes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fedhop.server.web.browse import UiServer, start_ui
from fedhop.server.web.serve import start_http
from fedhop.server.web.status import RunStatus
from tests.net.test_http_api import sse_messages
from tests.unit.test_browse import LINKS, MISSING, finished, journal, marker, rounds, spec

DONE = "20261126-010203-toy-simulate"
LIVE = "20261126-020304-toy-launch"
TOKEN = "browse-token-0123456789"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    finished(runs / DONE)
    journal(runs / LIVE, 2)
    marker(runs / LIVE, started=time.time() - 30)
    return runs


@pytest.fixture
def ui(root: Path) -> Iterator[UiServer]:
    server = start_ui(root, "127.0.0.1:0", poll_s=0.05)
    try:
        yield server
    finally:
        server.stop()


def get(ui: UiServer, path: str, **kw: Any) -> httpx.Response:
    return httpx.get(ui.url + path.lstrip("/"), timeout=30, **kw)


def test_run_list(ui: UiServer) -> None:
    got = get(ui, "api/runs").json()["runs"]
    assert [(r["name"], r["status"], r["page"]) for r in got] == [(DONE, "finished", f"runs/{DONE}/"),
                                                                  (LIVE, "running", f"runs/{LIVE}/")]
    assert got[1]["url"] == "http://127.0.0.1:8123/" and got[0]["payload_bytes"] == 3000
    page = get(ui, "/")
    assert page.status_code == 200 and "runs.js" in page.text
    assert get(ui, "static/runs.js").status_code == 200 and get(ui, "static/style.css").status_code == 200


def test_a_finished_run_is_answered_from_its_files(ui: UiServer) -> None:
    base = f"runs/{DONE}/"
    status = get(ui, base + "api/status").json()
    assert (status["phase"], status["rounds_completed"], status["rounds_total"]) == ("finished", 3, 3)
    assert (status["source"], status["folder"], status["home"], status["live_url"]) == ("folder", DONE, "../../",
                                                                                         None)
    assert status["last"] == {"accuracy": 0.8, "loss": pytest.approx(1 / 3)}
    got = get(ui, base + "api/rounds").json()["rounds"]
    # cumulative bytes come from the meter rows (links), as the PS computes them: set-up + rounds so far
    assert [(r["round"], r["payload_bytes"]) for r in got] == [(1, 1500), (2, 3000), (3, 3000)]
    links = get(ui, base + "api/links").json()
    assert links["totals"]["payload_bytes"] == sum(r["payload_bytes"] for r in LINKS)
    assert get(ui, base + "api/missing").json()["missing"] == MISSING
    topo = get(ui, base + "api/topology").json()
    assert [s["edges"] for s in topo["route"]] == [["edge-1"], ["edge-0"], ["edge-1"]]
    assert topo["missing_nodes"] == ["client-1"] and topo["nodes"]["client-0"]["state"] == "joined"
    assert 'fedhop_rounds_completed_total 3.0' in get(ui, base + "metrics").text
    page = get(ui, base)
    assert page.status_code == 200 and "app.js" in page.text
    assert get(ui, base + "static/app.js").status_code == 200
    moved = get(ui, f"runs/{DONE}", follow_redirects=False)
    assert moved.status_code == 307 and moved.headers["location"].endswith(f"/runs/{DONE}/")
    assert get(ui, "runs/nothing/api/status").status_code == 404


def test_a_running_runs_stream_follows_its_journal(ui: UiServer, root: Path) -> None:
    with httpx.stream("GET", ui.url + f"runs/{LIVE}/api/events", timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        msgs = sse_messages(resp)
        first = next(msgs)
        assert first["reset"] and first["status"]["phase"] == "running"
        assert [r["round"] for r in first["rounds"]] == [1, 2] and first["status"]["rounds_total"] == 5
        assert first["status"]["live_url"] == "http://127.0.0.1:8123/"
        with (root / LIVE / "rounds.jsonl").open("a") as f:
            f.write(json.dumps({k: v for k, v in rounds(3)[2].items() if not k.startswith("cum_")}) + "\n")
        nxt = next(msgs)  # the stream polls the folder: the new round arrives without a reload
        assert nxt["reset"] and [r["round"] for r in nxt["rounds"]] == [1, 2, 3]
        assert nxt["status"]["rounds_completed"] == 3


def test_curves_for_the_overlay(ui: UiServer) -> None:
    got = get(ui, f"api/curves?run={DONE}&run={LIVE}").json()["runs"]
    assert [(c["name"], c["algorithm"], c["status"]) for c in got] == [(DONE, "fedchs", "finished"),
                                                                       (LIVE, "fedchs", "running")]
    assert [(r["round"], r["accuracy"], r["payload_bytes"]) for r in got[0]["rounds"]] == \
        [(r["round"], r["accuracy"], r["cum_payload_bytes"]) for r in rounds(3)]
    assert "edge" not in got[0]["rounds"][0]  # numbers only
    assert "payload_bytes" not in got[1]["rounds"][0]  # a journal has no cumulative bytes yet
    assert get(ui, "api/curves?run=nothing").status_code == 404


def test_token_and_host_headers(root: Path) -> None:
    server = start_ui(root, "127.0.0.1:0", token=TOKEN)
    try:
        for path in ("/", "api/runs", f"runs/{DONE}/api/status", "static/runs.js"):
            assert get(server, path).status_code == 401, path
        ok = get(server, "api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and len(ok.json()["runs"]) == 2
        assert get(server, f"runs/{DONE}/api/status", headers={"Authorization": f"Bearer {TOKEN}"}).json()[
            "phase"] == "finished"
        assert get(server, "api/runs", headers={"Authorization": f"Bearer {TOKEN}",
                                                "Host": "evil.example"}).status_code == 400
    finally:
        server.stop()
    with pytest.raises(ValueError, match="bearer token is required"):
        start_ui(root, "0.0.0.0:0")


def test_stop_ends_open_streams(ui: UiServer) -> None:
    with httpx.stream("GET", ui.url + f"runs/{DONE}/api/events", timeout=30) as resp:
        msgs = sse_messages(resp)
        assert next(msgs)["status"]["phase"] == "finished"
        ui.stop()
        assert list(msgs) == []
    assert not ui._thread.is_alive()


def test_a_page_connecting_while_the_ps_closes_gets_the_final_state() -> None:
    """The PS closes its streams when the run ends; a page that connects then still gets the run (it used to get
    an empty stream and stay on "connecting...")."""
    status = RunStatus()
    status("run_started", {"run_id": "r-1", "spec": spec(2),
                           "nodes": None, "resumed_at": 0})
    for t in (0, 1):
        status("round_started", {"round": t})
        status("round_ended", {"round": t, "duration_s": 0.5, "record": {"round": t + 1, "accuracy": 0.4 + t / 10}})
    status("run_finished", {"ok": True, "wall_s": 1.0, "error": None})
    server = start_http(status, "127.0.0.1", 0)
    try:
        notifier = server._app.state.notifier  # type: ignore[attr-defined]
        notifier.close()  # what server.stop() does first
        deadline = time.monotonic() + 10
        while not notifier.closing:  # close() hands the flag to the server's loop
            assert time.monotonic() < deadline, "the notifier never closed"
            time.sleep(0.01)
        with httpx.stream("GET", server.url + "api/events", timeout=30) as resp:
            msgs = list(sse_messages(resp))  # ends: the server is closing
        assert len(msgs) == 1 and msgs[0]["reset"]
        assert msgs[0]["status"]["phase"] == "finished" and [r["round"] for r in msgs[0]["rounds"]] == [1, 2]
    finally:
        server.stop()


def test_the_page_carries_the_runs_state(ui: UiServer) -> None:
    """Served with the run's state in it, the page shows the run even when its event stream never connects;
    nothing in the state can end the script element (a missing-log reason here)."""
    status = RunStatus()
    status("run_started", {"run_id": "r-1", "spec": spec(2), "nodes": None, "resumed_at": 0})
    status("round_started", {"round": 0})
    status("round_ended", {"round": 0, "duration_s": 0.5, "record": {"round": 1, "accuracy": 0.625}})
    status("missing", {"entry": {"round": 1, "by": "edge-0", "node": "client-1", "task": "t",
                                 "reason": "</script><script>alert(1)</script>"}})
    server = start_http(status, "127.0.0.1", 0)
    try:
        html = httpx.get(server.url, timeout=30).text
    finally:
        server.stop()
    head, _, rest = html.partition('<script id="snapshot" type="application/json">')
    body, _, _ = rest.partition("</script>")
    snap = json.loads(body)
    assert snap["reset"] and snap["status"]["phase"] == "running" and snap["rounds"][0]["accuracy"] == 0.625
    assert snap["missing"][0]["reason"] == "</script><script>alert(1)</script>"
    assert "alert(1)</script>" not in html
    # fedhop ui's run pages are the same page: they carry the folder's state
    page = get(ui, f"runs/{DONE}/").text
    assert '"phase": "finished"' in page.partition('id="snapshot"')[2]
