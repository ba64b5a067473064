"""``fedhop check``'s crash check for order-dependent protocols (issue 16): when a replay cannot make it exact,
the row says why, before any process is started (the replay itself over real processes:
tests/testbed/test_check_replay.py)."""

from __future__ import annotations

from pathlib import Path

from fedhop.check import crash_verdict, order_dependent, replay_refused, run_oracle
from tests.specs import run_spec

FOCUS_QUORUM = {"participation": {"kind": "full"}, "decided_by": "client", "round_close": {"quorum": 2}}


def test_a_replay_needs_stateless_clients() -> None:
    assert replay_refused(run_spec("fedasync", {"concurrency": 2}, clients=3, rounds=2)) == ""
    assert replay_refused(run_spec("fedbuff", {"concurrency": 2, "buffer": 2}, clients=3, rounds=2)) == ""
    why = replay_refused(run_spec("focus", FOCUS_QUORUM, clients=4, rounds=2))
    assert "focus" in why and "clients keep state of their own" in why


def test_focus_at_a_quorum_is_order_dependent_and_its_crash_row_says_why_it_is_skipped(tmp_path: Path) -> None:
    spec = run_spec("focus", FOCUS_QUORUM, clients=4, rounds=2)
    oracle = run_oracle(spec)
    assert order_dependent(oracle)
    v = crash_verdict(spec, tmp_path / "crash", oracle, 1)
    assert v.ok is None and "clients keep state of their own" in v.detail, v
    assert not (tmp_path / "crash").exists()  # refused before any launch
