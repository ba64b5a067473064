"""Issue 20, "the PS stalled for 60 s (SIGSTOP) and continued": the PS is stopped in the middle of a round, while
it waits for the replies, for twice the keep-alive timeout (longer than the round's deadline too); its clients
notice the silence and dial again. Once it continues, the run goes back to its pace and ends with exit code 0
(every process), every round recorded, every client training in the rounds after the stall.

The moment is chosen with the test gates (common/testhooks.py): client-0 holds at its gate of round 4, so the PS
has sent round 4's tasks and waits; the stall itself is a duration (the fault), not a synchronisation."""

from __future__ import annotations

import signal
import statistics
import time
from pathlib import Path

from fedhop.common.exit_codes import ExitCode
from tests.integration.netutil import Federation, load_result, replies, small_spec
from tests.integration.test_resume_network import wait_file

KEEPALIVE_TIMEOUT_S = 1.5


def test_ps_stopped_mid_round_resumes_its_pace_and_exits_zero(tmp_path: Path, monkeypatch) -> None:
    spec = small_spec("fedavg", clients=2, rounds=8,
                      transport={"keepalive_s": 0.5, "keepalive_timeout_s": KEEPALIVE_TIMEOUT_S,
                                 "round_deadline_s": 2.0, "drop_after_missed": 0})
    gates = tmp_path / "gate"
    gates.mkdir()
    (gates / "stop-client-0-3").touch()  # client-0 holds when round 4's task reaches it
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(gates))
    fed = Federation(spec, tmp_path)
    try:
        wait_file(gates / "at-client-0-3", fed)  # the PS sent round 4 and waits for the replies
        fed.procs.kill("ps", signal.SIGSTOP)
        stopped = time.monotonic()
        (gates / "go-client-0-3").touch()  # client-0's reply goes out to a stopped PS
        for c in fed.topology.clients:  # both noticed the silent parent and dial again
            fed.wait_seen(f"rejoining-{c}", timeout=60, node=c)
        time.sleep(max(0.0, 2 * KEEPALIVE_TIMEOUT_S - (time.monotonic() - stopped)))  # the stall: the fault
        fed.procs.kill("ps", signal.SIGCONT)
        rc = fed.wait(180)
        codes = fed.exit_codes(30)
    finally:
        fed.close()
    assert rc == ExitCode.OK, fed.all_logs()
    assert set(codes.values()) == {0}, (codes, fed.all_logs())
    res, _ = load_result(fed.out)
    assert [r["round"] for r in res["rounds"]] == list(range(1, spec.rounds + 1))
    got = replies(res)
    after = range(5, spec.rounds)  # 0-based rounds 5..7: the federation is whole again
    assert all((c, t) in got for c in fed.topology.clients for t in after), (sorted(got), res["missing"])
    before = statistics.median(r["round_s"] for r in res["rounds"][:3])
    later = statistics.median(r["round_s"] for r in res["rounds"][5:])
    assert later <= 3 * before + 0.5, f"rounds took {later:.2f}s after the stall, {before:.2f}s before"
