"""Admission: which children a parent hub takes, and when they may get calls.

Hello -> the checks (``checks.py``; then duplicates and late joins) -> Welcome (the RunSpec); Ready (data
sizes, each node's own, bounded, once: :meth:`Admission.ready_refusal`) -> the child is ready; at the next
round boundary (:meth:`Admission.admit`) it is admitted to calls.
A child whose stream broke re-joins with ``Hello.run_id`` set and takes its node's place once its old session
has ended. A Hello for a node whose session is alive is refused (``ERROR_CODE_ALREADY_CONNECTED``), whatever it
carries: under plaintext a run id proves nothing (any newcomer with a free id learns it from its Welcome), so
it must not let one process take over another's session. A re-joining child told so stays on its old stream
when that still works (its parent was only slow) and retries while it ends (``transport/child.py``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from fedhop.common.engine.api import NodeId
from fedhop.common.testhooks import mark, released
from fedhop.common.wire.messages import MessageAssembler
from fedhop.common.wire.scalars import get_scalars, put_scalars
from fedhop.transport.session.checks import Refusal, first_frame_refusal, hello_refusal, reject
from fedhop.transport.session.config import HubConfig, HubListener
from fedhop.transport.session.link import ROLES, ChildLink, Frame, Roster, complain
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.session")


class Admission:
    """Hellos, Readies and the round boundaries at which ready children are admitted to calls."""

    def __init__(self, config: HubConfig, roster: Roster, listener: HubListener,
                 assembler: Callable[[ChildLink], MessageAssembler]) -> None:
        self.config = config
        self.node = config.node
        self.roster = roster
        self.listener = listener
        self.assembler = assembler  # a welcomed child's assembler (the call table's)
        self.started = False  # the run started: later Hellos are late joiners
        self.sizes_at_ready: dict[NodeId, dict[NodeId, int]] = {}  # each child's data sizes at its latest Ready
        self.peers: dict[NodeId, str] = {}  # edge addresses sent with the start
        self.hello_info: dict[NodeId, dict[str, Any]] = {}  # what each child said in its last Hello
        self.declared: dict[NodeId, int] = {}  # each client's data size as first declared (ready_refusal)

    # -- one session's Hello and Ready ----------------------------------------------------------------------
    def hello(self, link: ChildLink, frame: Frame) -> bool:
        """Check the first frame of a session; answer Welcome, or Error and close (False)."""
        refusal = first_frame_refusal(frame)
        if refusal is None:
            refusal = hello_refusal(self.config, link, frame.hello)
        if refusal is not None:
            return reject(self.node, link, refusal)
        hello = frame.hello
        node = hello.node_id
        role = self.config.topology.role(node)
        roster = self.roster
        with roster.changed:
            old = roster.links.get(node)
            if old is not None and old.alive:  # whatever the Hello carries (a run id is no proof under plaintext)
                return reject(self.node, link, Refusal(pb.ERROR_CODE_ALREADY_CONNECTED,
                                                       f"duplicate Hello: {node} is already connected",
                                                       f" (from {old.peer})"))
            if self.started and node not in roster.admitted and not hello.run_id \
                    and self.config.transport.late_join == "refuse":
                return reject(self.node, link, Refusal(
                    pb.ERROR_CODE_LATE_JOIN_REFUSED,
                    f"{node} joined the run after it started, and transport.late_join is 'refuse'",
                    f" (run {self.config.run_id!r})"))
            if old is not None and old is not link:
                old.superseded = True  # its stream ended; its calls stay as they were left
            link.node_id, link.role, link.address = node, role, hello.address
            link.asm = self.assembler(link)
            roster.links[node] = link
            roster.changed.notify_all()
        w = pb.Frame()
        w.welcome.node_id = node
        w.welcome.role = ROLES[role]
        w.welcome.parent_id = self.node
        w.welcome.run_id = self.config.run_id
        w.welcome.spec = self.config.spec_json
        w.welcome.spec_format = "json"
        put_scalars(w.welcome.info, self.config.welcome_info)
        self.hello_info[node] = get_scalars(hello.info)
        link.send([w])
        how = "re-joined" if hello.run_id else ("joined late" if self.started else "joined")
        log.info("%s: %s %s from %s", self.node, node, how, link.peer)
        self.listener.child_joined(node, role)
        return True

    def ready_refusal(self, link: ChildLink, sizes: Mapping[NodeId, int]) -> str | None:
        """Why a Ready's data sizes are refused (None: they are fine). The caller holds the roster's lock.

        A node declares only its own size (a client: itself; an edge: the clients of its cluster, which are its
        children), each at most ``transport.max_data_size``, and once: the size a client was first declared with
        (on any session, by it or its edge) is the one it keeps. Taken at a Hello's word, sizes were weights
        anyone could set: a client claiming 10^12 samples took the model over, and one naming a neighbour's size
        got the neighbour's honest replies rejected. The same rules hold under TLS or tokens."""
        node = link.node_id
        assert node is not None
        own = {node} if link.role == "client" else set(self.config.topology.cluster(node))
        cap = self.config.transport.max_data_size
        for k, n in sizes.items():
            if k not in own:
                whose = "itself" if link.role == "client" else "a client of its cluster"
                return f"{node} declared a data size for {k!r}, which is not {whose}"
            if not 0 <= n <= cap:
                return f"{node} declared {n} samples for {k}, outside [0, transport.max_data_size = {cap}]"
            if self.declared.get(k, n) != n:
                return f"{node} declared {n} samples for {k}, which was declared with {self.declared[k]} before"
        return None

    def ready(self, link: ChildLink, ready: pb.Ready) -> None:
        sizes = {k: int(v) for k, v in ready.data_sizes.items()}
        with self.roster.changed:
            refused = self.ready_refusal(link, sizes)
            if refused is None:
                self.declared.update(sizes)
        if refused is not None:  # the Ready is ignored: the child stays as it was (not ready: not admitted)
            complain(self.node, link, 0, pb.ERROR_CODE_BAD_REQUEST, f"Ready refused: {refused}")
            mark(f"ready-refused-{self.node}-{link.node_id}")
            return
        with self.roster.changed:
            update = link.ready.is_set()
            link.data_sizes = sizes
            if link.node_id is not None:
                self.sizes_at_ready[link.node_id] = dict(link.data_sizes)
            link.ready.set()
            self.roster.changed.notify_all()
        log.info("%s: %s is ready%s (%d clients, %d samples)", self.node, link.name, " (update)" if update else "",
                 len(link.data_sizes), sum(link.data_sizes.values()))
        if link.node_id is not None:
            mark(f"ready-{self.node}-{link.node_id}")  # test hook: the tests await this state, not the log line
            self.listener.child_ready(link.node_id, dict(link.data_sizes))
        if not self.started:
            return
        if not update:
            if link.address and link.node_id not in self.peers:
                self.peers[link.node_id or ""] = link.address  # a late edge / peer client: the others learn it
                for other in self.roster.alive():
                    if other is not link and other.address and other.ready.is_set():
                        other.send([self.start_frame()])
            link.send([self.start_frame()])
        self.listener.sizes_changed()

    # -- the run's start and round boundaries ---------------------------------------------------------------
    def wait_ready(self, timeout_s: float, give_up: Callable[[], str | None] | None = None) -> list[NodeId]:
        """Wait until every child said Ready; returns the children that did not (in canonical order).

        ``give_up``, polled about once a second, ends the wait early when it returns a reason."""
        end = time.monotonic() + timeout_s
        roster = self.roster
        children = self.config.children

        def ready(c: NodeId) -> bool:
            return c in roster.links and roster.links[c].ready.is_set()

        first = 0  # children[:first] were ready when last looked at: each wake-up looks on from the first that was
        # not (one scan of every child per wake-up, and a wake-up per Hello and Ready, was O(n^2) over a join)
        with roster.changed:
            while True:
                while first < len(children) and ready(children[first]):
                    first += 1
                absent = [c for c in children if not ready(c)] if first == len(children) else [children[first]]
                left = end - time.monotonic()
                if not absent or left <= 0 or (give_up is not None and give_up()) or released(f"join-{self.node}"):
                    return [c for c in children if not ready(c)]
                if first == len(children):  # one that was ready is not any more (re-joining): look again from it
                    first = children.index(absent[0])
                roster.changed.wait(min(left, 1.0))

    def data_sizes(self) -> dict[NodeId, int]:
        """Clients' data sizes reported by the ready children (a client: its own; an edge: its cluster's)."""
        out: dict[NodeId, int] = {}
        with self.roster.lock:
            for link in self.roster.links.values():
                if link.ready.is_set():
                    out.update(link.data_sizes)
        return out

    def admit(self) -> dict[NodeId, int]:
        """A round boundary: every ready child may get calls from now on; returns the admitted children's
        data sizes (clients' sizes, as :meth:`data_sizes`), a consistent snapshot with the admission."""
        out: dict[NodeId, int] = {}
        admitted = self.roster.admitted
        with self.roster.lock:
            for n, link in self.roster.links.items():
                if link.ready.is_set() and link.alive and n not in admitted:
                    if self.started:
                        log.info("%s: %s admitted (joined late)", self.node, n)
                        mark(f"admitted-{self.node}-{n}")
                    admitted.add(n)
                if n in admitted and link.ready.is_set():
                    out.update(link.data_sizes)
                elif n in admitted and n in self.sizes_at_ready:
                    # re-joining (Hello seen, Ready not yet): its sizes stay what it reported last, so that a
                    # round begun meanwhile does not see its subtree as empty and reject its reply
                    out.update(self.sizes_at_ready[n])
        return out

    def start(self, peers: Mapping[NodeId, str] | None = None) -> dict[NodeId, int]:
        """The run starts: admit the ready children and tell them (edges: with the edges' addresses)."""
        self.peers = dict(peers or {})
        sizes = self.admit()
        self.started = True
        for link in self.roster.alive():
            if link.ready.is_set():
                link.send([self.start_frame()])
        return sizes

    def start_frame(self) -> pb.Frame:
        f = pb.Frame()
        f.ready.SetInParent()
        for k, v in self.peers.items():
            f.ready.peers[k] = v
        return f

    def peer_addresses(self) -> dict[NodeId, str]:
        """Where the children that listen for their peers are dialled: every edge, and every client of a run
        with client peer links (``topology.peer_graph``)."""
        with self.roster.lock:
            return {n: link.address for n, link in self.roster.links.items() if link.address}
