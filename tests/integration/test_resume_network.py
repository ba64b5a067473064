"""Crash-safe runs over real processes: a PS killed and resumed from its checkpoint, a client killed and
restarted with its --state-dir, the active Fed-CHS edge killed. Each resumed run must end bit-identical to
the uninterrupted one (the in-process engine, which the equivalence test holds equal to a networked run)
with the same payload bytes per link.

The test chooses the moment with the PS's gate hook (FEDHOP_TEST_GATE): before round t, if the test made
``stop-<t>``, the PS writes ``at-<t>`` and waits for ``go-<t>``, so a kill lands between two rounds without
any sleep."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from fedhop.cli import main
from fedhop.common.engine.checkpoint import CheckpointStore, read_checkpoint
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.engine.state_log import StateLog
from fedhop.common.exit_codes import ExitCode
from fedhop.common.run_lock import RunFolderLocked
from fedhop.common.wire.bundle import flat
from fedhop.common.wire.control import CONTROL_KINDS
from fedhop.server.main import load_resume, run_server
from tests.integration.netutil import Federation, launch_killed_and_resumed, load_result, small_spec
from tests.waiting import exited, wait_until

CONTROL = CONTROL_KINDS  # reports, session frames and the wire level: network-only, no payload

# one case per shape of PS state and message flow (the in-process resume test covers every algorithm):
# edges that aggregate, an edge walk with hand-offs, a cycle through clusters, stateful clients
CASES = {
    "hierfavg": dict(algorithm="hierfavg", clients=4, edges=2, options={"edge_rounds": 2}),
    "fedchs": dict(algorithm="fedchs", clients=3, edges=3, edge_graph="ring"),
    "fedcluster": dict(algorithm="fedcluster", clients=4, edges=2, edge_graph="complete",
                       options={"participation": 1.0, "local_steps": 2, "batch_size": 16}),
    "focus": dict(algorithm="focus", clients=4, edges=0,
                  options={"participation": {"kind": "bernoulli", "p": [0.9, 0.5, 0.5, 0.2]}}),
    # FOCUS client-initiated (issue 16): the intents the killed PS held are lost; the resumed one kicks every
    # client again, which posts its intents from round 3 on (control only: the payload is the oracle's)
    "focus-client-flow": dict(algorithm="focus", clients=3, edges=0,
                              options={"participation": {"kind": "markov", "p_stay": 0.5}, "decided_by": "client",
                                       "flow": "client", "round_close": {"absent": "say"}}),
}
STATEFUL_CLIENTS = {"scaffold": dict(algorithm="scaffold", clients=3, edges=0, options={"local_steps": 2})}


def wait_file(path: Path, fed: Federation, timeout: float = 180) -> None:
    wait_until(path.exists, path.name, timeout=timeout, stop_if=exited(fed.ps, "the PS"), details=fed.all_logs)


def payload(rows: list[dict], *, redo: bool = False) -> dict[tuple, int]:
    """Payload bytes per (src, dst, kind, phase, round) of the task traffic (``redo``: only redone work)."""
    out: dict[tuple, int] = {}
    for r in rows:
        if r["kind"] in CONTROL or (r["phase"] == "redo") != redo:
            continue
        k = (r["src"], r["dst"], r["kind"], r["phase"], r["round"])
        out[k] = out.get(k, 0) + r["payload_bytes"]
    return out


def assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: tensor {k} differs"


@pytest.fixture
def gate(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "gate"
    folder.mkdir()
    (folder / "stop-2").touch()
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(folder))
    return folder


@pytest.mark.parametrize("case", list(CASES))
def test_ps_killed_and_resumed_is_bit_identical(case: str, tmp_path: Path, gate: Path) -> None:
    spec = small_spec(rounds=4, **CASES[case])
    oracle = InProcessEngine(spec, device="cpu").run()
    fed = Federation(spec, tmp_path)
    try:
        wait_file(gate / "at-2", fed)  # rounds 1 and 2 are done and checkpointed; round 3 not begun
        fed.ps.send_signal(signal.SIGKILL)
        fed.ps.wait(30)
        (gate / "go-2").touch()
        (gate / "stop-2").unlink()  # the resumed PS goes straight on
        fed.restart_ps()
        assert fed.wait(240) == 0, fed.all_logs()
        codes = fed.exit_codes(60)
        assert all(c == 0 for n, c in codes.items() if n not in ("ps", "ps2")), (codes, fed.all_logs())
    finally:
        fed.close()
    assert "resuming run" in fed.log_of("ps2") and "at round 3" in fed.log_of("ps2")
    res, final = load_result(fed.out)
    assert_same_model(final, oracle.final, case)
    assert len(res["rounds"]) == spec.rounds
    assert [r.get("accuracy") for r in res["rounds"]] == [r.get("accuracy") for r in oracle.rounds]
    # every completed round's payload per link, the rounds before the kill included (restored from the
    # checkpoint), equals the uninterrupted run's; nothing was redone (the kill fell between rounds)
    file_rows = [{**r, "round": r["round"] - 1} for r in res["links"]]  # the run folder numbers from 1
    got, want = payload(file_rows), payload(oracle.links)
    if case == "focus-client-flow":  # the resumed PS's kick and the intents posted again: control, no payload
        extra = {k: v for k, v in got.items() if k not in want}
        assert extra and {(k[2], k[4], v) for k, v in extra.items()} <= {("focus.join", 2, 0), ("pull", 2, 0),
                                                                          ("pull", 3, 0)}, extra
        got = {k: v for k, v in got.items() if k in want}
    assert got == want
    assert payload(file_rows, redo=True) == {}


@pytest.mark.parametrize("case", ["focus", "scaffold"])
def test_client_restarted_with_its_state_dir_keeps_the_run_exact(case: str, tmp_path: Path, gate: Path) -> None:
    """Kill a stateful client between rounds and start it again with its --state-dir: it restores g_i
    (FOCUS) / c_i (SCAFFOLD), the PS waits for it (rejoin_grace_s), and the run ends bit-identical. For FOCUS
    the tracking invariant y = sum_i g_i holds, read from the PS's checkpoint and the clients' state files."""
    shape = {**CASES, **STATEFUL_CLIENTS}[case]
    opts = dict(shape["options"])
    spec = small_spec(case, clients=shape["clients"], rounds=4, options=opts,
                      transport={"rejoin_grace_s": 120.0})
    # float64, so that y = sum_i g_i can be checked to 1e-12 (in float32 the two sums round differently)
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"dtype": "float64"})})
    oracle = InProcessEngine(spec, device="cpu").run()
    state = tmp_path / "state"
    fed = Federation(spec, tmp_path, state_dir=state)
    try:
        wait_file(gate / "at-2", fed)
        if case == "focus":
            assert_tracking(fed.out, state, spec.topology.clients)
        fed.procs.kill("client-1")
        fed.wait_lost("client-1", timeout=60)  # the PS saw it go: its next task waits for it
        fed.start_node("client-1")  # same --id and --state-dir
        (gate / "go-2").touch()
        assert fed.wait(240) == 0, fed.all_logs()
    finally:
        fed.close()
    last = max(r["round"] for r in oracle.links if r["src"] == "client-1" and r["phase"] == "reply" and r["round"] < 2)
    assert f"state restored from round {last + 1} (disk)" in fed.log_of("client-1")
    res, final = load_result(fed.out)
    assert res["missing"] == []
    assert_same_model(final, oracle.final, case)
    if case == "focus":
        assert_tracking(fed.out, state, spec.topology.clients)


def assert_tracking(run: Path, state: Path, clients: int) -> None:
    """y (the PS's newest checkpoint) equals the sum of the clients' g_i (their newest saved states)."""
    store = CheckpointStore(run / "checkpoints" / "ps")
    _, ck = read_checkpoint(store.folder / store._name(store.tags()[-1]))
    y = flat(ck.state.y).double()
    total = torch.zeros_like(y)
    for i in range(clients):
        got = StateLog(state / f"client-{i}").latest()
        if got is not None:
            snap = got.state
            if snap.state.g is not None:
                total += flat(snap.state.g).double()
    assert float((y - total).norm() / total.norm()) < 1e-12


def test_client_back_without_its_state_is_left_out_and_said_so(tmp_path: Path, gate: Path) -> None:
    """A FOCUS client restarted WITHOUT its state must not silently rejoin with g_i = 0 (y != sum g_i): the PS
    leaves it out, logs why, and the run finishes with it in the missing log."""
    spec = small_spec("focus", clients=3, rounds=4, transport={"rejoin_grace_s": 120.0})
    fed = Federation(spec, tmp_path)  # no --state-dir: state only in memory
    try:
        wait_file(gate / "at-2", fed)
        fed.procs.kill("client-1")
        fed.wait_lost("client-1", timeout=60)
        fed.start_node("client-1")
        (gate / "go-2").touch()
        assert fed.wait(240) == 0, fed.all_logs()
    finally:
        fed.close()
    res, _ = load_result(fed.out)
    lost = [m for m in res["missing"] if m["node"] == "client-1"]
    assert lost and all("lost state" in m["reason"] for m in lost)
    assert {m["round"] for m in lost} == {3, 4}


def test_client_back_without_its_state_alone_in_a_round_does_not_end_the_run(tmp_path: Path, gate: Path) -> None:
    """Issue 20: the same, with the default rejoin_grace_s and one client drawn per round. A round whose only
    participant is the client left out used to be redone for it and then ended the run (PS exit 1, every
    client 12, no model.pt). A node left out is not a task sent: the round goes on without it (FOCUS steps with
    the y it has), missing.csv says why, and the run ends with exit 0 and its model."""
    spec = small_spec("focus", clients=3, rounds=4, options={"participation": {"kind": "uniform", "m": 1}})
    fed = Federation(spec, tmp_path)
    try:
        wait_file(gate / "at-2", fed)
        fed.procs.kill("client-1")
        fed.wait_lost("client-1", timeout=60)
        fed.start_node("client-1")
        fed.wait_seen("ready-ps-client-1", timeout=60, times=2)  # back (without its state) before round 3
        (gate / "go-2").touch()
        assert fed.wait(240) == 0, fed.all_logs()
    finally:
        fed.close()
    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds and (fed.out / "model.pt").is_file()
    lost = [m for m in res["missing"] if m["node"] == "client-1"]
    assert lost and all("lost state" in m["reason"] for m in lost)
    alone = [r for r in res["rounds"] if r.get("participants") == 1 and r["round"] in {m["round"] for m in lost}]
    assert alone, "the draw must leave client-1 alone in some round after 2 for this test to mean anything"


def test_resume_skips_a_truncated_checkpoint(tmp_path: Path, gate: Path) -> None:
    """The newest PS checkpoint is cut short: the resume names it, uses the previous one, every node rolls
    back one round further (its traffic since counted as redo), and the model is still bit-identical."""
    spec = small_spec("focus", clients=3, rounds=4)
    oracle = InProcessEngine(spec, device="cpu").run()
    fed = Federation(spec, tmp_path)
    try:
        wait_file(gate / "at-2", fed)
        fed.ps.send_signal(signal.SIGKILL)
        fed.ps.wait(30)
        newest = fed.out / "checkpoints" / "ps" / "ckpt_00000001.fhck"
        newest.write_bytes(newest.read_bytes()[:-64])
        (gate / "go-2").touch()
        fed.restart_ps()
        assert fed.wait(240) == 0, fed.all_logs()
    finally:
        fed.close()
    log = fed.log_of("ps2")
    assert "ckpt_00000001.fhck" in log and "truncated" in log and "at round 2" in log
    res, final = load_result(fed.out)
    assert_same_model(final, oracle.final, "focus")
    file_rows = [{**r, "round": r["round"] - 1} for r in res["links"]]
    assert payload(file_rows) == payload(oracle.links)


@pytest.mark.parametrize("flow", ["driven", "exact"])
def test_active_fedchs_edge_killed_the_round_is_redone_elsewhere(flow: str, tmp_path: Path, gate: Path) -> None:
    """The edge that holds the model dies in the middle of round 3 (held by the gate inside its round task,
    the PS waiting for its reply, or, in the exact flow, for its report, which it stops waiting for when the
    edge's session is lost): its predecessor hands its copy again to another neighbour (two-step rule without the
    dead edge), round 3 is redone there and shows the redo, the run finishes, and no model byte crosses a PS link
    except the final collect."""
    spec = small_spec("fedchs", clients=4, edges=4, rounds=5, edge_graph="complete", options={"flow": flow},
                      transport={"round_deadline_s": 60.0, "rpc_timeout_s": 5.0})
    seq = [r["edge"] for r in InProcessEngine(spec, device="cpu").run().rounds]
    victim = seq[2]
    (gate / "stop-2").unlink()
    (gate / f"stop-{victim}-2").touch()  # the victim stops inside its round-3 task
    fed = Federation(spec, tmp_path)
    try:
        wait_file(gate / f"at-{victim}-2", fed)
        fed.procs.kill(victim)
        assert fed.wait(240) == 0, fed.all_logs()
    finally:
        fed.close()
    res, final = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    third = res["rounds"][2]
    assert third["redo"] == f"{victim} failed" and third["edge"] != victim
    assert victim not in [r["edge"] for r in res["rounds"][2:]]
    ps_payload = {r["kind"] for r in res["links"] if "ps" in (r["src"], r["dst"]) and r["payload_bytes"] > 0}
    assert ps_payload <= {"fedchs.collect"}
    assert all(torch.isfinite(v).all() for v in final.values())


def test_fedchs_exact_ps_killed_while_the_walk_waits_is_bit_identical(tmp_path: Path, gate: Path) -> None:
    """Fed-CHS's exact flow has no PS message during training, so a PS crash does not stop the walk by itself:
    an edge runs a posted round only while its session to the PS works, and the post it was given is its state
    (saved before the Ack). Here m(3) holds round 3's model (posted, held by the gate before it runs) when the PS,
    past its round-2 checkpoint, is killed: m(3) waits for the PS, the resumed PS rolls every node back to before
    round 3 (m(3)'s post included), m(3) runs the round and reports it, and the run ends bit-identical to the
    uninterrupted one, with the same payload per link and nothing redone."""
    spec = small_spec(rounds=4, **{**CASES["fedchs"], "options": {"flow": "exact"}})
    oracle = InProcessEngine(spec, device="cpu").run()
    m3 = oracle.rounds[2]["edge"]
    (gate / f"stop-{m3}-2").touch()
    fed = Federation(spec, tmp_path)
    try:
        wait_file(gate / "at-2", fed)  # the PS committed round 2 and waits before round 3
        wait_file(gate / f"at-{m3}-2", fed)  # m(3) holds the model of round 3, not run yet
        fed.ps.send_signal(signal.SIGKILL)
        fed.ps.wait(30)
        wait_until((gate / f"seen-rejoining-{m3}").exists, f"{m3} to notice the PS is gone", timeout=60,
                   details=fed.all_logs)
        (gate / f"go-{m3}-2").touch()  # it may go on now: it waits for the PS instead
        (gate / "go-2").touch()
        (gate / "stop-2").unlink()
        fed.restart_ps()
        assert fed.wait(240) == 0, fed.all_logs()
        codes = fed.exit_codes(60)
        assert all(c == 0 for n, c in codes.items() if n not in ("ps", "ps2")), (codes, fed.all_logs())
    finally:
        fed.close()
    assert "resuming run" in fed.log_of("ps2") and "at round 3" in fed.log_of("ps2")
    res, final = load_result(fed.out)
    assert_same_model(final, oracle.final, "fedchs-exact")
    assert [r["edge"] for r in res["rounds"]] == [r["edge"] for r in oracle.rounds]
    assert not any(r.get("redo") for r in res["rounds"])
    file_rows = [{**r, "round": r["round"] - 1} for r in res["links"]]
    assert payload(file_rows) == payload(oracle.links)
    assert payload(file_rows, redo=True) == {}


def test_gate_holds_only_when_asked(tmp_path: Path, monkeypatch) -> None:
    """The hook returns at once without the variable or without a stop file, and with one it says where it
    stopped and waits for go (the go file exists beforehand here, so a broken gate hangs or skips the at-file)."""
    from fedhop.common.testhooks import gate as hook

    monkeypatch.delenv("FEDHOP_TEST_GATE", raising=False)
    hook("3")
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(tmp_path))
    hook("3")
    assert not (tmp_path / "at-3").exists()
    (tmp_path / "stop-3").touch()
    (tmp_path / "go-3").touch()
    hook("3")
    assert (tmp_path / "at-3").exists()


def test_launch_killed_and_resumed(tmp_path: Path, gate: Path) -> None:
    """`fedhop launch` SIGKILLed between rounds 2 and 3 (PS and all), then `fedhop launch --resume RUN_DIR`: every
    process is started again, restores its state from <run>/state and the PS's checkpoint, and the final model
    is bit-identical to the uninterrupted run."""
    spec = small_spec("focus", clients=3, rounds=4, options={"participation": {"kind": "bernoulli",
                                                                               "p": [0.9, 0.5, 0.5]}})
    oracle = InProcessEngine(spec, device="cpu").run()
    (tmp_path / "spec.toml").write_text(spec.to_toml())
    run = tmp_path / "run"
    first: list[int] = []  # the first launch's pid

    def while_held(proc: subprocess.Popen) -> None:
        first.append(proc.pid)
        second_ps_refused(run, proc.pid)

    again = launch_killed_and_resumed([str(tmp_path / "spec.toml")], run, gate, extra=["--device", "cpu"],
                                      while_held=while_held, resume_here=True)
    assert again.returncode == 0, again.stderr
    assert "resuming run" in again.stderr and "at round 3 of 4" in again.stderr
    _, final = load_result(run)
    assert_same_model(final, oracle.final, "launch --resume")
    assert f"taking over the lock of process {first[0]}" in (run / "logs" / "ps.log").read_text()
    rc, err = fedhop_here(["launch", "--resume", str(run), "--quiet", "--http", "off"])  # the run is finished
    assert rc == ExitCode.ALREADY_FINISHED and "is finished: all 4 rounds are done" in err, err
    assert "round 5" not in err


def fedhop_here(argv: list[str]) -> tuple[int, str]:
    """``fedhop ARGV`` in this process: its exit code and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, err.getvalue()


def second_ps_refused(run: Path, pid: int) -> None:
    """While the first launch's PS (``pid``) holds ``run``: a second PS on it (``launch --resume``, and the PS
    itself, ``run_server``, with the run's checkpoint) is refused at once, naming ``pid``; nothing is written."""
    before = (run / "rounds.jsonl").read_text()
    rc, err = fedhop_here(["launch", "--resume", str(run), "--quiet", "--http", "off"])
    assert rc == ExitCode.USAGE and f"in use by process {pid}" in err, err
    with pytest.raises(RunFolderLocked, match=f"in use by process {pid}"):
        run_server(load_resume(run).spec, "127.0.0.1:0", out=run, resume=load_resume(run))
    assert (run / "rounds.jsonl").read_text() == before
