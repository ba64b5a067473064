"""``fedhop launch`` through the testbed contract (deploy/contract.py): the same run folder as ``launch``, plus the
per-link table every testbed writes (loopback links: payload and message bytes, no wire count)."""

from __future__ import annotations

import json
from pathlib import Path

from fedhop.deploy import contract
from fedhop.deploy.link_table import read_link_table, read_meters
from fedhop.deploy.wire import read_wire_csv
from fedhop.launch import LaunchTestbed
from tests.integration.netutil import logs, small_spec


def test_launch_runs_through_the_contract_and_writes_the_per_link_table(tmp_path: Path) -> None:
    spec = small_spec("fedavg", clients=2, edges=1, rounds=1)
    bed = LaunchTestbed(spec, tmp_path / "run", device="cpu")
    outcome = contract.run(bed)
    assert outcome.rc == 0 and bed.result is not None, logs(bed.out)
    assert [r["round"] for r in json.loads((bed.out / "results.json").read_text())["rounds"]] == [1]
    meters = read_meters(bed.out / "links.csv")
    assert outcome.links is not None
    assert {(r.src, r.dst): (r.messages, r.payload, r.message) for r in outcome.links} == {
        k: (m.messages, m.payload, m.message) for k, m in meters.items()}
    assert all(r.wire is None for r in outcome.links)  # loopback: no counter per link, not zero bytes
    assert any(r.payload > 0 for r in outcome.links)
    assert read_link_table(bed.out / "link_bytes.csv") == outcome.links
    assert read_wire_csv(bed.out / "wire.csv") == []
    assert outcome.notes == ("fedhop launch runs on loopback: no wire bytes per link",)
