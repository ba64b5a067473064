"""Faults of issue 6, section 5, over real processes: a node that joins late, a PS that stalls past the
keep-alive and comes back, a PS that dies (every role's exit code says the run did not finish), a stalled
client under an edge (deadlines nest), and a killed edge whose byte rows must survive it."""

from __future__ import annotations

import signal

from fedhop.common.exit_codes import ExitCode
from tests.integration.netutil import Federation, load_result, replies, small_spec


def test_late_client_is_admitted_at_a_round_boundary(tmp_path) -> None:
    """FedAvg without edges: client-2 starts after the run started; the PS admits it at the next round
    boundary and weighs its reply by its data size (unknown when the run started). While it starts, client-0
    is stopped, so that each round lasts its deadline and the run is still going when client-2 arrives (it is
    never dropped for its silence: transport.drop_after_missed = 0)."""
    spec = small_spec("fedavg", clients=3, edges=0, rounds=30, options={"local_steps": 40},
                      transport={"join_timeout_s": 20.0, "round_deadline_s": 2.0, "drop_after_missed": 0})
    fed = Federation(spec, tmp_path, hold=("client-2",), marks=(2,))
    try:
        fed.release_join()
        fed.wait_round(2, timeout=120)
        fed.procs.kill("client-0", signal.SIGSTOP)
        fed.start_node("client-2")
        fed.wait_seen("admitted-ps-client-2", timeout=120)
        fed.procs.kill("client-0", signal.SIGCONT)
        assert fed.wait(180) == 0, fed.all_logs()
        codes = fed.exit_codes(30)
    finally:
        fed.close()
    assert codes == {"ps": 0, "client-0": 0, "client-1": 0, "client-2": 0}, fed.all_logs()
    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    got = replies(res)
    first = min(t for (n, t) in got if n == "client-2")
    assert 2 <= first < spec.rounds - 1, first
    assert all(("client-2", t) in got for t in range(first, spec.rounds)), "once admitted, it takes every round"
    assert all(("client-1", t) in got for t in range(spec.rounds))
    late = [m for m in res["missing"] if m["node"] == "client-2"]
    assert late and max(m["round"] for m in late) <= first  # (1-based) only the rounds before it was admitted
    assert "not connected" in late[0]["reason"]
    assert {m["node"] for m in res["missing"]} <= {"client-0", "client-2"}
    assert "KeyError" not in fed.all_logs()


def test_late_client_under_a_fedchs_edge_is_admitted(tmp_path) -> None:
    """Fed-CHS: the edge weighs its clients by data size (gamma); a client that joins late reaches the edge's
    sizes at its next task and the PS's through the edge's updated Ready."""
    spec = small_spec("fedchs", clients=4, edges=2, rounds=60, edge_graph="complete", options={"K": 40},
                      transport={"join_timeout_s": 20.0})
    fed = Federation(spec, tmp_path, hold=("client-3",), marks=(1,))
    edge = fed.topology.parent["client-3"]
    try:
        fed.release_join(edge)
        fed.wait_round(1, timeout=120)
        fed.start_node("client-3")
        fed.wait_seen(f"ready-ps-{edge}", timeout=120, times=2)  # the edge told the PS its new subtree size
        assert fed.wait(240) == 0, fed.all_logs()
        codes = fed.exit_codes(30)
    finally:
        fed.close()
    assert set(codes.values()) == {0}, (codes, fed.all_logs())
    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    assert f"{edge}: client-3 admitted (joined late)" in fed.log_of(edge)
    later = [t for (n, t) in replies(res) if n == "client-3"]
    assert later and min(later) >= 1, "client-3 must train once admitted (its edge is active in some round)"
    assert "KeyError" not in fed.all_logs()


def test_late_client_is_refused_when_the_spec_says_so(tmp_path) -> None:
    spec = small_spec("fedavg", clients=3, edges=0, rounds=30, options={"local_steps": 40},
                      transport={"join_timeout_s": 20.0, "late_join": "refuse", "round_deadline_s": 2.0,
                                 "drop_after_missed": 0})
    fed = Federation(spec, tmp_path, hold=("client-2",), marks=(2,))
    try:
        fed.release_join()
        fed.wait_round(2, timeout=120)
        fed.procs.kill("client-0", signal.SIGSTOP)
        fed.start_node("client-2")
        assert fed.procs.procs["client-2"].wait(60) == ExitCode.LATE_JOIN_REFUSED, fed.log_of("client-2")
        assert "after it started, and transport.late_join is 'refuse'" in fed.log_of("client-2")
        fed.procs.kill("client-0", signal.SIGCONT)
        assert fed.wait(180) == 0, fed.all_logs()
    finally:
        fed.close()


def test_ps_stalled_past_the_keepalive_keeps_its_federation(tmp_path) -> None:
    """SIGSTOP the PS longer than the keep-alive timeout, then SIGCONT: the edges re-join the same run (their
    clients stay with them), every round trains with every node, and everyone exits 0."""
    spec = small_spec("fedavg", clients=4, edges=2, rounds=8, options={"local_steps": 40},
                      transport={"keepalive_s": 0.5, "keepalive_timeout_s": 2.0, "round_deadline_s": 60.0})
    fed = Federation(spec, tmp_path, marks=(2,))
    try:
        fed.wait_round(2, timeout=120)
        fed.procs.kill("ps", signal.SIGSTOP)
        for e in ("edge-0", "edge-1"):  # both edges noticed the silence and are dialing again
            fed.wait_seen(f"rejoining-{e}", timeout=60, node=e)
        fed.procs.kill("ps", signal.SIGCONT)
        for e in ("edge-0", "edge-1"):
            fed.wait_seen(f"rejoined-{e}", timeout=60, node=e)
        assert fed.wait(180) == 0, fed.all_logs()
        codes = fed.exit_codes(30)
    finally:
        fed.close()
    assert set(codes.values()) == {0}, (codes, fed.all_logs())
    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    assert res["missing"] == [], res["missing"]
    got = replies(res)
    assert all((n, t) in got for n in fed.topology.all_nodes()[1:] for t in range(spec.rounds))


def test_dead_ps_every_child_exits_saying_the_run_did_not_finish(tmp_path) -> None:
    spec = small_spec("fedavg", clients=4, edges=1, rounds=50, options={"local_steps": 40},
                      transport={"reconnect_s": 3.0})
    fed = Federation(spec, tmp_path, marks=(2,))
    try:
        fed.wait_round(2, timeout=120)
        fed.procs.kill("ps")
        codes = fed.exit_codes(60)
    finally:
        fed.close()
    assert codes["edge-0"] == ExitCode.PARENT_LOST, fed.all_logs()
    assert {codes[c] for c in fed.topology.clients} == {ExitCode.RUN_NOT_FINISHED}, (codes, fed.all_logs())
    assert "did not come back within transport.reconnect_s" in fed.log_of("edge-0")
    assert "the run did not finish" in fed.log_of("client-0")


def test_stalled_client_under_an_edge_misses_alone(tmp_path) -> None:
    """The PS gives each edge its remaining budget; the edge closes its clients' round early enough to answer
    in time, so a stalled client makes only itself missing, never its edge."""
    spec = small_spec("fedavg", clients=4, edges=2, rounds=6, options={"local_steps": 40},
                      transport={"round_deadline_s": 6.0})
    fed = Federation(spec, tmp_path, marks=(2, 4))
    try:
        fed.wait_round(2, timeout=120)
        fed.procs.kill("client-1", signal.SIGSTOP)
        fed.wait_round(4, timeout=120)  # two rounds closed without it
        fed.procs.kill("client-1", signal.SIGCONT)
        assert fed.wait(120) == 0, fed.all_logs()
    finally:
        fed.close()
    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    assert res["missing"] and {m["node"] for m in res["missing"]} == {"client-1"}, res["missing"]
    assert {m["by"] for m in res["missing"]} == {fed.topology.parent["client-1"]}
    got = replies(res)
    assert all((e, t) in got for e in ("edge-0", "edge-1") for t in range(spec.rounds))


def test_killed_edge_keeps_the_byte_rows_of_the_rounds_it_carried(tmp_path) -> None:
    spec = small_spec("fedavg", clients=4, edges=2, rounds=8, options={"local_steps": 40},
                      transport={"round_deadline_s": 30.0, "reconnect_s": 2.0})
    fed = Federation(spec, tmp_path, marks=(3,))
    try:
        fed.wait_round(3, timeout=120)
        fed.procs.kill("edge-1")
        assert fed.wait(180) == 0, fed.all_logs()
        codes = fed.exit_codes(30)
    finally:
        fed.close()
    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    clients = fed.topology.cluster("edge-1")
    carried = {t for (n, t) in replies(res) if n == "edge-1"}
    assert {0, 1, 2} <= carried
    rows = {(r["src"], r["dst"], r["round"] - 1) for r in res["links"]}  # files number rounds from 1
    for c in clients:  # the client links edge-1 counted itself, reported to the PS after each task
        assert all(("edge-1", c, t) in rows and (c, "edge-1", t) in rows for t in carried), c
        assert codes[c] == ExitCode.PARENT_LOST, fed.all_logs()
