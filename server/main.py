"""``fedhop server``: the parameter server process (DESIGN.md sections 4-5).

The PS owns the RunSpec. It serves ``Parent.Session``, waits until every node of the topology has joined
(edges report when their clients have joined, with data sizes), runs the algorithm's driver with a
:class:`~fedhop.transport.parent.NetComm`, tells everyone to stop, merges every process's byte meter and missing
log, and writes the run folder.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedhop.common.engine.api import NodeContext, get_algorithm
from fedhop.common.engine.base import MissingLog
from fedhop.common.engine.results import RoundRecorder, RunResult, attach_cumulative_bytes, write_run_folder
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec
from fedhop.common.wire.bundle import clone
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.health import add_health
from fedhop.transport.parent import NetComm, ParentHub, make_server

log = logging.getLogger("fedhop.server")


class JoinTimeout(RuntimeError):
    """No node of the topology joined within transport.join_timeout_s."""


class StartupFailed(RuntimeError):
    """A node of the federation died before the run started (reported by ``startup_failure``)."""


def run_server(spec: RunSpec, listen: str = "127.0.0.1:0", *, out: Path | None = None, device: str | None = None,
               on_round: Callable[[dict[str, Any]], None] | None = None,
               on_listening: Callable[[int], None] | None = None,
               startup_failure: Callable[[], str | None] | None = None) -> RunResult:
    """Run ``spec`` as the PS of a networked federation; returns the result (also written to ``out``).

    ``startup_failure`` (the launcher's): says why a node it started can no longer join, so the PS stops
    waiting at once instead of at the join deadline."""
    torch.set_num_threads(1)
    ws = Workspace(spec, device)
    topo = ws.topology
    meter, missing = ByteMeter(), MissingLog()
    hub = ParentHub(topo.server, meter)
    run_id = f"{spec.name}-{secrets.token_hex(4)}"
    hub.configure(spec, topo, run_id)
    server = make_server(len(hub.children) + 16)
    add_health(server)  # grpc.health.v1 (compose healthchecks, `fedhop health`, children lingering on it)
    hub.register(server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    server.start()
    try:
        log.info("ps: run %s listening on port %d; waiting for %d children", run_id, port, len(hub.children))
        if on_listening is not None:
            on_listening(port)
        ws.model, ws.test  # noqa: B018  (load while the children start, not inside the first round)
        absent = hub.wait_ready(spec.transport.join_timeout_s, give_up=startup_failure)
        failure = startup_failure() if startup_failure is not None else None
        if failure:
            raise StartupFailed(failure)
        if len(absent) == len(hub.children):
            raise JoinTimeout(f"no node joined within {spec.transport.join_timeout_s:g}s "
                              f"(expected {list(hub.children)})")
        if absent:
            log.warning("ps: starting without %s (not ready within %gs)", absent, spec.transport.join_timeout_s)
        sizes = topo.subtree_sizes(hub.data_sizes())
        comm = NetComm(topo.server, topo, missing, hub, spec)
        ctx = NodeContext(node_id=topo.server, role="server", ws=ws, comm=comm, sizes=sizes)
        comm.ctx = ctx

        def report(rec: dict[str, Any]) -> None:
            shown = " ".join(f"{k} {rec[k]:.4f}" for k in ("accuracy", "loss") if k in rec)
            log.info("ps: round %d/%d %s", rec["round"], spec.rounds, shown)
            if on_round is not None:
                on_round(rec)

        recorder = RoundRecorder(on_round=report, journal=out / "rounds.jsonl" if out is not None else None)
        ctx.reporter = recorder
        hub.start_run(hub.edge_addresses())
        t0 = time.perf_counter()
        final = get_algorithm(spec.algorithm.name).run(ctx)
        wall = time.perf_counter() - t0
        rows, child_missing = hub.shutdown(spec.transport.rpc_timeout_s)
        meter.merge(rows)
        links = meter.rows()
        order = {n: i for i, n in enumerate(topo.all_nodes())}
        entries = sorted(missing.entries + child_missing,
                         key=lambda e: (e["round"], order.get(e["by"], -1), order.get(e["node"], -1)))
        result = RunResult(spec=spec, engine="network", rounds=attach_cumulative_bytes(recorder.records, links),
                           links=links, missing=entries, final=clone(final), wall_s=wall)
        if out is not None:
            write_run_folder(result, out)
        return result
    finally:
        server.stop(grace=2.0)
