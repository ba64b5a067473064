"""``timeline.csv`` (issue 17 section 3): a plain ``fedhop launch`` and ``fedhop simulate`` write where each
round's time went, for every node and link, and the summary names the slowest link and node."""

from __future__ import annotations

import contextlib
import io
import json
from collections import defaultdict
from pathlib import Path

from fedhop.cli import main
from fedhop.common.spec import RunSpec
from fedhop.common.timeline import read_csv
from fedhop.common.topology import build_topology
from tests.integration.netutil import logs, small_spec

ROUNDS = 2


def run_cli(command: str, spec: RunSpec, tmp: Path) -> tuple[Path, str]:
    spec_file = tmp / "spec.toml"
    spec_file.write_text(spec.to_toml())
    out = tmp / command
    printed, err = io.StringIO(), io.StringIO()
    # the command line's main in this process (a launch's children are processes): no new interpreter per run
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(err):
        code = main([command, str(spec_file), "--out", str(out), "--device", "cpu", "--quiet"])
    assert code == 0, f"{command} failed ({code}):\n{printed.getvalue()}\n{err.getvalue()}\n" + \
        (logs(out) if command == "launch" else "")
    return out, printed.getvalue()


def check_timeline(out: Path, spec: RunSpec, printed: str) -> list[dict]:
    rows = read_csv(out / "timeline.csv")
    topo = build_topology(spec.topology, spec.seed)
    rounds = list(range(1, ROUNDS + 1))  # 1-based, as in rounds.csv
    # every node computed in every round, every parent waited, every tree link carried both ways
    for t in rounds:
        mine = [r for r in rows if r["round"] == t]
        assert {r["node"] for r in mine if r["phase"] == "compute"} == set(topo.all_nodes()), t
        assert {r["node"] for r in mine if r["phase"] == "encode"} == set(topo.all_nodes()), t
        assert {r["node"] for r in mine if r["phase"] == "wait"} == {topo.server, *topo.edges}, t
        links = {(r["node"], r["peer"]) for r in mine if r["phase"] == "transfer"}
        assert links == {(p, c) for p in (topo.server, *topo.edges) for c in topo.children(p)}, t
    # plausible: no negative time; a node's own phases, and each link's transfer, fit in the PS's round
    duration = {r["round"]: r["seconds"] for r in rows if r["phase"] == "round" and r["node"] == topo.server}
    assert sorted(t for t in duration if t >= 1) == rounds
    own: defaultdict[tuple[int, str], float] = defaultdict(float)
    for r in rows:
        assert r["seconds"] >= 0, r
        if r["phase"] in ("compute", "encode", "wait") and r["round"] in duration:
            own[(r["round"], r["node"])] += r["seconds"]
        if r["phase"] == "transfer" and r["round"] in duration:
            assert r["seconds"] <= duration[r["round"]] + 1e-3, r
    for (t, node), s in own.items():
        if node in (topo.server, *topo.edges):  # a client's result encode is after its parent's clock started
            assert s <= duration[t] + 1e-3, (t, node, s, duration[t])
    assert sum(r["seconds"] for r in rows if r["phase"] == "compute") > 0
    assert "slowest link" in printed and "slowest node" in printed
    return rows


def test_launch_and_simulate_write_the_timeline(tmp_path: Path) -> None:
    spec = small_spec("fedavg", clients=4, edges=2, rounds=ROUNDS)
    out, printed = run_cli("launch", spec, tmp_path)
    net = check_timeline(out, spec, printed)
    assert json.loads((out / "results.json").read_text())["rounds"]
    out, printed = run_cli("simulate", spec, tmp_path)
    local = check_timeline(out, spec, printed)
    # the engines time the same points: the same (round, node, peer, phase) rows
    keys = {(r["round"], r["node"], r["peer"], r["phase"]) for r in local if r["round"] >= 1}
    assert keys == {(r["round"], r["node"], r["peer"], r["phase"]) for r in net if r["round"] >= 1}
