"""A silent client is dropped and a stalled one comes back (issue 9), over real processes: two clients are
stopped (SIGSTOP) at a round boundary; after ``transport.drop_after_missed`` rounds without a reply the PS
closes both sessions and the run goes on; one is resumed (SIGCONT), re-joins the same run and takes part
again, the other stays stopped to the end, and the run finishes without waiting for it."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.integration.netutil import Federation, load_result, replies, small_spec
from tests.waiting import wait_until

DROP = "no reply in 2 consecutive rounds (transport.drop_after_missed = 2)"


def test_silent_clients_are_dropped_and_a_resumed_one_rejoins(tmp_path: Path, monkeypatch) -> None:
    gates = tmp_path / "gate"
    gates.mkdir()
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(gates))  # the PS's gates before rounds 2 and 5 (testhooks.py)
    for r in (1, 4):
        (gates / f"stop-{r}").touch()
    spec = small_spec("fedavg", clients=3, rounds=6,
                      transport={"round_deadline_s": 2.0, "drop_after_missed": 2})
    fed = Federation(spec, tmp_path)
    try:
        wait_until((gates / "at-1").exists, "round 1 to end", timeout=120, details=fed.all_logs)
        fed.procs.kill("client-1", signal.SIGSTOP)
        fed.procs.kill("client-2", signal.SIGSTOP)
        (gates / "go-1").touch()
        fed.wait_lost("client-1", timeout=120, reason="dropped")  # rounds 2 and 3 pass without them
        fed.wait_lost("client-2", timeout=120, reason="dropped")
        # round 4 ran without them
        wait_until((gates / "at-4").exists, "round 4 to end", timeout=120, details=fed.all_logs)
        fed.procs.kill("client-1", signal.SIGCONT)
        fed.wait_seen("ready-ps-client-1", timeout=120, times=2)  # client-1 re-joined and said Ready again
        (gates / "go-4").touch()
        assert fed.wait(120) == 0, fed.all_logs()
        codes = {c: fed.procs.procs[c].wait(30) for c in ("client-0", "client-1")}
        still_stopped = fed.procs.procs["client-2"].poll() is None
    finally:
        fed.close()
    log = fed.ps_log()
    for c in ("client-1", "client-2"):
        assert f"ps: dropped {c} (" in log and f"): {DROP}; the last: no reply within the deadline of 2s" in log, log
    assert "ps: client-1 re-joined from" in log
    assert "re-joined run" in fed.log_of("client-1")
    assert codes == {"client-0": 0, "client-1": 0}, codes
    assert still_stopped  # the run ended without waiting for it

    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    missing: dict[str, dict[int, str]] = {}
    for m in res["missing"]:
        missing.setdefault(m["node"], {})[m["round"]] = m["reason"]
    assert set(missing) == {"client-1", "client-2"}, res["missing"]
    assert sorted(missing["client-1"]) == [2, 3, 4]  # back from round 5 on
    assert sorted(missing["client-2"]) == [2, 3, 4, 5, 6]
    for c, rounds in missing.items():
        assert all("no reply within the deadline" in rounds[r] for r in (2, 3)), rounds
        assert all(rounds[r] == f"{c} is not connected (dropped: {DROP})" for r in rounds if r > 3), rounds
    got = replies(res)
    assert all(("client-0", t) in got for t in range(spec.rounds))
    assert ("client-1", 4) in got and ("client-1", 5) in got

