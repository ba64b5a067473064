"""The bulk lane (transport/lane.py) between real processes: every parent session of a launch opens one, the
PS's to its edges and each edge's to its clients (sessions an edge accepted before it knew its run included),
and the run carries its bundles on them (``FEDHOP_BULK_LANE_MIN_BYTES=1``: every bundle). That the bits and
byte counts are those without the lane is ``test_network_equivalence.py``'s (run with that variable too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.netutil import launch_here, small_spec


def test_every_parent_session_of_a_launch_opens_a_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(gate))  # marks (common/testhooks.py): lane-up-<parent> per lane
    monkeypatch.setenv("FEDHOP_BULK_LANE_MIN_BYTES", "1")
    out = launch_here(small_spec("fedavg", clients=4, edges=2, rounds=2), tmp_path)
    assert len(json.loads((out / "results.json").read_text())["rounds"]) == 2
    lanes = {f.name.removeprefix("seen-lane-up-"): len(f.read_text().split()) for f in gate.glob("seen-lane-up-*")}
    assert lanes == {"ps": 2, "edge-0": 2, "edge-1": 2}
    assert not list(gate.glob("seen-lane-refused-*"))
