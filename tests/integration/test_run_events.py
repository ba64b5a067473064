"""The networked engine's Run emits the same lifecycle events as the in-process engine's: the same run start,
every node joined, every child of the PS ready with its clients' data sizes, the same rounds in the same
order with the same records, and the same end (the PS here, every edge and client host a real process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.wire.control import CONTROL_KINDS
from tests.integration.netutil import small_spec

UNTIMED = ("elapsed_s", "round_s")


def record_events() -> tuple[RunEvents, list[tuple[str, dict[str, Any]]]]:
    events, seen = RunEvents(), []
    events.subscribe(lambda kind, data: seen.append((kind, data)))
    return events, seen


def rounds_part(seen: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, Any]]:
    """The run's course from its first round on, without the join events (their order over the network is
    the children's) and without the byte tables (compared apart)."""
    first = next(i for i, (k, _) in enumerate(seen) if k == "round_started")
    out: list[tuple[str, Any]] = []
    for kind, data in seen[first:]:
        if kind in ("round_started",):
            out.append((kind, data["round"]))
        elif kind == "round_ended":
            out.append((kind, (data["round"], {k: v for k, v in data["record"].items() if k not in UNTIMED})))
        elif kind in ("links", "run_finished"):
            out.append((kind, data.get("ok")))
    return out


def test_networked_run_emits_the_inprocess_events(tmp_path: Path) -> None:
    from fedhop.launch import launch

    spec = small_spec("fedavg", clients=4, edges=2, rounds=3)
    net_events, net = record_events()
    result = launch(spec, tmp_path / "run", device="cpu", events=net_events)
    local_events, local = record_events()
    oracle = InProcessEngine(spec).run(events=local_events)

    (started_net,), (started_local,) = [[d for k, d in s if k == "run_started"] for s in (net, local)]
    assert net[0][0] == local[0][0] == "run_started"
    assert {k: v for k, v in started_net.items() if k != "run_id"} == \
        {k: v for k, v in started_local.items() if k != "run_id"}

    def joins(seen: list[tuple[str, dict[str, Any]]]) -> tuple[set[str], dict[str, dict[str, int]]]:
        return ({d["node"] for k, d in seen if k == "node_joined"},
                {d["node"]: d["data_sizes"] for k, d in seen if k == "node_ready"})

    assert joins(net) == joins(local)
    assert joins(net)[0] == {"edge-0", "edge-1", "client-0", "client-1", "client-2", "client-3"}
    assert rounds_part(net) == rounds_part(local)
    assert [k for k, _ in net if k in ("node_lost", "missing")] == []

    def work(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r["kind"] not in CONTROL_KINDS]

    (last_net,), (last_local,) = [[d for k, d in s if k == "links"][-1:] for s in (net, local)]
    assert work(last_net["rows"]) == work(result.links) and last_local["rows"] == oracle.links
    assert [(r["src"], r["dst"], r["kind"], r["payload_bytes"]) for r in work(last_net["rows"])] == \
        [(r["src"], r["dst"], r["kind"], r["payload_bytes"]) for r in work(last_local["rows"])]
    assert net[-1] == ("run_finished", {"ok": True, "wall_s": result.wall_s, "error": None})
