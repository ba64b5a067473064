"""The chaos soak (issue 20): a seeded schedule of faults during a Fed-CHS, a FOCUS and a FedAvg-through-edges run,
every process real (``fedhop server`` / ``edge`` / ``client`` / ``clients`` hosts on 127.0.0.1), with the
invariants checked after every round.

Faults, one at each round boundary (the PS held at its test gate after round r, ``common/testhooks.py``):

* ``kill-ps``: SIGKILL the PS, then ``fedhop server --resume RUN``: the run goes on from its checkpoint.
* ``stop-ps``: SIGSTOP the PS until every child noticed the silence and dials again (their ``rejoining`` mark),
  then SIGCONT.
* ``kill-edge`` / ``kill-client`` / ``kill-host``: SIGKILL an edge, a client, a client host (``fedhop clients``
  serving two ids), then start it again with the same ids and ``--state-dir``: it restores its state.
* ``kill-client-nostate`` (FOCUS): the same, restarted without its state (its state folder moved aside): it is
  left out, ``lost state`` in the missing log, never silently used.
* ``stop-edge`` / ``stop-client``: SIGSTOP a node for the next round (it misses the round's deadline), SIGCONT
  once that round ended.

After every round (read from the run folder: ``rounds.jsonl``, the PS's newest checkpoint with its byte rows and
missing log, the nodes' state folders): the rounds 1..r each once; the checkpoint of round r; every byte row of
an earlier round kept with its bytes (a dead node's rows too); every missing row with its reason; FOCUS's
y = sum_i g_i. At the end: the PS and every process still running exit 0 (``common/exit_codes.py``), every round
recorded, the model written and finite, Fed-CHS's model never re-sent by the PS (it is never lost in a hand-off).

The schedule is drawn from a seed, printed: ``FEDHOP_CHAOS_SEED=N`` replays it (default 20; ``random`` draws one).
Waits are on states (gates, marks, the PS's status API, process exits), never on sleeps or log text.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhop.client_ids import format_ids, parse_ids
from fedhop.common.engine.run_checkpoint import load_latest, ps_store
from fedhop.common.engine.state_log import StateLog
from fedhop.common.exit_codes import ExitCode
from fedhop.common.spec import RunSpec
from fedhop.common.wire.bundle import flat
from fedhop.common.wire.control import CONTROL_KINDS
from fedhop.launch import role_cmd
from tests.integration.netutil import Federation, load_result, small_spec
from tests.waiting import exited, wait_until

ROUNDS = 6
TIMEOUT_S = 120.0  # the longest any one awaited state may take on a busy 2-core machine
TRANSPORT = {"round_deadline_s": 15.0, "rpc_timeout_s": 5.0, "rejoin_grace_s": 60.0, "keepalive_s": 0.5,
             "keepalive_timeout_s": 3.0, "drop_after_missed": 0, "join_timeout_s": 90.0}

# the runs: (algorithm, shape, the faults the schedule draws from)
RUNS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "fedchs": (dict(algorithm="fedchs", clients=4, edges=3, edge_graph="complete"),
               ("kill-ps", "stop-ps", "kill-edge", "kill-client", "kill-host", "stop-client")),
    "focus": (dict(algorithm="focus", clients=5, edges=0,
                   options={"participation": {"kind": "bernoulli", "p": [0.9, 0.8, 0.7, 0.9, 0.8]}}),
              ("kill-ps", "stop-ps", "kill-client", "kill-host", "kill-client-nostate", "stop-client")),
    "fedavg-edges": (dict(algorithm="fedavg", clients=4, edges=2),
                     ("kill-ps", "stop-ps", "kill-edge", "stop-edge", "kill-client", "kill-host")),
}
STOPS = ("stop-edge", "stop-client")  # they last a whole round: not at the last boundary


def chaos_seed() -> int:
    raw = os.environ.get("FEDHOP_CHAOS_SEED", "20")
    return random.SystemRandom().randrange(1 << 31) if raw == "random" else int(raw)


@dataclass(frozen=True)
class Fault:
    after_round: int  # 1-based: applied while the PS waits at its gate after this round
    kind: str
    node: str = ""  # the node (a client host: its id list) it hits; "" for the PS


def schedule(seed: int, run: str, kinds: tuple[str, ...], rounds: int) -> list[str]:
    """One fault kind per round boundary 1..rounds-1: each of ``kinds`` at most once, ``kill-ps`` always, no
    stop at the last boundary (its round would be the last)."""
    rng = random.Random(f"{seed}/{run}")
    boundaries = rounds - 1
    while True:
        picked = rng.sample(kinds, k=boundaries)
        if "kill-ps" in picked and picked[-1] not in STOPS:
            return picked


@dataclass
class Soak:
    """One run under chaos: the federation (clients of one parent partly in a ``fedhop clients`` host of two ids)
    and what the invariants remember between rounds."""

    name: str
    spec: RunSpec
    tmp: Path
    fed: Federation = field(init=False)
    host: str = field(init=False)
    singles: list[str] = field(init=False)
    lost_state: dict[str, Path] = field(default_factory=dict)  # a client restarted without state: its old state
    restarted_without_state: dict[str, int] = field(default_factory=dict)  # ... and the round after which
    earlier_rows: dict[tuple, int] = field(default_factory=dict)  # byte rows of the rounds checked so far
    killed_rows: dict[str, dict[tuple, int]] = field(default_factory=dict)  # a killed node's rows before its kill

    def __post_init__(self) -> None:
        from fedhop.common.topology import build_topology

        topo = build_topology(self.spec.topology, self.spec.seed)
        by_parent: dict[str, list[str]] = {}
        for c in topo.clients:
            by_parent.setdefault(topo.parent[c], []).append(c)
        group = next(ids for ids in by_parent.values() if len(ids) >= 2)[:2]
        self.host = format_ids(group)
        self.singles = [c for c in topo.clients if c not in group]
        self.fed = Federation(self.spec, self.tmp, hold=tuple(group), state_dir=self.tmp / "state",
                              holds=tuple(range(1, self.spec.rounds)))
        self.start_clients(self.host)

    # processes ---------------------------------------------------------------------------------------------

    def start_clients(self, name: str, *, state: bool = True) -> None:
        """Start the client (or client host, ``name`` an id list) ``name`` with its parent's address."""
        ids = parse_ids(name)
        role = "clients" if len(ids) > 1 else "client"
        parent = self.fed.topology.parent[ids[0]]
        self.fed.procs.start(name, role_cmd(role, name, self.fed.addr[parent], device="cpu",
                                            state_dir=self.fed.state_dir if state else None,
                                            extra=self.fed.security))

    def ready_count(self, node: str) -> int:
        parent = self.fed.topology.parent[node]
        return self.fed.seen(f"ready-{parent}-{node}") + self.fed.seen(f"ready-refused-{parent}-{node}")

    def killed(self, name: str) -> None:
        """SIGKILL ``name`` and wait until it is gone (reaped); remember its byte rows so far."""
        proc = self.fed.procs.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        ids = parse_ids(name) if name.startswith("client-") else [name]
        for node in ids:
            self.killed_rows[node] = {k: v for k, v in self.earlier_rows.items() if node in (k[0], k[1])}

    def restart(self, name: str, r: int, *, state: bool = True) -> None:
        """Start ``name`` again (same ids) after round ``r`` and wait until its parent had a Ready (or a refusal)
        from each id. With its state: each id restored the state it had saved (from disk), or, under a resumed
        PS, rolled back to before round r + 1, the first one the PS has not committed."""
        ids = parse_ids(name) if name.startswith("client-") else [name]
        before = {n: self.ready_count(n) for n in ids}
        had_state = {n: any((self.fed.state_dir / n).glob("*")) for n in ids}
        for n in ids:  # the PS saw its child go (its next task waits for it, transport.rejoin_grace_s)
            if self.fed.topology.parent[n] == "ps":
                self.fed.wait_lost(n, timeout=TIMEOUT_S)
        if name.startswith("edge-"):
            self.fed.start_node(name)
        else:
            self.start_clients(name, state=state)
        for n in ids:
            wait_until(lambda n=n: self.ready_count(n) > before[n], f"{n} to say Ready again", timeout=TIMEOUT_S,
                       stop_if=exited(self.fed.procs.procs[name], name), details=self.fed.all_logs)
        if not state:
            return
        log = self.fed.log_of(name)
        for n in ids:
            said = re.search(rf"{n}: state (restored|rolled back to before round (\d+)) \((disk|fresh)", log)
            if said is None:  # a node whose algorithm keeps no state saves none and restores none
                assert not had_state[n], f"{n} restarted after round {r} said nothing of its state:\n{log[-3000:]}"
                continue
            assert said.group(2) is None or int(said.group(2)) == r + 1, (n, r, said.group(0))
            assert not had_state[n] or said.group(3) == "disk", (n, said.group(0))

    # faults ------------------------------------------------------------------------------------------------

    def apply(self, r: int, kind: str, rng: random.Random) -> Fault:
        """Apply fault ``kind`` while the PS waits after round ``r``; let the PS go on. Returns what was done."""
        fed = self.fed
        if kind == "kill-ps":
            fed.ps.send_signal(signal.SIGKILL)
            fed.ps.wait(30)
            fed.go(r)
            fed.restart_ps(name=f"ps-resumed-{r}")
            return Fault(r, kind)
        if kind == "stop-ps":
            children = [n for n, p in fed.topology.parent.items() if p == "ps"]
            marks = {n: fed.seen(f"rejoining-{n}") for n in children}
            fed.ps.send_signal(signal.SIGSTOP)
            fed.go(r)
            try:
                for n in children:  # the silence was noticed: each child dials again (the fault's length)
                    wait_until(lambda n=n: fed.seen(f"rejoining-{n}") > marks[n], f"{n} to notice the stopped PS",
                               timeout=TIMEOUT_S, details=fed.all_logs)
            finally:
                fed.ps.send_signal(signal.SIGCONT)
            return Fault(r, kind)
        if kind in ("kill-edge", "stop-edge"):
            node = rng.choice(list(fed.topology.edges))
        elif kind == "kill-host":
            node = self.host
        else:  # a client process of its own, not one already left out
            node = rng.choice([c for c in self.singles if c not in self.lost_state])
        if kind.startswith("stop-"):
            proc = fed.procs.procs[node]
            proc.send_signal(signal.SIGSTOP)
            fed.go(r)
            try:  # stopped for the whole next round: it misses the round's deadline
                wait_until((fed.gates / f"at-{r + 1}").exists, f"round {r + 1} to end with {node} stopped",
                           timeout=TIMEOUT_S, stop_if=exited(fed.ps, "the PS"), details=fed.all_logs)
            finally:
                proc.send_signal(signal.SIGCONT)
            return Fault(r, kind, node)
        self.killed(node)
        if kind == "kill-client-nostate":
            aside = self.tmp / f"lost-state-{node}"
            shutil.move(self.fed.state_dir / node, aside)
            self.lost_state[node] = aside
            self.restarted_without_state[node] = r
            self.restart(node, r, state=False)
        else:
            self.restart(node, r)
        fed.go(r)
        return Fault(r, kind, node)

    # invariants --------------------------------------------------------------------------------------------

    def check_round(self, r: int) -> None:
        """The invariants after round ``r`` (1-based), read from the run folder while the PS waits at its gate."""
        out = self.fed.out
        rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line.strip()]
        assert [row["round"] for row in rows] == list(range(1, r + 1)), f"rounds.jsonl after round {r}: {rows}"
        loaded, ck = load_latest(ps_store(out))
        assert loaded.tag == r - 1, f"the newest checkpoint is of round {loaded.tag + 1}, not {r}"
        assert len(ck.records) == r
        for m in ck.missing:
            assert m.get("reason"), f"a missing row without its reason: {m}"
        for node, since in self.restarted_without_state.items():  # left out, with the reason, since its restart
            assert all("lost state" in m["reason"] for m in ck.missing if m["node"] == node and m["round"] > since), \
                ck.missing
        now = payload_rows(ck.meter)
        gone = {k: v for k, v in self.earlier_rows.items() if now.get(k) != v}
        assert not gone, f"byte rows of earlier rounds changed or lost after round {r}: {gone}"
        self.earlier_rows = {k: v for k, v in now.items() if 0 <= k[4] < r - 1}  # rounds before r: complete
        if self.spec.algorithm.name == "focus":
            self.check_tracking(ck.state, ck.last_ok)

    def check_tracking(self, state: Any, last_ok: dict[str, int]) -> None:
        """FOCUS: y (the PS's newest checkpoint) equals the sum of every client's g_i as of its last reply the PS
        used (``last_ok``; a client's newer state, from a task whose reply came late, is rolled back at its next
        task; a client left out for lost state: the state it had, moved aside)."""
        y = flat(state.y).double()
        total = torch.zeros_like(y)
        for c in self.fed.topology.clients:
            if c not in last_ok:
                continue  # no reply of it was ever used: nothing of it in y
            st = StateLog(self.lost_state.get(c, self.fed.state_dir / c))
            got = st.latest(below=last_ok[c] + 1)
            if got is None or got.tag != last_ok[c]:
                print(f"[chaos] {self.name}: y = sum g_i not checked: {c}'s state of round {last_ok[c] + 1} "
                      f"(its last used reply) is no longer kept ({st.tags()})")
                return
            snap = got.state
            if snap.state.g is not None:
                total += flat(snap.state.g).double()
        assert float((y - total).norm() / max(float(total.norm()), 1e-30)) < 1e-9, "FOCUS: y != sum_i g_i"


def payload_rows(meter: list[dict[str, Any]]) -> dict[tuple, int]:
    """Payload bytes per (src, dst, kind, phase, round) of the task traffic."""
    out: dict[tuple, int] = {}
    for row in meter:
        if row["kind"] in CONTROL_KINDS or row["kind"] == "wire":
            continue
        k = (row["src"], row["dst"], row["kind"], row["phase"], row["round"])
        out[k] = out.get(k, 0) + row["payload_bytes"]
    return out


@pytest.mark.parametrize("run", list(RUNS))
def test_chaos_soak(run: str, tmp_path: Path, monkeypatch) -> None:
    seed = chaos_seed()
    shape, kinds = RUNS[run]
    kinds_drawn = schedule(seed, run, kinds, ROUNDS)
    print(f"\n[chaos] {run}: seed {seed} (FEDHOP_CHAOS_SEED={seed} replays it): {', '.join(kinds_drawn)}")
    spec = small_spec(rounds=ROUNDS, transport=TRANSPORT, **shape)
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"dtype": "float64"})})  # y = sum g_i
    gates = tmp_path / "gate"
    gates.mkdir()
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(gates))
    soak = Soak(run, spec, tmp_path)
    fed = soak.fed
    rng = random.Random(f"{seed}/{run}/nodes")
    done: list[Fault] = []
    try:
        for r, kind in enumerate(kinds_drawn, start=1):
            fed.wait_round(r, TIMEOUT_S)
            soak.check_round(r)
            done.append(soak.apply(r, kind, rng))
            print(f"[chaos] {run}: after round {r}: {kind} {done[-1].node}".rstrip())
        rc = fed.wait(TIMEOUT_S)
        codes = fed.exit_codes(60)
    finally:
        fed.close()
    context = f"seed {seed}, faults {done}:\n{fed.all_logs()}"
    assert rc == ExitCode.OK, context
    replaced = {f"ps-resumed-{f.after_round}" for f in done if f.kind == "kill-ps"}
    last_ps = max(replaced, key=lambda n: int(n.rsplit("-", 1)[1]))
    bad = {n: c for n, c in codes.items() if c != 0 and not (n == "ps" or (n in replaced and n != last_ps))}
    # a process replaced by its restart is not in codes (the same name now means the new one); every process
    # running at the end exits 0
    assert not bad, (bad, context)
    res, final = load_result(fed.out)
    assert [row["round"] for row in res["rounds"]] == list(range(1, ROUNDS + 1)), context
    assert all(torch.isfinite(v).all() for v in final.values()), context
    kept = payload_rows([{**row, "round": row["round"] - 1} for row in res["links"]])  # the folder counts from 1
    for node, rows in soak.killed_rows.items():  # a dead node's byte rows are kept to the end
        assert all(kept.get(k) == v for k, v in rows.items()), (node, rows, context)
    for f in done:  # a client back without its state is never used again: no reply from it after its restart
        if f.kind == "kill-client-nostate":
            used = [row for row in res["links"] if row["src"] == f.node and row["phase"] == "reply"
                    and row["round"] > f.after_round and row["kind"] not in CONTROL_KINDS and row["kind"] != "wire"]
            assert not used, (f, used, context)
    if run == "fedchs":  # the model travels edge to edge: never lost, so never re-sent from the PS
        ps_payload = {row["kind"] for row in res["links"] if "ps" in (row["src"], row["dst"])
                      and row["payload_bytes"] > 0}
        assert ps_payload <= {"fedchs.collect"}, (ps_payload, context)
