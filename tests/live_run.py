"""Test helper: an in-process run whose lifecycle events feed a test's listeners (a RunStatus, a gate).

The in-process engine emits the same events as the PS (its :class:`~fedhop.common.engine.run.Run` does, for
both engines), so this is ``fedhop simulate``'s own entry point, :func:`fedhop.server.web.live.simulate`, with a
test's run id and fault plan.
"""

from __future__ import annotations

from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.inprocess import FaultPlan
from fedhop.common.engine.results import RunResult
from fedhop.common.spec import RunSpec
from fedhop.server.web.live import simulate


def run_with_events(spec: RunSpec, events: RunEvents, *, run_id: str = "test-run",
                    faults: FaultPlan | None = None) -> RunResult:
    return simulate(spec, events, run_id=run_id, faults=faults)
