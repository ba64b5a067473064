"""The live page's per-round timeline data (server/web/gantt.py, served in ``/api/timeline``'s ``chart``): a Gantt
row per node and each link's achieved rate beside its configured one, from synthetic events; no sockets."""

from __future__ import annotations

import pytest

from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.server.web.gantt import round_chart
from fedhop.server.web.status import RunStatus
from tests.specs import DIGITS, run_spec

NET = {"client_ps": {"mbit": 10, "delay_ms": 20, "up": {"mbit": 2}}}


def _rows(rnd: int) -> list[dict]:
    return [
        {"round": rnd, "node": "ps", "peer": "", "phase": "round", "seconds": 2.0, "predicted_s": 1.8},
        {"round": rnd, "node": "ps", "peer": "", "phase": "compute", "seconds": 0.1},
        {"round": rnd, "node": "ps", "peer": "", "phase": "wait", "seconds": 1.9},
        {"round": rnd, "node": "ps", "peer": "client-0", "phase": "transfer", "seconds": 1.6, "predicted_s": 1.5},
        {"round": rnd, "node": "client-0", "peer": "", "phase": "compute", "seconds": 0.3},
        {"round": rnd, "node": "client-0", "peer": "", "phase": "encode", "seconds": 0.05},
    ]


def _meter(rnd: int) -> list[dict]:
    return [{"src": "ps", "dst": "client-0", "kind": "train", "phase": "request", "round": rnd, "messages": 1,
             "payload_bytes": 600_000, "message_bytes": 600_000},
            {"src": "client-0", "dst": "ps", "kind": "train", "phase": "reply", "round": rnd, "messages": 1,
             "payload_bytes": 400_000, "message_bytes": 400_000},
            {"src": "client-0", "dst": "ps", "kind": "wire", "phase": "tcp", "round": rnd, "messages": 0,
             "payload_bytes": 0, "message_bytes": 0}]


def test_the_chart_lays_each_nodes_phases_end_to_end_and_rates_each_link() -> None:
    c = round_chart(_rows(0) + _rows(1), _meter(0) + _meter(1), NET)
    assert c is not None and c["round"] == 1 and (c["round_s"], c["predicted_round_s"]) == (2.0, 1.8)
    rows = {n["node"]: n["segments"] for n in c["nodes"]}
    assert list(rows) == ["ps", "client-0"]
    assert rows["ps"] == [{"phase": "compute", "start": 0.0, "seconds": 0.1},
                          {"phase": "wait", "start": 0.1, "seconds": 1.9}]
    assert [(s["phase"], s["start"], s["seconds"]) for s in rows["client-0"]] == \
        [("transfer", 0.0, 1.6), ("compute", 1.6, 0.3), ("encode", pytest.approx(1.9), 0.05)]
    (link,) = c["links"]
    assert (link["src"], link["dst"], link["bytes"], link["predicted_s"]) == ("ps", "client-0", 1_000_000, 1.5)
    assert link["achieved_mbit"] == pytest.approx(1_000_000 * 8 / 1.6 / 1e6)  # 5 Mbit/s over both directions
    assert link["configured_mbit"] == {"out": 10.0, "back": 2.0}  # ps -> client-0 down, client-0 -> ps up
    assert round_chart(_rows(0), _meter(0), None, round_idx=0)["links"][0]["configured_mbit"] is None
    assert round_chart([], [], NET) is None


def test_api_timeline_serves_the_chart_of_a_simulated_run() -> None:
    spec = run_spec("fedavg", {"lr": 0.1, "local_steps": 1, "batch_size": 16}, clients=2, rounds=2, data=DIGITS,
                    model={"name": "mlp", "hidden": [16]}, network=NET)
    st = RunStatus()
    eng = InProcessEngine(spec)
    events = RunEvents()
    events.subscribe(st)
    eng.run(events=events)
    got = st.timeline()
    chart = got["chart"]
    assert chart["round"] == 1 and chart["predicted_round_s"] > 2 * 0.020
    assert {n["node"] for n in chart["nodes"]} == {"ps", "client-0", "client-1"}
    assert {(lk["src"], lk["dst"]) for lk in chart["links"]} == {("ps", "client-0"), ("ps", "client-1")}
    assert all(lk["configured_mbit"] == {"out": 10.0, "back": 2.0} and lk["bytes"] > 0 and lk["predicted_s"] > 0.04
               for lk in chart["links"])
    assert all("predicted_s" in r for r in got["rows"] if r["phase"] in ("round", "transfer"))
