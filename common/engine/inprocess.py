"""The in-process engine: every node in one Python process, no sockets. Fast, and the oracle.

Calls run sequentially in canonical node order. Every bundle that crosses a "link" is copied, so no node
ever aliases another's tensors, and counted on the same byte meter the networked engine uses.

Posts (``Comm.post``) are scheduled deterministically, first in, first out: a post to a parent lands in its
mailbox at once; a post to a neighbour is queued, and the queue runs (each posted task in its receiver's
context, in the order posted; what a posted task posts joins the end of the queue) only when a parent
``receive`` s and its mailbox holds no matching message, or when the run drains at its end. The order of a
protocol whose decisions do not depend on arrival order is therefore the networked run's too. A queued post
is its receiver's state (an inbox entry ``post:<n>``, as over the network), so a checkpoint carries it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedhop.common import timeline
from fedhop.common.engine.api import (
    NoAnswer,
    NodeContext,
    NodeId,
    Post,
    Reply,
    Scalar,
    get_algorithm,
    get_task,
    meter_kind,
)
from fedhop.common.engine.base import (
    PARENT,
    POST_SLOT,
    BaseComm,
    Failure,
    HandOffError,
    MissingLog,
    PostError,
    PostFilter,
    Settle,
    check_bundle,
    inbox_key,
    post_entry,
    post_of,
    post_seq,
)
from fedhop.common.engine.checkpoint import CheckpointStore
from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.loop import Start
from fedhop.common.engine.results import RunResult
from fedhop.common.engine.run import Run
from fedhop.common.engine.run_checkpoint import load_latest
from fedhop.common.engine.snapshot import restore, snapshot
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec
from fedhop.common.virtual_clock import VirtualClock
from fedhop.common.wire.bundle import Bundle, clone, payload_bytes
from fedhop.common.wire.frames import message_bytes
from fedhop.common.wire.messages import HANDOFF, post_bytes
from fedhop.common.wire.meter import ByteMeter


class FaultPlan:
    """Test hook: make chosen (node, task, round) calls fail as if the node were gone. A post to a neighbour is
    asked about twice, with the round it is posted for: ``(receiver, task, round)`` when it is delivered (down:
    the sender gets a PostError) and ``(receiver, RUN + task, round)`` before it runs (down: it took the post,
    then went down before running it; nobody hears of it)."""

    def __init__(self, dead: Callable[[NodeId, str, int], bool] | None = None) -> None:
        self.dead = dead or (lambda node, task, rnd: False)


RUN = "run:"  # FaultPlan: the task key asked before a queued post runs


@dataclass(frozen=True)
class QueuedPost:
    """A post to a neighbour, queued until the scheduler runs it: its receiver and its inbox key there (the post
    itself is the receiver's inbox entry ``key``, :func:`~fedhop.common.engine.base.post_entry`)."""

    dst: NodeId
    key: str


class InProcessEngine:
    def __init__(self, spec: RunSpec, *, device: str | None = None, faults: FaultPlan | None = None,
                 replay: list[dict[str, Any]] | None = None) -> None:
        # The networked role processes compute with one thread; so does the oracle, so that reductions
        # (matmuls, sums) split the same way and both engines stay bit-identical.
        torch.set_num_threads(1)
        self.spec = spec
        self.ws = Workspace(spec, device)
        self.meter = ByteMeter()
        self.missing = MissingLog()
        self.timeline = timeline.Timeline()  # every node's timing (common/timeline.py): one process, one timeline
        # with a [network] table: each round's time on the profile's network, predicted (common/virtual_clock.py)
        self.vclock = VirtualClock(spec.network, self.timeline) if spec.network is not None else None
        self.faults = faults or FaultPlan()
        # ``replay``: a recorded run's rounds (its ``arrivals`` column): collects take replies in that order, the
        # PS's quorum scatters use the replies it used
        self.replay: dict[int, list[list[tuple[str, bool]]]] | None = None if replay is None else {
            int(r["round"]) - 1: parse_arrivals(str(r["arrivals"])) for r in replay if r.get("arrivals")}
        self.recorded_rounds = frozenset(int(r["round"]) - 1 for r in replay or ())  # the rounds it reported
        topo = self.ws.topology
        self.client_sizes = self.ws.client_sizes()
        sizes = topo.subtree_sizes(self.client_sizes)
        self.nodes: dict[NodeId, NodeContext] = {}
        self.algo = get_algorithm(spec.algorithm.name)
        for n in topo.all_nodes():
            known = {m: sizes[m] for m in (n, *topo.children(n))}
            if n == topo.server:
                known = dict(sizes)
            role = topo.role(n)
            # binds its _LocalComm to itself
            self.nodes[n] = NodeContext(node_id=n, role=role, ws=self.ws, comm=_LocalComm(self, n), sizes=known)
        self.public_defaults = sizes
        self.posts: deque[QueuedPost] = deque()  # posts to neighbours not run yet, in the order posted
        self.post_seq = 0  # the number of the next post to a neighbour (its inbox key)
        self.mailboxes: dict[NodeId, deque[Post]] = {n: deque() for n in self.nodes}  # posts to parents

    @property
    def round(self) -> int:
        return self.nodes[self.ws.topology.server].round

    def run(self, journal: Path | None = None, *, events: RunEvents | None = None, run_id: str | None = None,
            checkpoints: Path | None = None, resume: bool = False,
            after_commit: Callable[[int], None] | None = None) -> RunResult:
        """Run the algorithm through a :class:`~fedhop.common.engine.run.Run`; ``journal``: a JSON-lines file
        that gets each round as it ends.

        ``events``: the run's lifecycle events (a progress bar, the live page: ``server/web/live.py``); every
        node joins and is ready right after ``run_started``. ``run_id``: the run's id (default: a fresh one; a
        resumed run keeps its checkpoint's). ``checkpoints``: a folder that gets the whole run's state (the PS's
        S, every node's state, the byte meter, the missing log and the rounds so far) every
        ``spec.checkpoint_every`` rounds; with ``resume`` the run continues from the newest readable
        checkpoint there. ``after_commit(t)`` (tests) is called after round t's commit."""
        ps = self.nodes[self.ws.topology.server]
        store = CheckpointStore(checkpoints) if checkpoints is not None else None
        start, records = Start(), []
        if resume:
            if store is None:
                raise ValueError("resume needs the checkpoints folder")
            start, records, run_id = self._restore(store, run_id)
        run = Run(self.spec, self.ws.topology, engine="inprocess", meter=self.meter, missing=self.missing,
                  events=events, run_id=run_id, records=records, journal=journal, store=store,
                  snapshots=lambda: {n: snapshot(c) for n, c in self.nodes.items() if n != ps.node_id},
                  after_commit=after_commit, timeline=self.timeline)
        if self.vclock is not None:
            run.events.subscribe(self._predict)
        run.start(resumed_at=start.next_round)
        self._join(run)
        return run.finish(run.drive(self.algo, ps, start))

    def _join(self, run: Run) -> None:
        """Every node is there at once: each child of the PS joins, then the clients behind it, then it is
        ready (the order in which a networked PS hears of them)."""
        topo = self.ws.topology
        for child in topo.children(topo.server):
            run.joined(child, topo.role(child))
            clients = (child,) if topo.role(child) == "client" else topo.children(child)
            run.ready(child, {c: self.client_sizes[c] for c in clients})

    def _predict(self, kind: str, data: dict[str, Any]) -> None:
        """The virtual clock follows the rounds; a round's record gets its ``predicted_round_s``."""
        assert self.vclock is not None
        if kind == "round_started":
            self.vclock.begin_round(int(data["round"]))
        elif kind == "round_ended":
            predicted = self.vclock.end_round()
            if data.get("record"):
                data["record"]["predicted_round_s"] = round(predicted, 6)

    def _restore(self, store: CheckpointStore, run_id: str | None) -> tuple[Start, list[dict[str, Any]], str | None]:
        got, ck = load_latest(store)
        for n, snap in ck.nodes.items():
            restore(self.nodes[n], snap)
        self.meter.merge(ck.meter)
        self.missing.entries[:] = ck.missing
        self.nodes[self.ws.topology.server].comm.last_ok = dict(ck.last_ok)
        queued = sorted((post_seq(k), n) for n, c in self.nodes.items() for k in c.inbox if post_seq(k) >= 0)
        self.posts = deque(QueuedPost(n, f"{POST_SLOT}{seq:012d}") for seq, n in queued)  # the queue at the save
        self.post_seq = queued[-1][0] + 1 if queued else 0
        return Start(int(got.meta["next_round"]), ck.state), list(ck.records), run_id or ck.run_id or None

    # -- one message over a simulated link ----------------------------------------------------------------
    def send(self, src: NodeId, dst: NodeId, kind: str, phase: str, bundle: Bundle,
             scalars: dict[str, Scalar]) -> Bundle:
        """``kind``: the task (or ``handoff`` / ``describe``); counted under its :func:`meter_kind`."""
        chunk = self.spec.transport.chunk_bytes
        began = time.perf_counter()
        size = message_bytes(kind, phase, bundle, scalars, chunk)
        self.meter.record(src, dst, meter_kind(kind, phase), phase, payload_bytes(bundle), size, self.round)
        out = clone(bundle)
        if self.vclock is not None:  # observes only: what it predicts never reaches the math
            self.vclock.message(src, dst, phase, size, began)
        return out


    def send_post(self, src: NodeId, dst: NodeId, task: str, bundle: Bundle, scalars: dict[str, Scalar], *,
                  up: bool, round_idx: int, meter_round: int) -> Bundle:
        """One post over a simulated link (to the parent: a Post frame; to a neighbour: a Task frame and, on
        delivery, its Ack), counted under the task's request kind at ``meter_round`` (where the networked engine
        counts it: the post's round for a post to the parent, counted by the parent; the sender's round for one
        to a neighbour, counted by the sender); returns the receiver's copy of the bundle."""
        size = post_bytes(task, bundle, scalars, self.spec.transport.chunk_bytes, up=up, round_idx=round_idx)
        self.meter.record(src, dst, meter_kind(task, "request"), "request", payload_bytes(bundle), size, meter_round)
        return clone(bundle)

    def run_post(self, q: QueuedPost) -> None:
        """Run one queued post: its task's handler in the receiver's context at the post's round. A handler that
        fails is logged as missing by its node (nobody waits for it); what it returns goes nowhere."""
        ctx = self.nodes[q.dst]
        entry = ctx.inbox.pop(q.key, None)
        if entry is None:
            return
        post, _ = post_of(entry)
        if self.faults.dead(q.dst, RUN + post.task, post.round):  # it took the post, then went down before running
            return
        ctx.round = post.round
        began = time.perf_counter()
        try:
            get_task(post.task)(ctx, post.bundle, dict(post.scalars))
        except NoAnswer:
            pass
        except Exception as e:  # a failing node is a missing node, as over the network
            self.missing.add(self.round, q.dst, q.dst, post.task, f"posted task failed: {type(e).__name__}: {e}")
        finally:
            self.timeline.add(self.round, q.dst, "busy", time.perf_counter() - began)

    def run_posts(self) -> None:
        """Run every queued post, and what they post in turn, until none is left (the run's end)."""
        while self.posts:
            self.run_post(self.posts.popleft())


class ReplayError(RuntimeError):
    """A replayed run took a turn the recorded one did not (a collect's recorded reply is not in flight, or a
    quorum scatter's recorded reply is not there)."""


def parse_arrivals(text: str) -> list[list[tuple[str, bool]]]:
    """A round's ``arrivals`` column (``"client-1:3 client-0:4:failed | client-2:4"``): per collect, the (node,
    usable) it took, in order."""
    out: list[list[tuple[str, bool]]] = []
    for group in text.split("|"):
        entries = []
        for e in group.split():
            node, _, rest = e.partition(":")
            entries.append((node, not rest.endswith(":failed")))
        out.append(entries)
    return out


class _LocalComm(BaseComm):
    def __init__(self, engine: InProcessEngine, node: NodeId) -> None:
        super().__init__(node, engine.ws.topology, engine.missing)
        self.engine = engine
        self.own_clock = engine.timeline
        self.vnow = 0.0  # the virtual clock of this node's submitted tasks (collect's order)
        self._done: dict[NodeId, tuple[float, int, Reply | Failure]] = {}
        self._seq = 0
        self._replay: list[tuple[str, bool]] = []  # the recorded collect being replayed

    # -- submit / collect: a virtual clock, or the order a recorded run took ------------------------------------
    def _start(self, to: NodeId, task: str, bundle: Bundle, args: dict[str, Scalar],
               deadline_s: float | None) -> None:
        """The task runs now (the child is busy with nothing else); its reply is due ``1 / compute`` virtual
        time units later."""
        r = self._one(to, task, bundle, args)
        self._seq += 1
        self._done[to] = (self.vnow + 1.0 / self.engine.spec.network_profile().compute(to), self._seq, r)

    def _begin_collect(self) -> None:
        if self.engine.replay is not None:
            self._replay = self._recorded()

    def _recorded(self) -> list[tuple[str, bool]]:
        """The next recorded entry of this round's ``arrivals`` (a collect's or a quorum scatter's, in the order
        the recorded run made them); none left: an empty one."""
        assert self.engine.replay is not None
        rounds = self.engine.replay
        return rounds[self.engine.round].pop(0) if rounds.get(self.engine.round) else []

    def _next_done(self, deadline_s: float | None) -> tuple[NodeId, Reply | Failure] | None:
        if self.engine.replay is not None:
            if not self._replay:
                return None
            node, usable = self._replay.pop(0)
            if node not in self._done:
                raise ReplayError(f"round {self.engine.round + 1}: the recorded run took a reply of {node} here, "
                                  f"which has no task in flight in the replay (in flight: {sorted(self._done)})")
            _, _, r = self._done.pop(node)
            return node, r if usable else Failure("failed in the recorded run")
        node = min(self._done, key=lambda n: self._done[n][:2])
        due, _, r = self._done.pop(node)
        self.vnow = max(self.vnow, due)
        return node, r

    def drain(self) -> None:
        super().drain()
        self._done.clear()
        self.engine.run_posts()  # over the network every post is delivered and run, waited for or not

    # -- posts: a FIFO scheduler ------------------------------------------------------------------------------
    def _post(self, route: str, to: NodeId, task: str, bundle: Bundle, args: dict[str, Scalar], rnd: int) -> None:
        eng = self.engine
        if route == PARENT:
            received = eng.send_post(self.node, to, task, bundle, args, up=True, round_idx=rnd, meter_round=rnd)
            eng.mailboxes[to].append(Post(self.node, task, received, dict(args), rnd))
            return
        own = self.ctx.round if self.ctx is not None else eng.round  # the sender's round: where it counts
        if eng.faults.dead(to, task, rnd):
            reason = f"post {task} {self.node} -> {to} failed after its retries: {to} is down"
            self.missing.add(own, self.node, to, task, reason)
            raise PostError(reason)
        received = eng.send_post(self.node, to, task, bundle, args, up=False, round_idx=rnd, meter_round=own)
        reason = None
        try:
            get_task(task)
        except KeyError:
            reason = f"unknown task {task!r}"
        reason = reason or check_bundle(received)
        if reason is not None:
            reason = f"{to} refused the post from {self.node}: {reason}"
            self.missing.add(own, self.node, to, task, reason)
            raise PostError(reason)
        eng.meter.record(to, self.node, meter_kind(task, "request"), "reply", 0,
                         message_bytes(HANDOFF, "reply", {}, {}, eng.spec.transport.chunk_bytes), own)
        key = f"{POST_SLOT}{eng.post_seq:012d}"
        eng.post_seq += 1
        eng.nodes[to].inbox[key] = post_entry(Post(self.node, task, received, dict(args), rnd))
        eng.posts.append(QueuedPost(to, key))

    def _next_post(self, want: PostFilter, end: float) -> Post | None:
        """The first matching message in this node's mailbox; while there is none, the next queued post runs
        (none left: None, at once: nothing else can ever post)."""
        box = self.engine.mailboxes[self.node]
        while True:
            for p in box:
                if want(p):
                    box.remove(p)
                    return p
            if not self.engine.posts:
                return None
            self.engine.run_post(self.engine.posts.popleft())

    def current_round(self) -> int:
        return self.engine.round

    def _exchange(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                  deadline_s: float | None, quorum: int | None = None) -> dict[NodeId, Reply | Failure]:
        """Every target runs the task, in canonical order. A handler that raises :class:`NoAnswer` sends
        nothing back. With a ``quorum``, the replies after the first ``quorum`` usable ones are sent (and
        counted) but arrive after the caller stopped waiting: they are late, as over the network. Under a replay,
        the PS's quorum scatter uses the replies the recorded run used instead (:meth:`_replayed_quorum`)."""
        if quorum is not None and self.engine.replay is not None and self.node == self.topology.server:
            return self._replayed_quorum(targets, task, bundle, args, quorum)
        out: dict[NodeId, Reply | Failure] = {}
        ok = 0
        for t in targets:
            r = self._one(t, task, bundle, args)
            if isinstance(r, Reply):
                if quorum is not None and ok >= quorum:
                    r = Failure(f"late: the call closed at its quorum of {quorum}", silent=True)
                else:
                    ok += 1
            out[t] = r
        return out

    def _replayed_quorum(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                         quorum: int) -> dict[NodeId, Reply | Failure]:
        """A quorum scatter as the recorded run's (its entry in the round's ``arrivals``: the replies it used and
        the targets that failed): every target runs the task, in canonical order; a reply the recorded run did not
        use is late, one it saw fail is a failure. A reply it used that this run does not have is a
        :class:`ReplayError`: the replay took another turn."""
        if self.engine.round not in self.engine.recorded_rounds:
            raise ReplayError(f"round {self.engine.round + 1} has no record in the recorded run (its driver did not "
                              f"report it), so which replies its quorum scatter of {task} used is unknown: a protocol "
                              "with a quorum must report every round to be replayed")
        recorded = dict(self._recorded())
        stray = sorted(set(recorded) - set(targets))
        if stray:
            raise ReplayError(f"round {self.engine.round + 1}: the recorded quorum scatter of {task} took replies of "
                              f"{stray}, which this one does not call (targets: {targets})")
        out: dict[NodeId, Reply | Failure] = {}
        for t in targets:
            r = self._one(t, task, bundle, args)
            if t not in recorded:
                if isinstance(r, Reply):
                    r = Failure(f"late: the call closed at its quorum of {quorum}", silent=True)
            elif not recorded[t]:
                r = Failure("failed in the recorded run")
            elif not isinstance(r, Reply):
                raise ReplayError(f"round {self.engine.round + 1}: the recorded quorum scatter of {task} used a reply "
                                  f"of {t}, which gave none in the replay ({r.reason})")
            out[t] = r
        return out

    def _exchange_settling(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                           deadline_s: float | None, settle: Settle) -> None:
        for t in targets:  # each reply is settled (folded) before the next node runs its task
            settle(t, self._one(t, task, bundle, args))

    def scatter(self, *args: Any, **kwargs: Any) -> dict[NodeId, Reply]:  # type: ignore[override]
        """:meth:`BaseComm.scatter`; the virtual clock (with a ``[network]`` table) sees its calls go out together."""
        vc = self.engine.vclock
        if vc is None:
            return super().scatter(*args, **kwargs)
        with vc.scatter(self.node):
            return super().scatter(*args, **kwargs)

    def _one(self, t: NodeId, task: str, bundle: Bundle, args: dict[str, Scalar]) -> Reply | Failure:
        vc = self.engine.vclock
        if vc is None:
            return self._call(t, task, bundle, args)
        with vc.call(self.node, t):
            return self._call(t, task, bundle, args)

    def _call(self, t: NodeId, task: str, bundle: Bundle, args: dict[str, Scalar]) -> Reply | Failure:
        handler = get_task(task)
        if self.engine.faults.dead(t, task, self.engine.round):
            self.engine.send(self.node, t, task, "request", bundle, args)
            return Failure("no reply before the deadline (node down)")
        clock, rnd = self.engine.timeline, self.engine.round
        began = time.perf_counter()
        received = self.engine.send(self.node, t, task, "request", bundle, args)
        sent_at = time.perf_counter()  # the same points as over the network (transport/session/calls.py)
        clock.add(rnd, self.node, "encode_req", sent_at - began)
        ctx = self.engine.nodes[t]
        ctx.round = rnd
        reason = check_bundle(received)
        if reason is not None:
            return Failure(f"{t} rejected the request: {reason}")
        vc = self.engine.vclock
        if vc is not None:
            vc.handler_begin(t)
        arrived = time.perf_counter()
        try:
            reply = handler(ctx, received, dict(args))
        except NoAnswer:
            return Failure("did not answer", silent=True)
        except Exception as e:  # a failing node is a missing node, as over the network
            return Failure(f"{type(e).__name__}: {e}")
        finally:
            clock.add(rnd, t, "busy", time.perf_counter() - arrived)
            if vc is not None:
                vc.handler_end(t)
        del received
        encoding = time.perf_counter()
        back = self.engine.send(t, self.node, task, "reply", reply.bundle, reply.scalars)
        done = time.perf_counter()
        clock.add(rnd, t, "encode", done - encoding)
        clock.add(rnd, t, "served", done - arrived)
        clock.add(rnd, self.node, "rtt", done - sent_at, peer=t)
        return Reply(back, dict(reply.scalars))

    def hand_off(self, to: NodeId, slot: str, bundle: Bundle, scalars: dict[str, Scalar] | None = None) -> None:
        self._check_peer(to)
        if self.engine.faults.dead(to, "handoff", self.engine.round):
            reason = f"hand-off {self.node} -> {to} failed: {to} is down"
            self.missing.add(self.engine.round, self.node, to, "handoff", reason)
            raise HandOffError(reason)
        began = time.perf_counter()
        try:
            self._hand_off(to, slot, bundle, scalars)
        finally:
            self.clock().add(self.engine.round, self.node, "transfer", time.perf_counter() - began, peer=to)

    def _hand_off(self, to: NodeId, slot: str, bundle: Bundle, scalars: dict[str, Scalar] | None) -> None:
        received = self.engine.send(self.node, to, "handoff", "request", bundle, dict(scalars or {}))
        reason = check_bundle(received)
        if reason is not None:
            reason = f"{to} rejected the hand-off from {self.node}: {reason}"
            self.missing.add(self.engine.round, self.node, to, "handoff", reason)
            raise HandOffError(reason)
        self.engine.nodes[to].inbox[inbox_key(slot, self.node)] = (received, dict(scalars or {}))
        self.engine.send(to, self.node, "handoff", "reply", {}, {})

    def describe(self, peers: list[NodeId]) -> dict[NodeId, dict[str, Scalar]]:
        out = {}
        for p in self.topology.sort(peers):
            self._check_peer(p)
            if self.engine.faults.dead(p, "describe", self.engine.round):
                self.missing.add(self.engine.round, self.node, p, "describe", f"{p} is down")
                continue
            self.engine.send(self.node, p, "describe", "request", {}, {})
            facts: dict[str, Scalar] = {"data_size": self.engine.public_defaults[p], **self.engine.nodes[p].public}
            self.engine.send(p, self.node, "describe", "reply", {}, facts)
            out[p] = facts
        return out
