"""A resumed PS's Welcome tells a node that joins how far to roll back: to before the first round the PS has not
committed yet. The chaos soak found it naming the round the PS had resumed at for the rest of the run, so a FOCUS
client restarted with its --state-dir rounds later dropped the state it had saved since (y != sum g_i, silently)."""

from __future__ import annotations

from fedhop.server.main import _committed
from tests.specs import DIGITS, run_spec


def test_a_resumed_welcome_follows_the_committed_rounds(monkeypatch) -> None:
    monkeypatch.delenv("FEDHOP_TEST_GATE", raising=False)
    spec = run_spec("fedavg", {}, clients=2, rounds=6, data=DIGITS)
    info: dict = {"resume_round": 2, "code_digest": "x"}  # resumed before round 3 (0-based 2)
    _committed(2, spec, info)
    assert info["resume_round"] == 3
    _committed(4, spec, info)
    assert info == {"resume_round": 5, "code_digest": "x"}


def test_a_run_that_did_not_resume_sends_no_resume_round(monkeypatch) -> None:
    monkeypatch.delenv("FEDHOP_TEST_GATE", raising=False)
    spec = run_spec("fedavg", {}, clients=2, rounds=6, data=DIGITS)
    info: dict = {"code_digest": "x"}
    _committed(3, spec, info)
    assert info == {"code_digest": "x"}  # a restarted node restores its newest state
