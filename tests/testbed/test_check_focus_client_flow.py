"""``fedhop check`` on FOCUS's client-initiated flow (issue 16, ``flow = "client"``): every check over real
processes, the crash and fault checks included (three launches: about a minute on a loaded host, so in the testbed
tier for its time, not for root).

The crash check: the resumed PS kicks every client again (the intents the killed PS held are lost with it); the
model and the payload per link are the uninterrupted run's. The fault check: a client killed after round 1 is
missing from then on (its pull never comes; with ``absent = "say"`` the PS kicks it again each round, which
fails, and closes each round at the deadline), and the run finishes.
"""

from __future__ import annotations

from pathlib import Path

from fedhop.testing import assert_holds, check_protocol
from tests.integration.netutil import small_spec


def test_focus_client_flow_passes_fedhop_check(tmp_path: Path) -> None:
    spec = small_spec("focus", clients=3, rounds=4, options={
        "lr": 0.05, "participation": {"kind": "bernoulli", "p": [0.9, 0.8, 0.9]}, "decided_by": "client",
        "flow": "client", "round_close": {"absent": "say", "deadline_s": 3.0}})
    report = check_protocol(spec, tmp_path)
    assert_holds(report)
    assert report.verdict("crash").ok is True, report.table()
    assert report.verdict("fault").ok is True, report.table()
    assert "bit-identical" in report.verdict("model").detail, report.table()
