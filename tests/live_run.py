"""Test adapter: an in-process run that emits the run's lifecycle events the way the PS does.

``InProcessEngine.run`` does not take a RunEvents yet; this adapter hands the engine's own round loop
(``fedhop.common.engine.loop.drive``) an ``events`` argument, so round_started / round_ended come from the real
loop, and emits the rest at the points the PS will: run_started before the rounds, node_joined for every node,
``links`` (the engine's meter rows) and ``missing`` (new missing-log entries) after every round's commit, the
final link rows once more after the run (the algorithm's ``final`` may send), and run_finished.
"""

from __future__ import annotations

import functools
from unittest import mock

from fedhop.common.engine import inprocess
from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.engine.loop import drive
from fedhop.common.engine.results import RunResult
from fedhop.common.spec import RunSpec


def run_with_events(spec: RunSpec, events: RunEvents, *, run_id: str = "test-run",
                    faults: FaultPlan | None = None) -> RunResult:
    engine = InProcessEngine(spec, faults=faults)
    topo = engine.ws.topology
    events.emit("run_started", run_id=run_id, spec=spec.model_dump(mode="json"), nodes=topo.all_nodes(),
                resumed_at=0)
    for n in topo.all_nodes():
        if n != topo.server:
            events.emit("node_joined", node=n, role=topo.role(n))
    sent_missing = 0

    def after_commit(t: int) -> None:
        nonlocal sent_missing
        events.emit("links", rows=engine.meter.rows())
        for entry in engine.missing.entries[sent_missing:]:
            events.emit("missing", entry=dict(entry))
        sent_missing = len(engine.missing.entries)

    try:
        with mock.patch.object(inprocess, "drive", functools.partial(drive, events=events)):
            result = engine.run(after_commit=after_commit)
    except Exception as e:
        events.emit("run_finished", ok=False, wall_s=None, error=f"{type(e).__name__}: {e}")
        raise
    events.emit("links", rows=result.links)  # the final table: the algorithm's final() may have sent more
    events.emit("run_finished", ok=True, wall_s=result.wall_s, error=None)
    return result
