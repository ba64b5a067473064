"""The engine interface (docs/design.md section 4): what an algorithm may ask of the world.

An algorithm is written once against :class:`Comm` and :class:`NodeContext`:

* its PS side is explicit state and three steps the engine calls (FedJAX's ``ServerState``; NVFlare's
  persist/restore): ``init(ctx) -> S`` (no messages), ``round(ctx, S) -> S`` for every round t = ``ctx.round``
  (the engine owns the round loop and the round counter, checkpoints S after each round and can resume from
  it), and ``final(ctx, S) -> Bundle``; ``setup(ctx, S) -> S`` is an optional set-up step the engine runs once
  before round 0 (round index :data:`SETUP_ROUND`);
* *task handlers* ``handler(ctx, bundle, args) -> Reply`` execute on whichever node receives the task
  (an edge's handler may itself scatter to its clients, or hand the model to a neighbour edge). What a node
  keeps between tasks lives in ``ctx.state``, a typed object made by ``Algorithm.node_state(role)``; with
  ``ctx.public`` and ``ctx.inbox`` it is the node's whole state, saved after every task.

Two engines implement :class:`Comm`: the in-process engine (``inprocess.py``, the oracle) and the
networked one (gRPC between real processes). Given the same RunSpec and seed both must produce
bit-identical models and identical payload bytes per link, so algorithms must: draw randomness only from
``ctx.rng(...)``, aggregate replies in the order ``scatter`` returns them (canonical node order, never
arrival order), and never read the wall clock.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch
from pydantic import BaseModel

from fedhop.common import catalog
from fedhop.common.wire.bundle import Bundle

if TYPE_CHECKING:
    from fedhop.common.data import Dataset
    from fedhop.common.engine.workspace import Workspace
    from fedhop.common.spec import RunSpec
    from fedhop.common.topology import Topology

Scalar = float | int | str | bool
NodeId = str
SETUP_ROUND = -1  # the round index of an algorithm's set-up step (before round 0)


class NoAnswer(Exception):
    """Raised by a task handler whose node chooses not to answer (FOCUS: a client that is not available this
    round). No reply is sent, in either engine: the caller sees silence until its deadline, or its quorum."""


@dataclass(frozen=True)
class Reply:
    """What a task handler returns: tensors (counted as payload) and small scalars (control)."""

    bundle: Bundle = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True)
class Post:
    """A posted message as its receiver takes it (:meth:`Comm.receive`): who sent it, its task (or kind), its
    tensors and scalars, and the round it was posted for (``post``'s ``round``, default the sender's)."""

    sender: NodeId
    task: str
    bundle: Bundle = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)
    round: int = 0


class Comm(Protocol):
    """Communication primitives. Every call is counted by the engine's byte meter."""

    def scatter(
        self,
        to: Sequence[NodeId],
        task: str,
        bundle: Bundle | None = None,
        args: Mapping[str, Scalar] | None = None,
        *,
        expect: Mapping[str, torch.Tensor] | None = None,
        deadline_s: float | None = None,
        fold: Callable[[NodeId, Reply], None] | None = None,
        quorum: int | None = None,
        optional: bool = False,
    ) -> dict[NodeId, Reply]:
        """Send ``task`` with ``bundle`` to each node in ``to`` and gather replies.

        Returns the replies that arrived in time and passed validation, in canonical node order. A node
        that failed, timed out or sent an invalid bundle (non-finite values; names/shapes/dtypes other
        than ``expect``'s, when given) is absent from the result and logged as missing.

        ``fold``: aggregate while the replies arrive. Each usable reply is passed to ``fold(node, reply)`` in
        canonical order, as soon as it and every reply before it are settled, and is owned by ``fold`` (it may
        change the tensors in place); the returned replies then carry their scalars only. The networked engine
        receives at most ``transport.reply_window`` replies beyond the next one to fold at a time, so a node
        holds the aggregate and a few replies rather than every reply (issue 11).
        ``quorum``: stop waiting once that many replies are in (the in-process engine takes the first ones in
        canonical order, the networked one the first to arrive; the others are late and dropped).
        ``optional``: a node that stays silent (its handler raised :class:`NoAnswer`, or no reply before the
        deadline or the quorum) is simply absent, not logged as missing.
        """
        ...

    def hand_off(self, to: NodeId, slot: str, bundle: Bundle, scalars: Mapping[str, Scalar] | None = None) -> None:
        """Node -> neighbour transfer (edge -> edge on the edge graph, client -> client on the peer graph,
        ``topology.peer_graph``), acknowledged; the receiver finds it with ``ctx.take(slot)``. A slot the
        algorithm lists as ``"name/"`` (a prefix) takes one hand-off per sender: ``"name/<sender id>"``.

        Retried per ``transport.handoff_retries``; raises ``HandOffError`` (and logs the peer as missing) when
        the peer cannot take it, so the caller can reroute or keep the bundle."""
        ...

    def describe(self, peers: Sequence[NodeId]) -> dict[NodeId, dict[str, Scalar]]:
        """Small public facts about peers: ``data_size`` plus whatever each put in ``ctx.public``. A peer that
        does not answer is absent from the result and logged as missing."""
        ...

    def submit(self, to: NodeId, task: str, bundle: Bundle | None = None, args: Mapping[str, Scalar] | None = None,
               *, expect: Mapping[str, torch.Tensor] | None = None, deadline_s: float | None = None) -> None:
        """Send ``task`` to the child ``to`` and return at once: asynchronous FL (FedAsync, FedBuff). The reply
        is taken by a later :meth:`collect`, in this round or a later one; ``to`` may not get another submitted
        task before then (:meth:`in_flight`). ``deadline_s`` (default ``transport.round_deadline_s``): after
        that long without a reply the call is given up and its node logged as missing."""
        ...

    def collect(self, k: int, *, deadline_s: float | None = None) -> list[tuple[NodeId, Reply, int]]:
        """Take the next ``k`` usable replies to submitted tasks, in the order they come in: ``(node, reply,
        round submitted)`` each (the staleness of an update is this round minus that). A reply that fails
        validation, or a call given up on, is logged as missing and not counted. Returns fewer than ``k`` when
        nothing more is in flight or ``deadline_s`` (default ``transport.round_deadline_s``) passes first; what
        is still out stays in flight.

        The order is the one thing an engine may choose: the networked engine takes replies as they arrive and
        records the order in the run (``rounds.csv``, column ``arrivals``); the in-process engine orders them by
        a virtual clock (each task takes ``1 / compute`` time units, ``[network.nodes.<id>] compute``; ties in
        submission order), or, with ``fedhop simulate --replay RUN_DIR``, in the order a networked run
        recorded, which reproduces its model bit for bit. Report a round after its last collect."""
        ...

    def in_flight(self) -> tuple[NodeId, ...]:
        """The children working on a submitted task not collected yet (canonical order)."""
        ...

    def post(self, to: NodeId, task: str, bundle: Bundle | None = None, args: Mapping[str, Scalar] | None = None,
             *, round: int | None = None) -> None:
        """Send ``task`` to ``to`` and return without waiting for a reply: the receiver acts on it. ``to`` is
        this node's parent (the message lands in the parent's mailbox, taken by :meth:`receive`) or a neighbour
        (an edge of the edge graph, a peer client of ``topology.peer_graph``: the receiver runs the registered
        handler ``task`` in its own task loop, with its own context, at ``ctx.round = round``; what the handler
        returns is not sent anywhere). ``round``: the round the message belongs to at its receiver (default:
        this node's). A post to a neighbour is acknowledged once the neighbour holds and has validated it; one
        it refuses (an unknown task, a sender that is not its neighbour) or that cannot be delivered raises
        :class:`~fedhop.common.engine.base.PostError` (logged as missing): the caller may reroute. Counted on the
        byte meter under the task's request kind (a post without tensors is a control message)."""
        ...

    def receive(self, task: str, *, sender: NodeId | None = None, round: int | None = None,
                deadline_s: float | None = None, expect: Mapping[str, torch.Tensor] | None = None) -> Post | None:
        """The PS (the driver) takes the next message of kind ``task`` (from ``sender``, of the post's ``round``,
        when given) posted to it, first in, first out; None when none comes before ``deadline_s`` (default
        ``transport.round_deadline_s``): the protocol's missing-participant rule applies (a ``sender`` waited
        for is logged as missing). A message whose
        bundle does not match ``expect`` (names, shapes, dtypes) or is not finite is refused (logged as
        missing) and the next one is waited for. The in-process engine runs the queued posts of other nodes
        in the order they were posted until such a message is there (none left: None at once)."""
        ...


class Reporter(Protocol):
    def __call__(self, round_idx: int, metrics: Mapping[str, Any]) -> None: ...


@runtime_checkable
class BindsContext(Protocol):
    """A :class:`Comm` that reads the context it serves (its round, data sizes, device): every engine's
    (common/engine/base.py ``BaseComm.bind``). :class:`NodeContext` binds it once, when it is constructed."""

    def bind(self, ctx: NodeContext) -> None: ...


@dataclass
class NodeContext:
    """Everything a node's algorithm code may touch. Engines build one per node, around the node's
    :class:`Comm`; the context binds that Comm to itself on construction (:class:`BindsContext`), so neither is
    ever seen half-built."""

    node_id: NodeId
    role: str  # "server" | "edge" | "client"
    ws: Workspace
    comm: Comm
    state: Any = None  # persistent node-local algorithm state (Algorithm.node_state(role)); the PS's is S
    public: dict[str, Scalar] = field(default_factory=dict)  # what describe() tells peers
    inbox: dict[str, tuple[Bundle, dict[str, Scalar]]] = field(default_factory=dict)
    sizes: dict[NodeId, int] = field(default_factory=dict)  # data sizes of this node and its subtree
    round: int = 0  # the round this node is working on (written by the engine only)
    reporter: Reporter | None = None

    def __post_init__(self) -> None:
        if self.state is None and self.role != "server":
            self.state = get_algorithm(self.spec.algorithm.name).node_state(self.role)
        if isinstance(self.comm, BindsContext):
            self.comm.bind(self)  # last: the comm sees a whole context

    # -- the run --------------------------------------------------------------------------------------
    @property
    def spec(self) -> RunSpec:
        return self.ws.spec

    @property
    def opts(self) -> Any:
        return self.ws.options

    @property
    def topology(self) -> Topology:
        return self.ws.topology

    @property
    def device(self) -> torch.device:
        return self.ws.device

    @property
    def children(self) -> tuple[NodeId, ...]:
        return self.topology.children(self.node_id)

    @property
    def neighbours(self) -> tuple[NodeId, ...]:
        return self.topology.neighbours.get(self.node_id, ())

    # -- data and model ----------------------------------------------------------------------------------
    @property
    def data(self) -> Dataset:
        """This client's training partition."""
        if self.role != "client":
            raise RuntimeError(f"{self.node_id} is a {self.role}; only clients hold training data")
        return self.ws.client_data(self.node_id)

    def data_size(self, node: NodeId | None = None) -> int:
        """Samples held by ``node`` (default: this node); for an edge, its cluster's total."""
        node = node or self.node_id
        if node not in self.sizes:
            raise KeyError(f"{self.node_id} does not know the data size of {node}")
        return self.sizes[node]

    def initial_params(self) -> Bundle:
        """The global model's initial parameters, identical on every node (seeded by the spec)."""
        return self.ws.initial_params()

    def evaluate(self, params: Bundle) -> dict[str, float]:
        """Loss and accuracy of ``params`` on the global test set."""
        return self.ws.evaluate(params)

    # -- randomness ---------------------------------------------------------------------------------------
    def rng(self, *keys: int | str) -> torch.Generator:
        """A torch generator for a named stream, derived from (seed, node id, keys)."""
        return self.ws.torch_rng(self.node_id, *keys)

    def np_rng(self, *keys: int | str) -> np.random.Generator:
        return self.ws.np_rng(self.node_id, *keys)

    # -- rounds and hand-offs ------------------------------------------------------------------------------
    def report(self, **metrics: Any) -> None:
        """Record the metrics of the current round (driver only)."""
        if self.reporter is None:
            raise RuntimeError(f"{self.node_id} cannot report: only the driver reports rounds")
        arrivals = getattr(self.comm, "arrivals", None)
        if arrivals:  # the order this round's collects took replies in: what a replay follows
            metrics = {**metrics, "arrivals": " | ".join(arrivals)}
        reported = getattr(self.comm, "reported", None)
        if reported is not None:  # a collect after this in the same round would go unrecorded: refused
            reported(self.round)
        self.reporter(self.round, metrics)

    def should_eval(self) -> bool:
        return (self.round + 1) % self.spec.eval_every == 0 or self.round + 1 == self.spec.rounds

    def take(self, slot: str) -> tuple[Bundle, dict[str, Scalar]]:
        """Remove and return what a neighbour handed off into ``slot``."""
        if slot not in self.inbox:
            raise RuntimeError(f"{self.node_id}: nothing was handed off into slot {slot!r}")
        return self.inbox.pop(slot)


Handler = Callable[[NodeContext, Bundle, dict[str, Scalar]], Reply]


def final_model(ctx: NodeContext, state: Any) -> Bundle:
    """The default ``final``: the state's ``model``."""
    return state.model


def no_node_state(role: str) -> None:
    return None


LinkKind = tuple[NodeId, NodeId, str]  # (src, dst, meter kind)
PayloadFormula = Callable[["RunSpec", "Topology", int], "Mapping[LinkKind, int] | None"]


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: its options, its PS steps over explicit state S, and its node state.

    ``init(ctx) -> S``: S before round 0 (no messages). ``round(ctx, S) -> S``: one round, ``ctx.round`` = t.
    ``final(ctx, S) -> Bundle``: the final model (default ``S.model``; may collect it from an edge).
    ``setup(ctx, S) -> S``: optional set-up step before round 0, run once by the engine at SETUP_ROUND.
    ``node_state(role) -> state``: a fresh edge's / client's ``ctx.state`` (a dataclass, or None).
    """

    name: str
    options: type[BaseModel]
    init: Callable[[NodeContext], Any]
    round: Callable[[NodeContext, Any], Any]
    final: Callable[[NodeContext, Any], Bundle] = final_model
    setup: Callable[[NodeContext, Any], Any] | None = None
    node_state: Callable[[str], Any] = no_node_state
    # summary, needs_edges, check and options are what a spec is validated against: for an algorithm that
    # fedhop.common.catalog lists they must equal its entry there (register() checks; the summary comes from it)
    summary: str = ""
    needs_edges: bool | None = None  # True: needs topology.edges > 0; False: needs edges == 0
    # further checks of a whole spec, run at validation (raise ValueError naming the field to change)
    check: Callable[[RunSpec, Any], None] | None = None
    # round(ctx, S) never changes a tensor of S in place (it builds new ones): the round loop keeps S's tensors
    # by reference for a retry instead of copying them (checked by their version counters when it restores)
    round_replaces_tensors: bool = False
    # the inbox slots its edges hand models into (``Comm.hand_off``); an edge refuses hand-offs into others
    handoff_slots: tuple[str, ...] = ()
    # optional: the protocol's declared payload formula, checked by ``fedhop check``. ``payload_per_round(spec,
    # topology, model_bytes)``: the payload bytes every round sends, per (src, dst, meter kind), for a model of
    # ``model_bytes`` raw bytes; None where the spec is outside what the formula covers (e.g. random participation)
    payload_per_round: PayloadFormula | None = None
    # the client peer graph it needs (``topology.peer_graph``'s default): "none", or "ring" / "random" /
    # "complete" for a protocol whose clients send to each other (``hand_off`` between peers: WRWGD, D-PSGD)
    peers: str = "none"


ALGORITHMS: dict[str, Algorithm] = {}
TASKS: dict[str, Handler] = {}
MESSAGE_KINDS: dict[str, tuple[str, str]] = {}  # task -> (its request's meter kind, its reply's meter kind)


def register(algo: Algorithm) -> Algorithm:
    """Register ``algo``; an algorithm :mod:`fedhop.common.catalog` lists must match its entry there (the spec
    is validated against the catalogue without importing the algorithm)."""
    if algo.name in ALGORITHMS:
        raise ValueError(f"algorithm {algo.name!r} registered twice")
    info = catalog.add_algorithm(algo.name, algo.init.__module__, algo.options, algo.needs_edges, algo.check,
                                 algo.summary, algo.peers)
    algo = replace(algo, summary=info.summary)  # a listed algorithm's one line lives in the catalogue
    ALGORITHMS[algo.name] = algo
    return algo


def task(name: str, *, kinds: tuple[str, str] | None = None) -> Callable[[Handler], Handler]:
    """Decorator: register a task handler under a global name, e.g. ``@task("fedavg.train")``.

    ``kinds``: the meter kinds its request and its reply are counted under (default: both under ``name``),
    e.g. FOCUS's ``("pull", "push")``: the model goes down as a pull, the tracker comes up as a push."""
    def deco(fn: Handler) -> Handler:
        old = TASKS.get(name)
        if old is not None and old is not fn and _where(old) != _where(fn):  # a re-imported module may re-register
            raise ValueError(f"task {name!r} registered twice ({_where(old)} and {_where(fn)})")
        TASKS[name] = fn
        if kinds is not None:
            MESSAGE_KINDS[name] = kinds
        return fn

    return deco


def _where(fn: Handler) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


def meter_kind(task_name: str, phase: str) -> str:
    """The kind a message of ``task_name`` is counted under in the byte meter: the task's own name unless it
    registered ``kinds`` (then its request's or its reply's, by ``phase``)."""
    kinds = MESSAGE_KINDS.get(task_name)
    if kinds is None:
        return task_name
    return kinds[0] if phase == "request" else kinds[1]


def load_algorithms() -> None:
    """Import the module of every algorithm the catalogue lists (by name: the engine does not import the
    algorithms layer above it; an algorithm registers itself and its tasks when its module is imported)."""
    for info in list(catalog.ALGORITHMS.values()):
        importlib.import_module(info.module)


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``, its module imported by name on first use (as every algorithm module
    is: the package imports them all). A user algorithm ``"package.module:NAME"`` is the record NAME of the
    user's module (imported on first use, which registers its tasks), kept under the reference."""
    if ":" in name:
        return _user_algorithm(name)
    if name not in ALGORITHMS:
        importlib.import_module(catalog.algorithm(name).module)  # raises with the list of known names
    return ALGORITHMS[name]


def _user_algorithm(ref: str) -> Algorithm:
    from fedhop.common.engine import state_io
    from fedhop.common.user_code import load_algorithm

    algo = USER_ALGORITHMS.get(ref)
    if algo is None:
        found = load_algorithm(ref)
        if not isinstance(found, Algorithm):
            raise _not_an_algorithm(ref, found)
        state_io.trust_module(ref.partition(":")[0])  # its state classes may be saved and restored
        algo = USER_ALGORITHMS[ref] = found
    return algo


def _not_an_algorithm(ref: str, found: Any) -> ValueError:
    from fedhop.common.user_code import UserCodeError

    return UserCodeError(f"algorithm.name: {ref} is a {type(found).__module__}.{type(found).__qualname__}, not "
                         "a fedhop.api.Algorithm record")


USER_ALGORITHMS: dict[str, Algorithm] = {}  # user algorithms by reference; never in ALGORITHMS (the built-ins)


def get_task(name: str) -> Handler:
    if name not in TASKS:
        load_algorithms()
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}")
    return TASKS[name]
