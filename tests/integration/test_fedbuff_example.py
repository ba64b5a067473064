"""examples/fedbuff (FedBuff as a user module on ``fedhop.api`` only: ``submit`` / ``collect``) at a small size.

* In one process it computes what the built-in ``fedbuff`` computes under the same spec (the same virtual-clock
  order: the example's half-speed client included), bit for bit: the module is written to agree with it.
* Launched over real processes (:func:`fedhop.launch.launch` in the test process, the example's folder as the
  working directory), the run records the order its collects took updates in (``arrivals``); the in-process
  engine replaying that order (what ``fedhop simulate --replay RUN_DIR`` does) ends with the networked model, bit
  for bit, with the same payload on every link, and so does the built-in ``fedbuff`` replaying it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhop.common.engine.inprocess import InProcessEngine, parse_arrivals
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec
from fedhop.common.wire.bundle import payload_bytes
from fedhop.common.wire.control import CONTROL_KINDS
from tests.integration.netutil import example_here, launch_here, load_result

SMALL = (("rounds = 10", "rounds = 3"), ("clients = 6", "clients = 4"), ("concurrency = 4", "concurrency = 3"),
         ("buffer = 3", "buffer = 2"), ("local_steps = 5", "local_steps = 2"), ("client-5", "client-3"))
BUILTIN = ('name = "buffered:ALGORITHM"', 'name = "fedbuff"')


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def _links(rows: list[dict], kind: str, offset: int) -> dict[tuple, tuple[int, int]]:
    """(src, dst, kind, phase, round) -> (messages, payload bytes) of the work rows; the run folder numbers rounds
    from 1, the in-memory meter from 0 (``offset``); the built-in's task kind is renamed to the example's."""
    return {(r["src"], r["dst"], kind if r["kind"] == "async.delta" else r["kind"], r["phase"], r["round"] + offset):
            (r["messages"], r["payload_bytes"]) for r in rows if r["kind"] not in CONTROL_KINDS}


def test_fedbuff_example_simulate_launch_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = example_here("fedbuff", tmp_path, monkeypatch, SMALL)
    text = (folder / "spec.toml").read_text()
    assert BUILTIN[0] in text
    (folder / "builtin.toml").write_text(text.replace(*BUILTIN))
    spec, builtin = RunSpec.load(folder / "spec.toml"), RunSpec.load(folder / "builtin.toml")

    # in one process: the virtual clock orders the updates; the user module and the built-in agree
    sim = InProcessEngine(spec, device="cpu").run()
    ref = InProcessEngine(builtin, device="cpu").run()
    assert _equal(sim.final, ref.final)
    assert [r["arrivals"] for r in sim.rounds] == [r["arrivals"] for r in ref.rounds]
    assert [r["updates"] for r in sim.rounds] == [2, 2, 2]
    assert max(r["staleness_max"] for r in sim.rounds) >= 1  # some update was computed from an older model
    assert not _equal(sim.final, Workspace(spec, "cpu").initial_params())

    # over real processes: the arrivals recorded, and replayed in one process, give the networked model
    res, final = load_result(launch_here(spec, tmp_path))
    assert res["missing"] == []
    assert all(len(parse_arrivals(r["arrivals"])) == 2 for r in res["rounds"])  # one collect per buffered update
    replay = InProcessEngine(spec, device="cpu", replay=res["rounds"]).run()
    assert _equal(final, replay.final)
    assert _equal(final, InProcessEngine(builtin, device="cpu", replay=res["rounds"]).run().final)
    assert [r["staleness_max"] for r in res["rounds"]] == [r["staleness_max"] for r in replay.rounds]

    net = _links(res["links"], "buffered.delta", 0)
    assert net == _links(replay.links, "buffered.delta", 1)
    d = payload_bytes(final)
    tasks = {k: v for k, v in net.items() if k[2] == "buffered.delta"}
    assert tasks and all(payload % d == 0 and payload // d == messages for messages, payload in tasks.values())
    taken = sum(len(parse_arrivals(r["arrivals"])) for r in res["rounds"])  # every update taken crossed the wire
    assert sum(m for k, (m, _) in tasks.items() if k[3] == "reply") >= taken == 6
