"""What both engines share: target checks, reply validation, the missing-node log, per-round results."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedhop.common import timeline, timing
from fedhop.common.engine.api import NodeContext, NodeId, Post, Reply, Scalar
from fedhop.common.engine.size_claims import SIZE_KEY, size_claim_error
from fedhop.common.topology import Topology
from fedhop.common.wire.bundle import Bundle, non_finite
from fedhop.common.wire.fold import FoldedBundle


class HandOffError(RuntimeError):
    """A hand-off that could not be delivered after its retries."""


class PostError(HandOffError):
    """A post to a neighbour that it refused (an unknown task, a sender that is not its neighbour, a bad bundle)
    or that could not be delivered after its retries; logged as missing. A :class:`HandOffError`, so that code
    rerouting a failed hand-off reroutes a failed post the same way."""


PARENT, PEER = "parent", "peer"  # where a post goes (BaseComm.post_route)


POST_SLOT = "post:"  # inbox entries "post:<sequence number>": posts taken and not run yet (part of the node's state)
_META = ("post.task", "post.sender", "post.round", "post.epoch")


def post_entry(post: Post, epoch: int = -1) -> tuple[Bundle, dict[str, Scalar]]:
    """A post as an inbox entry (``(bundle, scalars)``, saved with the node's state until it runs): its scalars
    prefixed ``arg.``, beside who sent it, its task, its round and the PS incarnation (``epoch``, the round a
    resumed PS resumed at; -1: the first) it was sent under."""
    meta: dict[str, Scalar] = {"post.task": post.task, "post.sender": post.sender, "post.round": post.round,
                               "post.epoch": epoch}
    return post.bundle, {**meta, **{f"arg.{k}": v for k, v in post.scalars.items()}}


def post_of(entry: tuple[Bundle, dict[str, Scalar]]) -> tuple[Post, int]:
    """The post an inbox entry holds (:func:`post_entry`), and its epoch."""
    bundle, meta = entry
    args = {k[4:]: v for k, v in meta.items() if k.startswith("arg.")}
    return (Post(str(meta["post.sender"]), str(meta["post.task"]), bundle, args, int(meta["post.round"])),
            int(meta["post.epoch"]))


def post_seq(key: str) -> int:
    """The sequence number of an inbox key ``post:<n>`` (-1 for any other key)."""
    tail = key[len(POST_SLOT):] if key.startswith(POST_SLOT) else ""
    return int(tail) if tail.isdigit() else -1


@dataclass(frozen=True)
class PostFilter:
    """Which posted message a ``receive`` takes: of kind ``task``, and from ``sender`` / of ``round`` if given."""

    task: str
    sender: NodeId | None = None
    round: int | None = None

    def __call__(self, p: Post) -> bool:
        return p.task == self.task and self.sender in (None, p.sender) and self.round in (None, p.round)


@dataclass(frozen=True)
class Failure:
    """A target that did not produce a usable reply. ``silent``: it did not answer at all (it chose not to, or
    no reply came before the deadline or the quorum), as opposed to answering with an error. ``left_out``: it
    was not asked, being left out of the run (e.g. it came back without state the run depends on): it is
    named in the missing log, but a round is not redone for it (it is not a task sent)."""

    reason: str
    silent: bool = False
    left_out: bool = False


def trained_nothing(scalars: Mapping[str, Any]) -> bool:
    """A reply that says it trained on no sample (its ``n`` is 0: an edge none of whose clients' replies was
    usable). It is still returned to the algorithm, but it is no participant: a round whose usable replies are
    all such does not count as trained under ``transport.min_participants``."""
    n = scalars.get(SIZE_KEY)
    return isinstance(n, int | float) and not isinstance(n, bool) and n == 0


def check_bundle(bundle: Mapping[str, torch.Tensor], expect: Mapping[str, torch.Tensor] | None = None) -> str | None:
    """Why ``bundle`` must be rejected, or None. Checks names/shapes/dtypes against ``expect`` and finiteness.

    A reply folded as it streamed (:class:`~fedhop.common.wire.fold.FoldedBundle`) was checked for NaN/Inf piece
    by piece while it was folded: its ``non_finite`` names the bad tensors (the same names, in the same order, as
    testing its stand-ins would give), so it is not tested a second time."""
    if expect is not None:
        if list(bundle) != list(expect):
            missing = [k for k in expect if k not in bundle]
            extra = [k for k in bundle if k not in expect]
            return f"tensor names differ: missing {missing}, unexpected {extra}"
        for k, v in bundle.items():
            e = expect[k]
            if v.shape != e.shape:
                return f"tensor {k!r} has shape {tuple(v.shape)}, expected {tuple(e.shape)}"
            if v.dtype != e.dtype:
                return f"tensor {k!r} has dtype {v.dtype}, expected {e.dtype}"
    bad = list(bundle.non_finite) if isinstance(bundle, FoldedBundle) else non_finite(bundle)
    if bad:
        return f"non-finite values (NaN/Inf) in {bad}"
    return None


@dataclass
class MissingLog:
    entries: list[dict[str, Any]] = field(default_factory=list)

    def add(self, round_idx: int, by: str, node: str, task: str, reason: str) -> None:
        self.entries.append({"round": round_idx + 1, "by": by, "node": node, "task": task, "reason": reason})


def inbox_key(slot: str, sender: NodeId) -> str:
    """Where a hand-off into ``slot`` lands in the receiver's inbox: ``slot`` itself, or ``slot + sender`` for a
    per-sender slot (one the algorithm lists with a trailing ``/``, e.g. ``"gossip/"`` -> ``"gossip/client-3"``)."""
    return slot + sender if slot.endswith("/") else slot


@dataclass(frozen=True)
class Pending:
    """A submitted task not collected yet: its task, the round it was submitted in, what its reply must hold."""

    task: str
    round: int
    expect: dict[str, torch.Tensor] | None


def quorum_arrivals(targets: Sequence[NodeId], raw: Mapping[NodeId, Reply | Failure], round_idx: int) -> str:
    """A quorum scatter's entry in the round's ``arrivals`` (the format a collect's has): the targets whose reply
    it used (``node:round``) and those that answered with an error (``node:round:failed``), in canonical order.
    Left out: the silent ones (late after the quorum, no reply, or chose not to answer); a replay treats a reply of
    one of those as late."""
    taken = []
    for t in targets:
        r = raw.get(t)
        if isinstance(r, Reply):
            taken.append(f"{t}:{round_idx + 1}")
        elif isinstance(r, Failure) and not r.silent:
            taken.append(f"{t}:{round_idx + 1}:failed")
    return " ".join(taken)


Fold = Callable[[NodeId, Reply], None]  # takes one usable reply of a scatter, in canonical order
Settle = Callable[[NodeId, "Reply | Failure"], None]


class BaseComm(ABC):
    """Implements :class:`~fedhop.common.engine.api.Comm` on top of one engine-specific exchange."""

    can_fail = True  # replies may be missing: the round loop keeps a copy of the state to retry a round from

    def __init__(self, node: NodeId, topology: Topology, missing: MissingLog) -> None:
        self.node = node
        self.topology = topology
        self.missing = missing
        self._ctx: NodeContext | None = None  # the NodeContext this Comm serves: bind(), once
        self.last_ok: dict[NodeId, int] = {}  # round of each child's last usable reply (saved with the state)
        self._sent = self._ok = 0
        self._pending: dict[NodeId, Pending] = {}  # submitted, not collected yet (submit / collect)
        self.arrivals: list[str] = []  # this round's collects, each "node:round ..." in the order taken
        self._reported: int | None = None  # the round the node context last reported
        self.own_clock: timeline.Timeline | None = None  # where its waits are timed (None: its node's, here)
        # the round loop's: lets the pages of the round's starting model go (engine/spill.py; None: nothing to do)
        self.on_model_sent: Callable[[], None] | None = None

    @property
    def ctx(self) -> NodeContext | None:
        """The node context this Comm serves; None until it is bound (:meth:`bind`)."""
        return self._ctx

    def bind(self, ctx: NodeContext) -> None:
        """Serve ``ctx`` (its round, data sizes, device). :class:`NodeContext` calls it when it is constructed
        around this Comm; a second binding is refused: one Comm serves one node's context."""
        if self._ctx is not None:
            raise RuntimeError(f"{self.node}: this Comm already serves a node context; build a new Comm")
        self._ctx = ctx

    def clock(self) -> timeline.Timeline:
        """The timeline this node's waits go to (common/timeline.py)."""
        return self.own_clock if self.own_clock is not None else timeline.recorder(self.node)

    def begin_round(self, round_idx: int) -> None:
        """Called by the round loop before round ``round_idx``; resets the round's counts. Networked engines
        also take in what changed since the last round (late joiners' data sizes)."""
        self._sent = self._ok = 0
        self.arrivals = []
        self._reported = None

    def model_sent(self) -> None:
        """The requests of this node's scatter need not stay in its memory: a reply is about to be folded or
        settled (its child received its request), or the scatter ended. Calls :attr:`on_model_sent`, which the
        round loop points at the spilled starting model's page drop (``spill.py``; safe at any moment and from
        any thread: a request still being sent reads its pages back from the page cache)."""
        hook = self.on_model_sent
        if hook is not None:
            hook()

    def round_counts(self) -> tuple[int, int]:
        """(tasks sent, usable replies) since :meth:`begin_round`; a target of an ``optional`` scatter that stayed
        silent is not counted as sent (it chose not to take part: an empty round is not a failed one)."""
        return self._sent, self._ok

    @abstractmethod
    def current_round(self) -> int: ...

    @abstractmethod
    def _exchange(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                  deadline_s: float | None, quorum: int | None = None) -> dict[NodeId, Reply | Failure]: ...

    def _exchange_settling(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                           deadline_s: float | None, settle: Settle) -> None:
        """Like :meth:`_exchange`, but hands each target's answer to ``settle`` in canonical order, as soon as
        it and every answer before it are in (an engine that streams replies overrides this, so that a folded
        reply's tensors are freed before the later ones arrive). The default waits for all of them."""
        raw = self._exchange(targets, task, bundle, args, deadline_s)
        for t in targets:
            settle(t, raw.get(t, Failure("no reply")))

    def scatter(self, to: Sequence[NodeId], task: str, bundle: Bundle | None = None,
                args: Mapping[str, Scalar] | None = None, *, expect: Mapping[str, torch.Tensor] | None = None,
                deadline_s: float | None = None, quorum: int | None = None, optional: bool = False,
                fold: Fold | None = None) -> dict[NodeId, Reply]:
        """See :meth:`~fedhop.common.engine.api.Comm.scatter`. With ``fold``, each usable reply is passed to
        ``fold(node, reply)`` in canonical order as soon as it and the replies before it are settled (the reply's
        bundle is the caller's to keep or change in place), and the result holds the replies without bundles."""
        children = set(self.topology.children(self.node))
        stray = [t for t in to if t not in children]
        if stray:
            raise ValueError(f"{self.node} can only scatter to its children; {stray} are not among them")
        if len(set(to)) != len(to):
            raise ValueError(f"{self.node}: duplicate targets in scatter: {list(to)}")
        if quorum is not None and quorum < 1:
            raise ValueError(f"{self.node}: a scatter's quorum must be >= 1, got {quorum}")
        if quorum is not None and fold is not None:
            raise ValueError(f"{self.node}: a scatter folds in canonical order or closes at a quorum, not both")
        targets = self.topology.sort(to)
        out: dict[NodeId, Reply] = {}
        silent = 0
        untrained = 0  # usable replies that say they trained on no sample (n = 0): not participants

        def settle(t: NodeId, r: Reply | Failure) -> None:
            nonlocal silent, untrained
            self.model_sent()
            rnd = self.current_round()
            r = self._usable(t, r, expect)
            if isinstance(r, Reply):
                self.last_ok[t] = rnd
                if trained_nothing(r.scalars):  # its clients are in the missing log already (by its edge)
                    untrained += 1
                if fold is None:
                    out[t] = r
                else:
                    fold(t, r)
                    out[t] = Reply({}, r.scalars)
                return
            if (optional and r.silent) or r.left_out:
                silent += 1
                if r.left_out:
                    self.missing.add(rnd, self.node, t, task, r.reason)
                return
            self.missing.add(rnd, self.node, t, task, r.reason)
            if r.silent:
                self.unanswered(t, rnd, r.reason)

        timing.event("scatter", at=self.node, task=task)
        began = time.perf_counter()
        if fold is None:
            if quorum is not None:
                self._check_unreported("a scatter with a quorum")
            raw = self._exchange(targets, task, dict(bundle or {}), dict(args or {}), deadline_s, quorum)
            if quorum is not None:  # which replies it used depends on their arrival: recorded, for a replay
                self.arrivals.append(quorum_arrivals(targets, raw, self.current_round()))
            for t in targets:
                settle(t, raw.get(t, Failure("no reply")))
        else:
            self._exchange_settling(targets, task, dict(bundle or {}), dict(args or {}), deadline_s, settle)
        out = {t: out[t] for t in targets if t in out}
        self.model_sent()
        self.clock().add(self.current_round(), self.node, "wait", time.perf_counter() - began)
        timing.event("scatter_end", at=self.node)
        self._sent += len(targets) - silent  # an optional target that stayed silent was asked, not failed
        self._ok += len(out) - untrained  # a reply of n = 0 (an edge none of whose clients trained) trained no one
        return out

    def _usable(self, t: NodeId, r: Reply | Failure, expect: Mapping[str, torch.Tensor] | None) -> Reply | Failure:
        """``r`` if it is a reply this node may use (its bundle as ``expect`` says and finite, a data size this
        node knows, no size claims about other nodes), else the Failure saying why it was rejected."""
        if not isinstance(r, Reply):
            return r
        # read now, not before the exchange: a networked engine refreshes ctx.sizes when the round begins
        sizes = getattr(self.ctx, "sizes", None)
        reason = check_bundle(r.bundle, expect)
        if reason is None and sizes is not None and t not in sizes:
            reason = f"{self.node} does not know the data size of {t} yet (joined late; admitted at the " \
                     "next round boundary)"
        if reason is None:
            reason = size_claim_error(self.topology, t, r.scalars, sizes)
        return r if reason is None else Failure(f"rejected reply: {reason}")

    # -- asynchronous calls: submit now, collect in the order the replies come in ---------------------------------
    def submit(self, to: NodeId, task: str, bundle: Bundle | None = None, args: Mapping[str, Scalar] | None = None,
               *, expect: Mapping[str, torch.Tensor] | None = None, deadline_s: float | None = None) -> None:
        """See :meth:`~fedhop.common.engine.api.Comm.submit`."""
        if to not in self.topology.children(self.node):
            raise ValueError(f"{self.node} can only submit tasks to its children; {to} is not among them")
        if to in self._pending:
            raise ValueError(f"{self.node}: {to} still works on a task submitted in round "
                             f"{self._pending[to].round + 1}; collect it first (in_flight() lists the busy ones)")
        rnd = self.current_round()
        self._pending[to] = Pending(task, rnd, dict(expect) if expect is not None else None)
        self._start(to, task, dict(bundle or {}), dict(args or {}), deadline_s)

    def reported(self, round_idx: int) -> None:
        """The node context reported round ``round_idx`` (its arrivals are recorded: no collect may follow)."""
        self._reported = round_idx

    def _check_unreported(self, what: str) -> None:
        """Refuse an order-dependent call (``what``) after the round was reported: its record would be lost."""
        if self._reported == self.current_round():
            raise RuntimeError(f"{self.node}: round {self.current_round() + 1} was reported before {what}: "
                               f"report a round after its last collect or quorum scatter (the run records what each "
                               "took)")

    def in_flight(self) -> tuple[NodeId, ...]:
        """The children working on a submitted task that was not collected yet, in canonical order."""
        return tuple(self.topology.sort(self._pending))

    def collect(self, k: int, *, deadline_s: float | None = None) -> list[tuple[NodeId, Reply, int]]:
        """See :meth:`~fedhop.common.engine.api.Comm.collect`."""
        if k < 1:
            raise ValueError(f"{self.node}: collect needs k >= 1, got {k}")
        self._check_unreported("a collect")
        out: list[tuple[NodeId, Reply, int]] = []
        taken: list[str] = []
        began = time.perf_counter()
        self._begin_collect()
        while len(out) < k and self._pending:
            got = self._next_done(deadline_s)
            if got is None:  # this collect's deadline: the calls still out stay in flight
                break
            t, r = got
            p = self._pending.pop(t)
            r = self._usable(t, r, p.expect)
            self._sent += 0 if isinstance(r, Failure) and r.left_out else 1  # as in scatter
            if isinstance(r, Reply):
                self._ok += 0 if trained_nothing(r.scalars) else 1
                self.last_ok[t] = p.round
                out.append((t, r, p.round))
                taken.append(f"{t}:{p.round + 1}")
            else:
                self.missing.add(p.round, self.node, t, p.task, r.reason)
                if r.silent:
                    self.unanswered(t, p.round, r.reason)
                taken.append(f"{t}:{p.round + 1}:failed")
        self.clock().add(self.current_round(), self.node, "wait", time.perf_counter() - began)
        self.arrivals.append(" ".join(taken))
        return out

    def drain(self) -> None:
        """The run ends: wait for the replies to submitted tasks nobody collected (they are received and counted,
        not used), so that both engines count the same bytes. The in-process engine has nothing to wait for."""
        self._pending.clear()

    def _begin_collect(self) -> None:
        """A collect starts (the in-process engine's replay moves to the next recorded collect)."""
        return None

    def _start(self, to: NodeId, task: str, bundle: Bundle, args: dict[str, Scalar],
               deadline_s: float | None) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot submit tasks")

    def _next_done(self, deadline_s: float | None) -> tuple[NodeId, Reply | Failure] | None:
        """The next submitted call to finish, in this engine's order (the networked one: the order the replies
        arrive in; the in-process one: its virtual clock, or the order a replayed run recorded); None when this
        collect's deadline passed first."""
        raise NotImplementedError(f"{type(self).__name__} cannot collect tasks")

    def unanswered(self, node: NodeId, round_idx: int, reason: str) -> None:
        """A task of round ``round_idx`` that ``node`` had to answer got no reply at all (not an optional one).
        A networked engine counts these to drop a child that stays silent; the in-process engine drops no one."""
        return None

    # -- posts: a message that makes its receiver act; the parent's mailbox --------------------------------------
    def post_route(self, to: NodeId) -> str:
        """Where a post from this node to ``to`` goes: :data:`PARENT` (the parent's mailbox) or :data:`PEER` (a
        neighbour runs it). A child, or a node this one has no link to, is refused: a parent sends its
        children work with ``scatter`` or ``submit``."""
        if to == self.topology.parent.get(self.node):
            return PARENT
        if to in self.topology.neighbours.get(self.node, ()):
            return PEER
        if to in self.topology.children(self.node):
            raise ValueError(f"{self.node} cannot post to its child {to}: a parent sends work down with scatter or "
                             "submit")
        raise ValueError(f"{self.node} has no link to {to}: it can post to its parent "
                         f"({self.topology.parent.get(self.node, 'none')}) and to its neighbours "
                         f"{list(self.topology.neighbours.get(self.node, ()))}")

    def post(self, to: NodeId, task: str, bundle: Bundle | None = None, args: Mapping[str, Scalar] | None = None,
             *, round: int | None = None) -> None:
        """See :meth:`~fedhop.common.engine.api.Comm.post`."""
        if not task:
            raise ValueError(f"{self.node}: a post needs a task name")
        route = self.post_route(to)
        own = self.ctx.round if self.ctx is not None else self.current_round()  # the sender's round
        rnd = own if round is None else int(round)
        began = time.perf_counter()
        try:
            self._post(route, to, task, dict(bundle or {}), dict(args or {}), rnd)
        finally:
            self.clock().add(self.current_round(), self.node, "transfer", time.perf_counter() - began, peer=to)

    def _post(self, route: str, to: NodeId, task: str, bundle: Bundle, args: dict[str, Scalar], rnd: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot post")

    def receive(self, task: str, *, sender: NodeId | None = None, round: int | None = None,
                deadline_s: float | None = None, expect: Mapping[str, torch.Tensor] | None = None) -> Post | None:
        """See :meth:`~fedhop.common.engine.api.Comm.receive`."""
        if not self.topology.children(self.node):
            raise RuntimeError(f"{self.node} has no children: nothing is posted to it (receive is a parent's)")
        if sender is not None and sender not in self.topology.children(self.node):
            raise ValueError(f"{self.node} can only receive from its children; {sender} is not among them")
        end = time.monotonic() + self._receive_deadline(deadline_s)
        began = time.perf_counter()
        try:
            while True:
                got = self._next_post(PostFilter(task, sender, round), end)
                if got is None:
                    if sender is not None:  # a post this node waited for from one child: that child is missing
                        of = f" of round {round + 1}" if round is not None else ""
                        self.missing.add(self.current_round(), self.node, sender, task, f"no {task}{of} posted")
                    return None
                reason = check_bundle(got.bundle, expect)
                if reason is None:
                    return got
                self.missing.add(self.current_round(), self.node, got.sender, task, f"refused post: {reason}")
        finally:
            self.clock().add(self.current_round(), self.node, "wait", time.perf_counter() - began)

    def _receive_deadline(self, deadline_s: float | None) -> float:
        """Seconds a receive waits (the networked engine: ``deadline_s`` or ``transport.round_deadline_s``)."""
        return deadline_s if deadline_s is not None else 0.0

    def _next_post(self, want: PostFilter, end: float) -> Post | None:
        """The first message in this node's mailbox that ``want`` matches, taken out of it; None when none came by
        ``end`` (a time.monotonic() time)."""
        raise NotImplementedError(f"{type(self).__name__} cannot receive posts")

    def _check_peer(self, peer: NodeId) -> None:
        if peer not in self.topology.neighbours.get(self.node, ()):
            raise ValueError(f"{peer} is not a neighbour of {self.node}; neighbours: "
                             f"{list(self.topology.neighbours.get(self.node, ()))}")
