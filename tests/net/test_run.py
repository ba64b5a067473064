"""The live page's /api serves a ``fedhop simulate`` run (uvicorn on loopback; the Run itself is tested in
tests/unit/test_run.py)."""

from __future__ import annotations

from pathlib import Path

import httpx

from fedhop.server.web.live import live_page, simulate
from tests.unit.test_run import spec


def test_live_page_serves_a_simulate_run() -> None:
    """``fedhop simulate --http``: the in-process Run's events feed the live page; /api/status and /api/rounds
    show the run."""
    s = spec(rounds=3)
    with live_page("127.0.0.1:0") as page:
        assert page.url is not None
        before = httpx.get(page.url + "api/status", timeout=30).json()
        result = simulate(s, page.events, run_id="sim-1")
        assert page.sync()  # the page's process has applied every event
        status = httpx.get(page.url + "api/status", timeout=30).json()
        rounds = httpx.get(page.url + "api/rounds", timeout=30).json()["rounds"]
    assert before["phase"] == "waiting"
    assert status["run_id"] == "sim-1" and status["phase"] == "finished" and status["error"] is None
    assert status["rounds_completed"] == status["rounds_total"] == 3
    assert status["nodes"] == {"expected": 6, "joined": 6, "lost": {}, "waiting": []}
    assert status["wall_s"] == result.wall_s
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert [r["cum_payload_bytes"] for r in result.rounds] == [r["payload_bytes"] for r in rounds]
    assert page.http is None  # closed with the block


def test_simulate_command_serves_with_http(tmp_path: Path, monkeypatch, capsys) -> None:
    """``fedhop simulate --http 127.0.0.1:0`` announces the page and runs as before."""
    from fedhop.cli import main

    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(spec(rounds=2, edges=0).to_toml())
    rc = main(["simulate", str(spec_file), "--out", str(tmp_path / "run"), "--quiet", "--http", "127.0.0.1:0"])
    assert rc == 0
    assert "live page: http://127.0.0.1:" in capsys.readouterr().err
    assert (tmp_path / "run" / "results.json").is_file()
