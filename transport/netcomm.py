"""The networked :class:`~fedhop.common.engine.api.Comm` of one node (the PS or an edge): a scatter becomes
Task messages on the children's sessions (:class:`~fedhop.transport.session.ParentHub`), a hand-off and a
describe become ``Edge`` calls to a neighbour (:class:`~fedhop.transport.peer.PeerClient`).

Round boundaries (:meth:`NetComm.begin_round`): children that became ready since the last boundary (late
joiners, re-joined nodes) are admitted, and ``ctx.sizes`` is refreshed from what the hub knows.

Deadlines nest: a node that was given a budget by its parent (the Task's deadline_s, see
:meth:`NetComm.begin_task`) closes its own scatters early enough to answer in time:
``min(its own deadline, time left - transport's margin)``.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from fedhop.common.engine.api import NodeId, Post, Reply, Scalar, get_algorithm
from fedhop.common.engine.base import BaseComm, Failure, MissingLog, PostFilter, Settle
from fedhop.common.engine.size_claims import size_claim_error
from fedhop.common.spec import RunSpec
from fedhop.common.topology import Topology
from fedhop.common.wire.bundle import Bundle
from fedhop.common.wire.codec import CodecError, PayloadSink
from fedhop.common.wire.fold import StreamingFold
from fedhop.common.wire.messages import on_host, to_device
from fedhop.common.wire.scalars import get_scalars
from fedhop.transport.child import PostUp, post_out
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.peer import PeerClient
from fedhop.transport.reply_gate import ReplyGate, Stream
from fedhop.transport.session import Call, ParentHub
from fedhop.v1 import fedhop_pb2 as pb


class NetComm(BaseComm):
    """The networked Comm of one node (the PS or an edge)."""

    def __init__(self, node: NodeId, topology: Topology, missing: MissingLog, hub: ParentHub, spec: RunSpec,
                 peers: Mapping[NodeId, str] | None = None, security: Security = PLAINTEXT,
                 up: PostUp | None = None) -> None:
        super().__init__(node, topology, missing)
        self.up = up  # posts to this node's parent (an edge's session; the PS has none)
        self.hub = hub
        self.meter = hub.meter
        self.transport = spec.transport
        self.peers = peers if peers is not None else {}
        self.peer_client = PeerClient(node, hub.meter, missing, spec.transport, self.peers, security)
        hub.wire.dialed = lambda: self.peers  # this node's hand-off connections are its to read (wire level)
        self._begun: int | None = None  # the round begin_round last ran for
        self._budget_end: float | None = None  # monotonic time by which this node's parent wants its answer
        self._budget_s = 0.0
        self._submitted: dict[NodeId, tuple[Call | Failure, float]] = {}  # submit(): the call, its expiry
        self._owner: dict[int, NodeId] = {}  # id() of each call in _submitted -> its node
        # a heap of the submitted calls' (expiry, seq, node, call id): no reference to a call (nor to its reply)
        self._expiries: list[tuple[float, int, NodeId, int]] = []
        self._seq = 0  # ties in _expiries
        self._arrived: queue.Queue[Call | Failure] = queue.Queue()  # finished submitted calls, in arrival order
        self._expect: Mapping[str, torch.Tensor] | None = None  # the scatter's expect: checked at reply headers
        self._fold: Any = None  # the scatter's fold: replies stream into it chunk by chunk when it can take them

    def current_round(self) -> int:
        return self.ctx.round if self.ctx is not None else -1

    # -- round boundaries and budgets -----------------------------------------------------------------------
    def begin_round(self, round_idx: int) -> None:
        """Admit the children that became ready and refresh ``ctx.sizes`` (the PS: every subtree's size; an
        edge: its clients' and its own total)."""
        super().begin_round(round_idx)
        self._begun = round_idx
        sizes = self.hub.admit()
        if self.ctx is None:
            return
        if self.node == self.topology.server:
            self.ctx.sizes = self.topology.subtree_sizes(sizes)
        else:
            self.ctx.sizes = {**sizes, self.node: sum(sizes.values())}

    def begin_task(self, round_idx: int | None, budget_s: float) -> None:
        """A task from this node's parent starts: a round boundary for this node, and ``budget_s`` (the time
        left of the deadline its parent gave; 0 = none) bounds its own scatters."""
        self.begin_round(round_idx if round_idx is not None else self.current_round())
        self._budget_s = budget_s
        self._budget_end = time.monotonic() + budget_s if budget_s > 0 else None

    def scatter_deadline(self, deadline_s: float | None) -> float:
        own = deadline_s if deadline_s is not None else self.transport.round_deadline_s
        if self._budget_end is None:
            return own
        margin = self._budget_s - self.transport.nested_deadline(self._budget_s)
        return max(0.0, min(own, self._budget_end - time.monotonic() - margin))

    def _round_deadline(self, deadline_s: float | None) -> tuple[int, float]:
        """The round a call belongs to (its first call marks the round's start when the engine did not) and the
        deadline it gets (:meth:`scatter_deadline`)."""
        rnd = self.current_round()
        if self._begun != rnd:
            self.begin_round(rnd)
        return rnd, self.scatter_deadline(deadline_s)

    def _send(self, t: NodeId, task: str, snapshot: Bundle, args: dict[str, Scalar], rnd: int, deadline: float,
              expect: Any, gate: ReplyGate | None = None) -> Call | Failure:
        """One Task to the child ``t``: a node that is away first gets transport.rejoin_grace_s to come back; a
        child that lost the state the run depends on is left out (:meth:`lost_state`)."""
        self.hub.await_link(t)
        return self.lost_state(t) or self.hub.call(t, task, snapshot, args, rnd, deadline, gate=gate, expect=expect)

    # -- scatter ----------------------------------------------------------------------------------------------
    def scatter(self, to: Sequence[NodeId], task: str, bundle: Bundle | None = None,
                args: Mapping[str, Scalar] | None = None, *, expect: Mapping[str, torch.Tensor] | None = None,
                **kw: Any) -> dict[NodeId, Reply]:
        """``BaseComm.scatter``; its ``expect`` also goes with every call, so that a reply whose bundle header
        announces other names, shapes or dtypes is refused before its bytes are read (issue 20)."""
        self._expect, self._fold = expect, kw.get("fold")
        try:
            return super().scatter(to, task, bundle, args, expect=expect, **kw)
        finally:
            self._expect = self._fold = None

    def _exchange(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                  deadline_s: float | None, quorum: int | None = None) -> dict[NodeId, Reply | Failure]:
        rnd, deadline = self._round_deadline(deadline_s)
        snapshot = on_host(bundle)
        sent: dict[NodeId, Any] = {}
        with self.hub.calls.sharing_encoding():  # the calls share ``snapshot``: it is encoded once
            for t in targets:
                sent[t] = self._send(t, task, snapshot, args, rnd, deadline, self._expect)
        end = time.monotonic() + deadline
        why = f"no reply within the deadline of {deadline:g}s"
        if quorum is not None and _wait_quorum([c for c in sent.values() if not isinstance(c, Failure)], quorum, end):
            end, why = time.monotonic(), f"late: the call closed at its quorum of {quorum}"
        out: dict[NodeId, Reply | Failure] = {}
        device = self.ctx.device if self.ctx is not None else torch.device("cpu")
        for t, c in sent.items():
            if isinstance(c, Failure):
                out[t] = c
                continue
            if not c.done.wait(max(0.0, end - time.monotonic())):
                self.hub.expire(c, why)  # a silent Failure
            r = c.result
            assert r is not None
            out[t] = Reply(to_device(r.bundle, device), r.scalars) if isinstance(r, Reply) else r
            if isinstance(r, Reply):  # what it said of its state when it (re-)joined is settled now
                self.hub.hello_info.get(t, {}).pop("state_round", None)
        return out

    def _exchange_settling(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                           deadline_s: float | None, settle: Settle) -> None:
        """A folding scatter: replies are admitted by a :class:`ReplyGate` (the next one to fold plus
        ``transport.reply_window`` more) and settled in canonical order as they complete, each dropped once
        folded. A reply whose Result frame came before the deadline is waited for as much longer as the gate held
        its bundle back, at most ``transport.rpc_timeout_s`` (``Call.wait_settled``)."""
        rnd, deadline = self._round_deadline(deadline_s)
        snapshot = on_host(bundle)
        gate = ReplyGate(self.transport.reply_window, self._streaming(self._fold))
        sent: deque[tuple[NodeId, Any]] = deque()  # popped from the left as settled (a list's pop(0) is O(n))
        with self.hub.calls.sharing_encoding():  # the calls share ``snapshot``: it is encoded once
            for t in targets:
                sent.append((t, self._send(t, task, snapshot, args, rnd, deadline, self._expect, gate)))
        del snapshot
        end = time.monotonic() + deadline
        device = self.ctx.device if self.ctx is not None else torch.device("cpu")
        try:
            while sent:
                t, c = sent.popleft()
                if isinstance(c, Failure):
                    settle(t, c)
                    continue
                if not c.wait_settled(end, self.transport.rpc_timeout_s):  # a held-back reply: Call.wait_settled
                    self.hub.expire(c, f"no reply within the deadline of {deadline:g}s")
                r, c.result = c.result, None
                assert r is not None
                if isinstance(r, Reply):
                    self.hub.hello_info.get(t, {}).pop("state_round", None)
                    r = Reply(to_device(r.bundle, device), r.scalars)
                settle(t, r)
                del r
                gate.settled(c.call_id)
        finally:
            gate.open()

    def _streaming(self, fold: Any) -> Stream | None:
        """How the reply at the head of a folding scatter streams into ``fold`` chunk by chunk (issue 19), when
        ``fold`` can take it so (:class:`StreamingFold`) and this node aggregates on the CPU: a reply whose
        scalars or size claims ``BaseComm.scatter`` would reject is not streamed (it comes whole and is rejected
        there, with the same words)."""
        device = self.ctx.device if self.ctx is not None else torch.device("cpu")
        if not isinstance(fold, StreamingFold) or device.type != "cpu":
            return None

        def stream(node: NodeId, head: pb.Frame, header: pb.BundleHeader) -> PayloadSink | None:
            try:
                scalars = get_scalars(head.result.scalars)
            except CodecError:
                return None
            sizes = getattr(self.ctx, "sizes", None)
            if sizes is not None and node not in sizes or size_claim_error(self.topology, node, scalars, sizes):
                return None
            self.model_sent()  # a reply streams into the aggregate: the model sent may leave memory (spill.py)
            return fold.sink(node, scalars, header)

        return stream

    # -- submit / collect: replies taken in the order they arrive --------------------------------------------------
    def _start(self, to: NodeId, task: str, bundle: Bundle, args: dict[str, Scalar],
               deadline_s: float | None) -> None:
        rnd, deadline = self._round_deadline(deadline_s)
        p = self._pending.get(to)  # BaseComm.submit records the task's expect before it starts it
        with self.hub.calls.sharing_encoding():
            c = self._send(to, task, on_host(bundle), args, rnd, deadline, p.expect if p is not None else None)
        if isinstance(c, Failure):
            self._submitted_as(to, c, time.monotonic())
            self._arrived.put(c)
            return
        expiry = time.monotonic() + deadline
        self._submitted_as(to, c, expiry)
        self._seq += 1
        heapq.heappush(self._expiries, (expiry, self._seq, to, c.call_id))
        c.on_finish = lambda c=c: self._arrived.put(c)
        if c.done.is_set():  # finished before on_finish was set: _next_done skips a second entry
            self._arrived.put(c)

    def _submitted_as(self, node: NodeId, c: Call | Failure, expiry: float) -> None:
        old = self._submitted.get(node)
        if old is not None:
            self._owner.pop(id(old[0]), None)
        self._submitted[node] = (c, expiry)
        self._owner[id(c)] = node

    def _in_flight(self, node: NodeId, call_id: int) -> Call | None:
        """``node``'s submitted call ``call_id`` while it is not collected (None: collected, or another call)."""
        entry = self._submitted.get(node)
        c = entry[0] if entry is not None else None
        return c if isinstance(c, Call) and c.call_id == call_id else None

    def _next_done(self, deadline_s: float | None) -> tuple[NodeId, Reply | Failure] | None:
        """The next submitted call to finish (``BaseComm._next_done``): O(log n) per reply, not O(calls in flight):
        the calls whose expiry passed are popped from a heap and given up on, the next expiry is the heap's top."""
        end = time.monotonic() + (deadline_s if deadline_s is not None else self.transport.round_deadline_s)
        while True:
            now = time.monotonic()
            heap = self._expiries
            while heap and (heap[0][0] <= now or self._in_flight(heap[0][2], heap[0][3]) is None):
                expiry, _, node, cid = heapq.heappop(heap)
                call = self._in_flight(node, cid) if expiry <= now else None
                if call is not None and not call.done.is_set():
                    self.hub.expire(call, "no reply within the deadline of its submitted task")
            soonest = min(end, heap[0][0]) if heap else end
            try:
                c = self._arrived.get(timeout=max(0.0, soonest - now))
            except queue.Empty:
                if time.monotonic() >= end:
                    return None
                continue
            node = self._owner.get(id(c))
            if node is None or self._submitted[node][0] is not c:  # a second entry, or a call of another collect
                continue
            del self._submitted[node]
            del self._owner[id(c)]
            r = c if isinstance(c, Failure) else c.result
            assert r is not None
            if isinstance(r, Reply):
                self.hub.hello_info.get(node, {}).pop("state_round", None)
                device = self.ctx.device if self.ctx is not None else torch.device("cpu")
                r = Reply(to_device(r.bundle, device), r.scalars)
            return node, r

    def drain(self) -> None:
        """Wait for the submitted tasks nobody collected (each until its deadline): their replies are counted;
        one that failed (its node died, or it missed its deadline) is in the missing log, with the round it was
        submitted in (its node missed that task even though the protocol no longer waited for it)."""
        pending = dict(self._pending)
        super().drain()
        for node, (c, expiry) in list(self._submitted.items()):
            if isinstance(c, Call) and not c.done.wait(max(0.0, expiry - time.monotonic())):
                self.hub.expire(c, "no reply within the deadline of its submitted task (the run ended)")
            r = c if isinstance(c, Failure) else c.result
            p = pending.get(node)
            if isinstance(r, Failure) and p is not None:
                self.missing.add(p.round, self.node, node, p.task, f"{r.reason} (a submitted task not collected "
                                 "before the run ended)")
        self._submitted.clear()
        self._owner.clear()
        self._expiries.clear()

    def unanswered(self, node: NodeId, round_idx: int, reason: str) -> None:
        """A silent child: after transport.drop_after_missed such rounds in a row its session is closed."""
        self.hub.missed(node, round_idx, reason)

    def lost_state(self, node: NodeId) -> Failure | None:
        """A child whose algorithm keeps state and that came back (restarted) with state older than its last
        reply this node accepted has lost state the run depends on (FOCUS: its g_i is part of y): it is left
        out of the run from then on, as a missing participant, and said so, never silently used."""
        said = self.hub.hello_info.get(node, {}).get("state_round")
        last = self.last_ok.get(node)
        if said is None or last is None or int(said) >= last or self.ctx is None:
            return None
        if get_algorithm(self.ctx.spec.algorithm.name).node_state(self.topology.role(node)) is None:
            return None
        return Failure(f"{node} came back with state from round {int(said) + 1 if int(said) >= 0 else 'none'}, "
                       f"but its last accepted reply was in round {last + 1}: it lost state this run depends on "
                       "and is left out (restart it with its --state-dir to keep it in)", left_out=True)

    # -- edge -> edge -------------------------------------------------------------------------------------------
    def hand_off(self, to: NodeId, slot: str, bundle: Bundle, scalars: Mapping[str, Scalar] | None = None) -> None:
        self._check_peer(to)
        began = time.perf_counter()
        try:
            self.peer_client.hand_off(to, slot, bundle, dict(scalars or {}), self.current_round())
        finally:
            self.clock().add(self.current_round(), self.node, "transfer", time.perf_counter() - began, peer=to)

    def describe(self, peers: list[NodeId]) -> dict[NodeId, dict[str, Scalar]]:
        out: dict[NodeId, dict[str, Scalar]] = {}
        rnd = self.current_round()
        for p in self.topology.sort(peers):
            self._check_peer(p)
            facts = self.peer_client.describe(p, rnd)
            if facts is not None:
                out[p] = facts
        return out

    # -- posts -------------------------------------------------------------------------------------------------
    def _post(self, route: str, to: NodeId, task: str, bundle: Bundle, args: dict[str, Scalar], rnd: int) -> None:
        post_out(self, self.up, self.peer_client, route, to, task, bundle, args, rnd)

    def _receive_deadline(self, deadline_s: float | None) -> float:
        return deadline_s if deadline_s is not None else self.transport.round_deadline_s

    def _next_post(self, want: PostFilter, end: float) -> Post | None:
        """The mailbox's first post ``want`` matches, waited for until ``end``. A receive from one ``sender``
        stops early when that child's session is gone and not back within ``transport.rejoin_grace_s`` (as a
        scatter to it fails): a node that is down posts nothing."""
        got = None
        while got is None and time.monotonic() < end:
            got = self.hub.mailbox.take(want, min(end, time.monotonic() + 0.25) if want.sender else end)
            if got is None and want.sender is not None and not self._reachable(want.sender):
                got = self.hub.mailbox.take(want, 0.0)  # it may have posted just before it went
                break
        if got is None or not got.bundle:
            return got
        device = self.ctx.device if self.ctx is not None else torch.device("cpu")
        return replace(got, bundle=to_device(got.bundle, device))

    def _reachable(self, node: NodeId) -> bool:
        """Whether ``node``'s session works, or comes back within ``transport.rejoin_grace_s``."""
        link, _ = self.hub.await_link(node)
        return link is not None and link.alive and link.ready.is_set()

    def close(self) -> None:
        self.peer_client.close()


def _wait_quorum(calls: list[Call], quorum: int, end: float) -> bool:
    """Wait until ``quorum`` of ``calls`` have a reply (True), or every call is done or ``end`` passed (False).
    A reply counts when it arrives; one that scatter then rejects (a bad bundle) counted all the same."""
    changed = threading.Event()
    for c in calls:
        c.on_finish = changed.set
    while True:
        changed.clear()
        if sum(isinstance(c.result, Reply) for c in calls if c.done.is_set()) >= quorum:
            return True
        left = end - time.monotonic()
        if all(c.done.is_set() for c in calls) or left <= 0:
            return False
        changed.wait(left)
