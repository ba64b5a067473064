"""The tests' own helpers: the wait helper (tests/waiting.py), the test hooks' marks (common/testhooks.py) and the
spec factory (tests/specs.py)."""

from __future__ import annotations

import itertools

import pytest

from fedhop.common.spec import RunSpec
from fedhop.common.testhooks import mark
from tests.specs import DIGITS, run_spec, spec_dict
from tests.waiting import WaitTimeout, wait_until


def test_wait_until_returns_the_first_true_value():
    answers = iter([0, None, "", "there"])
    assert wait_until(lambda: next(answers), "the answer", timeout=5, poll=0) == "there"


def test_wait_until_times_out_naming_the_state_and_the_details():
    with pytest.raises(WaitTimeout, match=r"timed out after 0.05s waiting for round 3 to end:\nthe logs"):
        wait_until(lambda: False, "round 3 to end", timeout=0.05, poll=0.01, details=lambda: "the logs")


def test_wait_until_stops_at_once_when_the_state_can_no_longer_come():
    asked = itertools.count()
    with pytest.raises(WaitTimeout, match=r"^the PS exited \(1\) before round 3 to end$"):
        wait_until(lambda: next(asked) > 10, "round 3 to end", timeout=60, poll=0,
                   stop_if=lambda: "the PS exited (1)")
    assert next(asked) == 1  # asked once, then stopped


def test_a_mark_counts_each_time_a_state_is_reached_and_is_nothing_without_the_gate_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDHOP_TEST_GATE", raising=False)
    mark("ready-ps-client-1")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(tmp_path))
    mark("ready-ps-client-1")
    mark("ready-ps-client-1")
    assert len((tmp_path / "seen-ready-ps-client-1").read_text().splitlines()) == 2
    assert [f.name for f in tmp_path.iterdir()] == ["seen-ready-ps-client-1"]


def test_the_factory_leaves_unset_fields_to_the_specs_defaults():
    assert spec_dict(device=None) == {"algorithm": {"name": "fedavg"}}
    assert run_spec(device=None) == RunSpec.parse({"algorithm": {"name": "fedavg"}})
    assert run_spec("fedchs", {"K": 2}, clients=4, edges=2, rounds=3, data=DIGITS) == RunSpec.parse({
        "algorithm": {"name": "fedchs", "options": {"K": 2}}, "topology": {"clients": 4, "edges": 2},
        "rounds": 3, "device": "cpu", "data": DIGITS})
    assert spec_dict(testbed={"mbit": {"edge_ps": 10}})["testbed"] == {"mbit": {"edge_ps": 10}}
