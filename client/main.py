"""``fedhop client``: one client process. It needs only its parent's address, its identity and optionally a
data path; the RunSpec comes from the parent's Welcome. :func:`run_client` is one client id's whole life; a
client host (``fedhop clients``, ``client/host.py``) runs :func:`run_client_async`, the same life on the host's
asyncio loop, once per id."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhop.common.engine.api import NodeContext
from fedhop.common.engine.base import MissingLog
from fedhop.common.engine.node_store import NodeStore
from fedhop.common.exit_codes import ExitCode, describe
from fedhop.common.malloc_tuning import fix_mmap_threshold
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.aio_server import LoopServer, make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.child import ChildSession, JoinError, LeafComm
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.peer import EdgeService, PeerClient, advertised
from fedhop.v1 import fedhop_pb2 as pb

if TYPE_CHECKING:
    from fedhop.client.host import HostShare

log = logging.getLogger("fedhop.client")


def run_client(config: NodeConfig) -> int:
    """Join the run at ``config.connect`` (the parent), serve its tasks until Bye; returns the exit code
    (:class:`~fedhop.common.exit_codes.ExitCode`: 0 only when the run finished). ``config.state_dir``: where
    this client saves its state after every task (restored when it restarts); without it, in memory.
    ``config.security``: the credentials of the link to the parent."""
    torch.set_num_threads(1)  # reductions must not depend on the thread count (bit-identical engines)
    fix_mmap_threshold()  # freed chunk buffers go back to the OS (common/malloc_tuning.py)
    store = NodeStore(config.node_id, config.state_dir)
    peers = PeerServer.open(config) if config.listen is not None else None
    if peers is not None and peers.address is None:
        return ExitCode.USAGE
    session = ChildSession(config, "client", address=peers.address or "" if peers is not None else "",
                           info=_hello_info(store))
    try:
        joined = _join(config, session, store, peers, None, None)
        if not isinstance(joined, _Joined):
            return joined
        return _leave(session, joined, session.serve(joined.ctx, report=joined.report))
    finally:
        if peers is not None:
            peers.stop()


async def run_client_async(config: NodeConfig, *, host: HostShare, on_ready: Callable[[str], None]) -> int:
    """:func:`run_client` for an id of a client host, on the host's asyncio loop (the running one), sharing the
    host's Workspace, task lock and workers (``host``); ``on_ready(node_id)``: this id said Ready (it is in the
    run). The same joining, state and tasks, with no thread of its own (the blocking steps run on
    ``host.joins``, its tasks on ``host.workers``). The host sets torch's threads and (once) the mmap threshold."""
    from fedhop.transport.aio_child import AioChildSession

    loop = asyncio.get_running_loop()

    def start() -> tuple[AioChildSession, NodeStore]:
        host.tune_process()
        store = NodeStore(config.node_id, config.state_dir)
        return AioChildSession(config, "client", loop=loop, joins=host.joins, workers=host.workers,
                               info=_hello_info(store), task_lock=host.task_lock, own_connection=True), store

    session, store = await asyncio.wrap_future(host.joins.submit(start, name=config.node_id))
    joined = await session.in_pool(_join, config, session, store, None, host, on_ready)
    if not isinstance(joined, _Joined):
        return joined
    code = await session.serve_async(joined.ctx, report=joined.report)
    return _leave(session, joined, code)


def _hello_info(store: NodeStore) -> dict[str, int]:
    return {"state_round": store.newest_tag() if store.newest_tag() is not None else -1}


class PeerServer:
    """A client's own server for its peers (``Edge.HandOff`` / ``Edge.Describe`` of the peer graph,
    ``topology.peer_graph``): started before the client joins, so that its Hello carries the address its peers
    dial (``config.advertise``, else the listen address)."""

    def __init__(self, server: LoopServer, service: EdgeService, address: str | None) -> None:
        self.server, self.service, self.address = server, service, address

    @classmethod
    def open(cls, config: NodeConfig) -> PeerServer:
        assert config.listen is not None
        service = EdgeService(config.node_id, config.security)
        server = make_loop_server(config.security)  # the Edge service's handlers are coroutines (transport/peer.py)
        service.register(server)
        port = add_port(server, config.listen, config.security)
        if port == 0:
            log.error("%s: cannot listen on %s", config.node_id, config.listen)
            return cls(server, service, None)
        server.start()
        return cls(server, service, advertised(config.listen, port, config.advertise))

    def stop(self) -> None:
        self.server.stop(grace=1.0).wait(5.0)


@dataclass(frozen=True)
class _Joined:
    """A client id in its run: what it serves with (:func:`_join`) and what it says when it leaves."""

    welcome: pb.Welcome
    ctx: NodeContext
    report: Callable[[], tuple[list[dict], list[dict]]] | None


def _join(config: NodeConfig, session: ChildSession, store: NodeStore, peers: PeerServer | None,
          host: HostShare | None, on_ready: Callable[[str], None] | None) -> _Joined | int:
    """Join, load the data and model, restore the state, say Ready: the id is in the run (or its exit code)."""
    node_id = config.node_id
    try:
        welcome, ws = session.join(config.device, config.data_path, host.workspace if host is not None else None)
    except JoinError as e:
        log.error("%s", e)
        session.close()
        return e.code
    has_peers = bool(ws.topology.neighbours.get(node_id))
    if has_peers and peers is None:
        log.error("%s: this run's clients hand models to each other (topology.peer_graph = %s): start %s with "
                  "--listen HOST:PORT (and --advertise HOST:PORT where its peers must dial another address)",
                  node_id, ws.spec.topology.peer_graph, node_id)
        session.close()
        return ExitCode.USAGE
    try:
        n = len(ws.client_data(node_id))
        ws.model  # noqa: B018  (build the architecture now, not inside the first round)
    except (ValueError, OSError) as e:  # bad/missing data files, a model that does not fit the data
        log.error("%s: cannot load its data or model: %s", node_id, e)
        session.close()
        return ExitCode.NODE_SETUP
    meter, missing = ByteMeter(), MissingLog()  # its hand-offs to peers: the caller counts both directions
    peer_client = (PeerClient(node_id, meter, missing, ws.spec.transport, session.peers, config.security)
                   if has_peers else None)
    if peer_client is not None:
        peer_client.epoch = session.epoch  # its posts say which PS incarnation they were sent under
    comm = LeafComm(node_id, ws.topology, missing, peer_client, up=session.post_up)
    ctx = NodeContext(node_id=node_id, role="client", ws=ws, comm=comm, sizes={node_id: n})
    try:
        got = session.keep_state(ctx, store)
    except (RuntimeError, OSError) as e:  # state of another run, or an unreadable state folder
        log.error("%s: %s", node_id, e)
        session.close()
        return ExitCode.RUN_MISMATCH
    if got.tag is not None:
        log.info("%s: state restored from round %d (%s)", node_id, got.tag + 1, got.source)
    if peers is not None and has_peers:  # before Ready: a peer may hand off as soon as the run starts
        # peers' hand-offs land in ctx.inbox (saved with the state after its next task); their posts run in
        # this client's task loop
        peers.service.serve(ctx, on_post=session.deliver_post)
    session.send_ready({node_id: n})
    if on_ready is not None:
        on_ready(node_id)
    log.info("%s: joined run %s under %s with %d samples on %s", node_id, welcome.run_id, welcome.parent_id, n,
             ws.device)
    return _Joined(welcome, ctx, (lambda: (meter.rows(), missing.entries)) if has_peers else None)


def _leave(session: ChildSession, joined: _Joined, code: int) -> int:
    joined.ctx.comm.close()
    session.close()
    log.info("%s: leaving run %s: %s (exit code %d)", joined.ctx.node_id, joined.welcome.run_id,
             "the run finished" if code == ExitCode.OK else describe(code), code)
    return code
