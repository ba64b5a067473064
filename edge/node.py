"""``fedhop edge``: one edge server process (docs/design.md section 6).

An edge is a child of the PS (it dials the PS and serves the PS's tasks) and a parent of its clients (it
serves ``Parent.Session`` to them), and it serves ``Edge.HandOff`` / ``Edge.Describe`` to its neighbour
edges: a model handed to a neighbour goes edge -> edge directly, never through the PS. A neighbour's post
(``Comm.post``) runs in the edge's task loop; the edge's own posts to the PS go up its session stream.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedhop.common import heap
from fedhop.common.engine.api import NodeContext, get_algorithm
from fedhop.common.engine.base import MissingLog
from fedhop.common.engine.node_store import NodeStore
from fedhop.common.engine.spill import spiller
from fedhop.common.exit_codes import ExitCode, describe
from fedhop.common.malloc_tuning import fix_mmap_threshold
from fedhop.common.user_code import CODE_DIGEST
from fedhop.common.wire.meter import ByteMeter
from fedhop.common.wire.scalars import get_scalars
from fedhop.edge.comm import EdgeComm
from fedhop.transport.aio_server import LoopServer, make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.child import ChildSession, JoinError
from fedhop.transport.credentials import Security
from fedhop.transport.health import add_health
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.parent import serve_parent
from fedhop.transport.peer import EdgeService, advertised
from fedhop.transport.session import HubConfig, HubListener, ParentHub, PendingHub

log = logging.getLogger("fedhop.edge")


class _TellParent(HubListener):
    """This edge's Ready to the PS, with its clients' data sizes: first by :meth:`announce`, once the edge serves
    its neighbours, then again each time a late client's Ready changes the sizes. A Ready sent before (a child's
    Ready after the hub's start, during the heap's settle) let the PS start a round whose hand-off or describe
    reached this edge before it served the run: "not in a run yet", a missing entry, and the engines no longer
    equal (issue 19's flake of round 1, seen in test_network_equivalence and test_security)."""

    def __init__(self, session: ChildSession, sizes: Callable[[], dict[str, int]]) -> None:
        self.session, self.sizes = session, sizes
        self._lock = threading.Lock()
        self._announced = False

    def announce(self) -> None:
        with self._lock:
            self._announced = True
            self.session.send_ready(self.sizes())

    def sizes_changed(self) -> None:
        with self._lock:
            if self._announced:
                self.session.send_ready(self.sizes())


@dataclass(frozen=True)
class EdgeServer:
    """What an edge serves before it knows its run: its children's sessions (held by ``pending`` until the
    hub exists), its neighbours' hand-offs and posts (``service``) and health, all on one asyncio server."""

    server: LoopServer
    pending: PendingHub
    service: EdgeService
    port: int  # 0: the listen address could not be bound (nothing is started then)


def edge_server(node_id: str, listen: str, security: Security) -> EdgeServer:
    """The started server of edge ``node_id`` on ``listen``. One event loop and fixed pools
    (``transport/aio_server.py``): the edge's threads do not grow with its children (a synchronous server held
    two threads per child session: at most ~1,000 per edge; issue 19)."""
    pending = PendingHub(node_id, security)  # clients may dial before the PS's Welcome tells this edge the run
    service = EdgeService(node_id, security)
    server = make_loop_server(security)
    add_health(server)  # grpc.health.v1 (compose healthchecks, `fedhop health`)
    serve_parent(pending, server)
    service.register(server)
    try:
        port = add_port(server, listen, security)
    except RuntimeError:  # grpcio raises where the address cannot be bound (older versions returned 0)
        port = 0
    if port == 0:
        server.stop(0).wait(5.0)
        return EdgeServer(server, pending, service, 0)
    server.start()
    return EdgeServer(server, pending, service, port)


def run_edge(config: NodeConfig) -> int:
    """Serve clients and neighbour edges on ``config.listen``, join the run at ``config.connect`` (the PS),
    serve until Bye; returns the exit code (:class:`~fedhop.common.exit_codes.ExitCode`).

    ``config.advertise`` is the address neighbour edges dial (default: the listen address, 127.0.0.1 for a
    wildcard host; set it when edges run on different machines); ``config.security`` is used for every link."""
    if config.listen is None:
        raise ValueError(f"{config.node_id}: an edge needs a listen address (NodeConfig.listen)")
    node_id, listen, security = config.node_id, config.listen, config.security
    torch.set_num_threads(1)
    fix_mmap_threshold()  # freed chunk buffers go back to the OS (common/malloc_tuning.py)
    meter, missing = ByteMeter(), MissingLog()
    served = edge_server(node_id, listen, security)
    if served.port == 0:
        log.error("%s: cannot listen on %s", node_id, listen)
        return ExitCode.USAGE
    pending, service, server = served.pending, served.service, served.server
    address = advertised(listen, served.port, config.advertise)
    store = NodeStore(node_id, config.state_dir)
    session = ChildSession(config, "edge", address=address,
                           info={"state_round": store.newest_tag() if store.newest_tag() is not None else -1})
    try:
        try:
            welcome, ws = session.join(config.device)
        except JoinError as e:
            log.error("%s", e)
            return e.code
        spec = ws.spec
        welcome_info = {CODE_DIGEST: get_scalars(welcome.info).get(CODE_DIGEST, "")}  # the PS's, to clients
        tell = _TellParent(session, lambda: hub.data_sizes())
        hub = ParentHub(HubConfig(node_id, spec, ws.topology, welcome.run_id, welcome_info, security), meter,
                        missing, listener=tell)
        pending.serve(hub)
        # its scatters give their model's pages back once sent (edge/comm.py; issue 19)
        spills = spiller(get_algorithm(spec.algorithm.name), spec.transport.spill_model_bytes)
        comm = EdgeComm(node_id, ws.topology, missing, hub, spec, peers=session.peers, security=security,
                        up=session.post_up, spills=spills)
        comm.peer_client.epoch = session.epoch  # its posts say which PS incarnation they were sent under
        ctx = NodeContext(node_id=node_id, role="edge", ws=ws, comm=comm)  # binds comm to ctx
        try:
            got = session.keep_state(ctx, store, meter)
        except (RuntimeError, OSError) as e:
            log.error("%s: %s", node_id, e)
            return ExitCode.RUN_MISMATCH
        if got.tag is not None:
            log.info("%s: state restored from round %d (%s)", node_id, got.tag + 1, got.source)
        log.info("%s: joined run %s on %s, serving on %s; waiting for %d clients", node_id, welcome.run_id,
                 ws.device, address, len(hub.children))
        absent = hub.wait_ready(0.9 * spec.transport.join_timeout_s)
        if absent:
            log.warning("%s: clients that did not join: %s", node_id, absent)
        sizes = hub.start()
        heap.settle(f"{node_id}: {len(hub.children) - len(absent)} children joined")  # (common/heap.py)
        ctx.sizes = {**sizes, node_id: sum(sizes.values())}
        service.serve(ctx, on_received=lambda c, rnd: store.save(c, welcome.run_id, tag=rnd),
                      on_post=session.deliver_post)  # a neighbour's post runs in this edge's task loop
        tell.announce()  # only now: the PS may start a round that reaches this edge from its neighbours

        def bye(finished: bool) -> None:
            reason = "run finished" if finished else "the run ended without finishing (the PS was lost)"
            hub.shutdown(spec.transport.rpc_timeout_s if finished else 2.0, finished=finished, reason=reason)

        code = session.serve(ctx, on_bye=bye, report=lambda: (meter.rows(), missing.entries),
                             before_task=lambda t, budget_s: _before_task(comm, node_id, t, budget_s))
        comm.close()
        log.info("%s: leaving run %s: %s (exit code %d)", node_id, welcome.run_id,
                 "the run finished" if code == ExitCode.OK else describe(code), code)
        return code
    finally:
        session.close()
        server.stop(grace=1.0).wait(5.0)


def _before_task(comm: EdgeComm, node_id: str, round_idx: int | None, budget_s: float) -> None:
    """Before each task from the PS, a quiet point: the heap tidied (common/heap.py), then the scatters'
    deadlines (``NetComm.begin_task``)."""
    heap.tidy(f"{node_id}: before a task")
    comm.begin_task(round_idx, budget_s)
