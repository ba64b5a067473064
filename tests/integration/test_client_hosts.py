"""Client hosts over real processes: ``fedhop launch --clients-per-process 2`` serves 5 clients from one
``fedhop client`` process and two ``fedhop clients`` hosts, and the run is bit-identical to the in-process engine
(final model, every link's payload and message bytes, accuracies). SCAFFOLD with uniform participation: every
client keeps state (its control variate) across the rounds it sits out, and draws its own batches."""

from __future__ import annotations

from pathlib import Path

import torch

from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.wire.control import CONTROL_KINDS
from tests.integration.netutil import launch_cli_here, load_result, rows_by_key, small_spec


def test_hosts_of_several_clients_are_bit_identical_to_inprocess(tmp_path: Path) -> None:
    spec = small_spec("scaffold", clients=5, edges=0, rounds=3,
                      options={"local_steps": 2, "participation": {"kind": "uniform", "m": 3}})
    oracle = InProcessEngine(spec, device="cpu").run()
    out = launch_cli_here(spec, tmp_path, extra=["--clients-per-process", "2"])
    res, final = load_result(out)

    assert res["missing"] == []
    assert list(final) == list(oracle.final)
    for k, v in oracle.final.items():
        assert torch.equal(final[k], v), f"tensor {k} differs from the in-process engine"
    work = [r for r in res["links"] if r["kind"] not in CONTROL_KINDS]
    net = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"]): r for r in work}
    ora = {(r["src"], r["dst"], r["kind"], r["phase"], r["round"] + 1): r for r in oracle.links}
    assert set(net) == set(ora)
    for key, r in ora.items():
        assert (net[key]["messages"], net[key]["payload_bytes"], net[key]["message_bytes"]) == \
            (r["messages"], r["payload_bytes"], r["message_bytes"]), key
    assert rows_by_key(work, "payload_bytes") == rows_by_key(oracle.links, "payload_bytes")
    assert [r["accuracy"] for r in res["rounds"]] == [r["accuracy"] for r in oracle.rounds]
    # the premise: with m = 3 of 5, clients sat rounds out, so their state had to survive in their hosts
    replies = {c: sum(1 for k in ora if k[0] == c and k[3] == "reply") for c in (f"client-{i}" for i in range(5))}
    assert min(replies.values()) < spec.rounds, replies

    # one process per group: client-0 alone (a `fedhop client`), then two hosts named by their ids
    logs = out / "logs"
    assert sorted(p.name for p in logs.glob("*.log")) == ["client-0.log", "client-1..client-2.log",
                                                          "client-3..client-4.log", "ps.log"]
    host = (logs / "client-3..client-4.log").read_text()
    for c in ("client-3", "client-4"):
        assert f"[{c}] fedhop.client: {c}: joined run" in host, host[-3000:]
    assert "[host] fedhop.clients: all 2 client ids finished" in host
    # each id saved its own state after every task, as a process of its own would
    for c in ("client-0", "client-1", "client-2", "client-3", "client-4"):
        assert any((out / "state" / c).iterdir()), c
