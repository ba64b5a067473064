"""Run folders as a collection (fedhop/browse.py, fedhop/cli/browse.py): the status rule, ``fedhop ls`` and
``fedhop show`` on folders written by hand, and on one written by a tiny in-process run; the run page rebuilt
from a folder (server/web/browse.py's FolderStatus) equals the live one of the same run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from fedhop import browse
from fedhop.browse import LiveMarker, RunNotFound, find_runs, fmt_bytes, fmt_duration, list_runs, read_folder
from fedhop.cli.app import main

NOW = 2_000_000_000.0


def spec(rounds: int = 3, algorithm: str = "fedchs", name: str = "toy") -> dict[str, Any]:
    return {"name": name, "algorithm": {"name": algorithm, "options": {}}, "rounds": rounds, "seed": 0,
            "topology": {"clients": 4, "edges": 2, "edge_graph": "random"}}


def rounds(n: int, edge: bool = True) -> list[dict[str, Any]]:
    return [{"round": t, "accuracy": 0.5 + t / 10, "loss": 1.0 / t, "elapsed_s": 0.5 * t, "round_s": 0.5,
             **({"edge": f"edge-{t % 2}"} if edge else {}), "cum_payload_bytes": 1000 * t,
             "cum_message_bytes": 1100 * t} for t in range(1, n + 1)]


LINKS = [
    {"src": "ps", "dst": "edge-0", "kind": "fedchs.round", "phase": "request", "round": 1, "messages": 1,
     "payload_bytes": 1500, "message_bytes": 1600},
    {"src": "client-0", "dst": "edge-0", "kind": "fedchs.grad", "phase": "reply", "round": 2, "messages": 2,
     "payload_bytes": 1500, "message_bytes": 1700},
]
MISSING = [{"round": 2, "by": "edge-0", "node": "client-1", "task": "fedchs.grad", "reason": "deadline"},
           {"round": 3, "by": "edge-1", "node": "client-1", "task": "fedchs.grad", "reason": "deadline"}]


def finished(folder: Path, n: int = 3, total: int = 3, interrupted: bool = False, **extra: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    res = {"spec": spec(total), "engine": "inprocess", "wall_s": 1.5 * n, "interrupted": interrupted,
           "rounds": rounds(n), "links": LINKS, "missing": MISSING,
           "totals": {"messages": 3, "payload_bytes": 3000, "message_bytes": 3300}, **extra}
    (folder / "results.json").write_text(json.dumps(res))
    return folder


def journal(folder: Path, n: int, tail: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({k: v for k, v in r.items() if not k.startswith("cum_")}) + "\n" for r in rounds(n))
    (folder / "rounds.jsonl").write_text(lines + tail)
    return folder


def marker(folder: Path, **fields: Any) -> None:
    data = {"pid": os.getpid(), "proc_start": browse._proc_start(os.getpid()), "host": browse.socket.gethostname(),
            "url": "http://127.0.0.1:8123/", "engine": "network", "started": NOW - 60, "run_id": "toy-1",
            "spec": spec(5), "totals": {"messages": 2, "payload_bytes": 2500, "message_bytes": 2600},
            "ended": None, "ok": None, "error": None, **fields}
    (folder / "live.json").write_text(json.dumps(data))


def test_a_finished_run_reads_as_ls_shows_it(tmp_path: Path) -> None:
    run = read_folder(finished(tmp_path / "runs" / "20261126-010203-toy-simulate"), tmp_path / "runs").info
    assert (run.name, run.status, run.algorithm, run.engine) == ("20261126-010203-toy-simulate", "finished",
                                                                   "fedchs", "inprocess")
    assert (run.rounds_done, run.rounds_total, run.accuracy, run.payload_bytes) == (3, 3, 0.8, 3000)
    assert run.duration_s == 4.5 and run.url is None
    assert run.started == time.mktime((2026, 11, 26, 1, 2, 3, 0, 0, -1))  # from the folder's name


@pytest.mark.parametrize(("make", "status", "why"), [
    (lambda f: finished(f, interrupted=True, n=2), "interrupted", "interrupted"),
    (lambda f: finished(f, n=2), "failed", "rounds up to 2 of 3"),
    (lambda f: (finished(f), marker(f, ended=NOW, ok=False, error="RoundFailed: too few replies")), "failed",
     "too few"),
    (lambda f: (finished(f), marker(f, ended=NOW, ok=True)), "finished", "results.json written"),
    (lambda f: (journal(f, 2), marker(f)), "running", "is alive"),
    (lambda f: (journal(f, 2), marker(f, proc_start=-1)), "failed", "is gone"),  # this pid, another process
    (lambda f: (journal(f, 2), marker(f, pid=2 ** 22 + 12345)), "failed", "is gone"),
    (lambda f: (journal(f, 2), marker(f, pid=2 ** 22 + 12345, ok=False, ended=NOW, error="boom")), "failed",
     "boom"),
])
def test_status_rule(tmp_path: Path, make, status: str, why: str) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    make(folder)
    info = read_folder(folder, now=NOW).info
    assert info.status == status and why in info.why, info.why


def test_a_resumed_run_is_running_although_its_old_results_are_there(tmp_path: Path) -> None:
    folder = finished(tmp_path / "run", n=2, total=5, interrupted=True)  # Ctrl-C after round 2 ...
    journal(folder, 3)  # ... then `launch --resume`: the journal goes on, results.json stays until the end
    written = (folder / "results.json").stat().st_mtime
    marker(folder, started=written + 1)
    info = read_folder(folder).info
    assert (info.status, info.rounds_done, info.payload_bytes) == ("running", 3, 2500)
    assert "resumed" in info.why
    marker(folder, started=written - 1)  # a process that started before the results were written: not a resume
    assert read_folder(folder).info.status == "interrupted"


def test_a_running_run_reports_its_page_and_bytes_so_far(tmp_path: Path) -> None:
    folder = journal(tmp_path / "run", 2)
    marker(folder)
    info = read_folder(folder, now=NOW).info
    assert (info.status, info.rounds_done, info.rounds_total) == ("running", 2, 5)
    assert (info.url, info.run_id, info.payload_bytes) == ("http://127.0.0.1:8123/", "toy-1", 2500)
    assert info.duration_s == pytest.approx(60.0)


def test_a_held_run_folder_lock_means_running(tmp_path: Path) -> None:
    """Where the command running a folder holds an exclusive flock on its .fedhop.lock, that decides (read from
    /proc/locks: looking takes no lock)."""
    import fcntl

    folder = journal(tmp_path / "run", 2)
    (folder / browse.LOCK_FILE).write_text("")
    old = time.time() - 3600
    for p in (folder / "rounds.jsonl", folder):
        os.utime(p, (old, old))
    assert read_folder(folder).info.status == "failed"  # an old folder, its lock file free
    fd = os.open(folder / browse.LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        info = read_folder(folder).info
        assert info.status == "running" and f"process {os.getpid()} holds its lock" in info.why
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # still ours alone: looking took no lock
    finally:
        os.close(fd)
    assert read_folder(folder).info.status == "failed"


def test_without_a_marker_the_files_age_decides(tmp_path: Path) -> None:
    folder = journal(tmp_path / "run", 2, tail='{"round": 3, "accur')  # a line cut short: skipped
    now = time.time()
    assert read_folder(folder, now=now).info.status == "running"
    assert read_folder(folder, now=now).info.rounds_done == 2
    for p in (folder / "rounds.jsonl", folder):
        os.utime(p, (now - 3600, now - 3600))
    info = read_folder(folder, now=now).info
    assert info.status == "failed" and "not changed for 3600s" in info.why
    assert info.algorithm is None and info.rounds_total is None  # nothing says what it was


def test_find_runs_skips_other_folders_and_does_not_enter_runs(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    finished(root / "a")
    (root / "a" / "checkpoints" / "inner").mkdir(parents=True)
    (root / "a" / "checkpoints" / "inner" / "results.json").write_text("{}")
    journal(root / "sweep" / "b", 1)
    (root / "20261126-compare").mkdir()
    (root / "20261126-compare" / "table.md").write_text("|")
    assert [p.relative_to(root).as_posix() for p in find_runs(root)] == ["a", "sweep/b"]
    assert [i.name for i in list_runs(root)] == ["a", "sweep/b"]
    assert find_runs(root / "a") == [root / "a"]
    with pytest.raises(RunNotFound, match="not a folder of runs"):
        list_runs(tmp_path / "nope")


def test_resolve_run_by_path_name_or_unique_part(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    a = finished(root / "20261126-010203-fedchs-simulate")
    b = finished(root / "20261126-020304-fedavg-simulate")
    assert browse.resolve_run(str(a), root) == a
    assert browse.resolve_run("20261126-020304-fedavg-simulate", root) == b
    assert browse.resolve_run("fedavg", root) == b
    with pytest.raises(RunNotFound, match="matches 2 runs"):
        browse.resolve_run("simulate", root)
    with pytest.raises(RunNotFound, match="fedhop ls"):
        browse.resolve_run("fedprox", root)
    with pytest.raises(RunNotFound, match="not a run folder"):
        browse.resolve_run(str(tmp_path), root)


def test_live_marker_follows_the_events(tmp_path: Path) -> None:
    t = [100.0]
    m = LiveMarker(tmp_path, url="http://127.0.0.1:1/", engine="inprocess", clock=lambda: t[0])
    first = json.loads((tmp_path / "live.json").read_text())
    assert first["pid"] == os.getpid() and first["started"] == 100.0 and first["run_id"] is None
    m("run_started", {"run_id": "r-9", "spec": spec(), "nodes": [], "resumed_at": 0})
    m("links", {"rows": LINKS[:1]})  # within MARKER_EVERY_S of the last write: kept for later
    assert json.loads((tmp_path / "live.json").read_text())["totals"] is None
    t[0] += browse.MARKER_EVERY_S
    m("links", {"rows": LINKS})
    assert json.loads((tmp_path / "live.json").read_text())["totals"]["payload_bytes"] == 3000
    t[0] = 130.0
    m("run_finished", {"ok": False, "wall_s": 3.0, "error": "RoundFailed: no"})
    got = json.loads((tmp_path / "live.json").read_text())
    assert (got["run_id"], got["ended"], got["ok"], got["error"]) == ("r-9", 130.0, False, "RoundFailed: no")
    assert got["url"] == "http://127.0.0.1:1/" and "token" not in json.dumps(got)


def test_formats() -> None:
    assert [fmt_bytes(n) for n in (None, 0, 999, 1000, 12_345, 923_520, 45_600_000, 7.2e12)] == \
        ["–", "0 B", "999 B", "1 kB", "12.3 kB", "924 kB", "45.6 MB", "7.2 TB"]
    assert [fmt_duration(s) for s in (None, 0.04, 59.94, 61, 3725)] == ["–", "0.0s", "59.9s", "1m 01s", "1h 02m"]


def test_ls_and_show_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    finished(root / "20261126-010203-toy-simulate")
    journal(root / "20261126-020304-toy-launch", 2)
    marker(root / "20261126-020304-toy-launch")
    assert main(["ls", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUN", "ALGORITHM", "STATUS", "ROUNDS", "ACCURACY", "PAYLOAD", "DURATION"]
    assert lines[1].split() == ["20261126-010203-toy-simulate", "fedchs", "finished", "3/3", "0.8000", "3", "kB",
                                "4.5s"]
    assert lines[2].split()[:5] == ["20261126-020304-toy-launch", "fedchs", "running", "2/5", "0.7000"]
    assert main(["ls", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["status"], r["payload_bytes"]) for r in rows] == [("finished", 3000), ("running", 2500)]

    assert main(["show", "toy-simulate", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "status    finished" in out and "payload 3 kB (3,000 B)" in out
    assert "client<->edge 1.5 kB, edge<->PS 1.5 kB" in out
    assert "edge-1 (r1) -> edge-0 (r2) -> edge-1 (r3)" in out  # the route
    assert "missing participants: 2 entries, 1 nodes" in out and "client-1: rounds 2, 3" in out
    assert main(["show", str(root / "20261126-010203-toy-simulate"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert sum(x["payload_bytes"] for x in shown["links"]) == 3000 and len(shown["missing"]) == 2
    assert [s["nodes"] for s in shown["route"]] == [["edge-1"], ["edge-0"], ["edge-1"]]

    assert main(["show", "launch", "--runs-dir", str(root)]) == 0
    assert "bytes per link: written when the run ends (live: http://127.0.0.1:8123/)" in capsys.readouterr().out
    assert main(["show", "nothing", "--runs-dir", str(root)]) == 2
    assert "no run folder 'nothing'" in capsys.readouterr().err
    assert main(["ls", str(tmp_path / "absent")]) == 2


# -- a folder written by a real (tiny) in-process run --------------------------------------------------------------

@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    from fedhop.common.engine.events import RunEvents
    from fedhop.common.engine.inprocess import FaultPlan
    from fedhop.common.engine.results import write_run_folder
    from fedhop.server.web.live import simulate
    from fedhop.server.web.status import RunStatus
    from tests.unit.test_fedchs import spec as fedchs_spec

    folder = tmp_path_factory.mktemp("runs") / "fedchs-run"
    folder.mkdir()
    events, live = RunEvents(), RunStatus()
    events.subscribe(live)
    events.subscribe(LiveMarker(folder, engine="inprocess"))
    faults = FaultPlan(lambda node, task, rnd: node in ("client-0", "client-2", "client-4") and rnd == 1)
    result = simulate(fedchs_spec({"K": 2}, clients=6, edges=3, rounds=3), events, journal=folder / "rounds.jsonl",
                      run_id="sim-1", faults=faults)
    write_run_folder(result, folder)
    return folder, result, live


def test_ls_of_a_simulated_run_matches_its_results(simulated: tuple[Path, Any, Any]) -> None:
    folder, result, _ = simulated
    info = read_folder(folder, folder.parent).info
    res = json.loads((folder / "results.json").read_text())
    assert (info.status, info.run_id, info.rounds_done, info.rounds_total) == ("finished", "sim-1", 3, 3)
    assert info.payload_bytes == res["totals"]["payload_bytes"] == sum(r["payload_bytes"] for r in result.links)
    assert info.accuracy == result.rounds[-1]["accuracy"] and info.duration_s == result.wall_s


def test_the_page_rebuilt_from_the_folder_is_the_live_one(simulated: tuple[Path, Any, Any]) -> None:
    """FolderStatus replays the folder's files as events: the API answers what the live page answered."""
    from fedhop.server.web.browse import FolderStatus

    folder, _, live = simulated
    page = FolderStatus(read_folder(folder, folder.parent))
    strip = ("duration_s", "elapsed_s")  # wall-clock metadata: the files round it to the microsecond
    assert [{k: v for k, v in r.items() if k not in strip} for r in page.rounds()] == \
        [{k: v for k, v in r.items() if k not in strip} for r in live.rounds()]
    assert page.links() == live.links()
    assert page.topology() == live.topology()
    assert page.missing() == live.missing() and page.missing()
    # the timeline: timeline.csv's rows (the end's, which may add to what each round's event said), 0-based
    from fedhop.common.timeline import read_csv

    assert page.timeline()["rows"] == [{**r, "round": r["round"] - 1} for r in read_csv(folder / "timeline.csv")]
    key = ("round", "node", "peer", "phase")
    assert {tuple(r[k] for k in key) for r in live.timeline()["rows"]} <= \
        {tuple(r[k] for k in key) for r in page.timeline()["rows"]}
    mine, ref = page.status(), live.status()
    for key in ("run_id", "name", "algorithm", "rounds_completed", "rounds_total", "last", "nodes", "spec"):
        assert mine[key] == ref[key], key
    assert (mine["phase"], mine["source"], mine["folder"]) == ("finished", "folder", "fedchs-run")



def test_the_commands_web_start_writes_live_json(tmp_path: Path) -> None:
    """The command line's wiring (simulate, launch, server): start_web subscribes a LiveMarker to the run's events."""
    from fedhop.cli.console import HttpArgs, start_web

    page = start_web(HttpArgs(), tmp_path, "inprocess")
    try:
        page.events.emit("run_started", run_id="r-2", spec=spec(), nodes=[], resumed_at=0)
        page.events.emit("run_finished", ok=True, wall_s=1.0, error=None)
    finally:
        page.close()
    live = json.loads((tmp_path / "live.json").read_text())
    assert (live["pid"], live["engine"], live["run_id"], live["ok"], live["url"]) == \
        (os.getpid(), "inprocess", "r-2", True, None)


def test_a_folder_whose_spec_this_fedhop_cannot_read_still_shows_its_rounds(tmp_path: Path) -> None:
    from fedhop.server.web.browse import FolderStatus

    folder = finished(tmp_path / "run")
    res = json.loads((folder / "results.json").read_text())
    res["spec"]["algorithm"]["name"] = "not-an-algorithm"
    (folder / "results.json").write_text(json.dumps(res))
    page = FolderStatus(read_folder(folder))
    st = page.status()
    assert (st["phase"], st["algorithm"], st["rounds_completed"], st["rounds_total"]) == \
        ("finished", "not-an-algorithm", 3, 3)
    assert [r["accuracy"] for r in page.rounds()] == [r["accuracy"] for r in rounds(3)]


def test_simulate_writes_live_json_that_ls_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fedhop simulate`` leaves live.json: this process, the run's id and spec, how it ended."""
    from tests.unit.test_cli import SMALL

    out = tmp_path / "runs" / "sim"
    assert main(["simulate", "--out", str(out), *SMALL]) == 0
    capsys.readouterr()
    live = json.loads((out / "live.json").read_text())
    assert (live["pid"], live["engine"], live["ok"], live["url"]) == (os.getpid(), "inprocess", True, None)
    assert live["run_id"] and live["spec"]["rounds"] == 3 and live["ended"] >= live["started"]
    info = read_folder(out, out.parent).info
    assert (info.status, info.run_id, info.rounds_done, info.engine) == ("finished", live["run_id"], 3, "inprocess")
