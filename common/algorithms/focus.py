"""FOCUS and SG-FOCUS: Federated Optimization with exact Convergence via pUsh-pull Strategy.

B. Ying, Z. Li, H. Yang, "Exact and Linear Convergence for Federated Learning under Arbitrary Client
Participation is Attainable", arXiv 2503.20117 (NeurIPS 2025); docs/specs/focus.md sections 3.3 and 3.5.

Algorithm 1 (client/server form), one round r with participating set S_r:

    server -> i in S_r:  PULL x_r                              (d floats; the tracker y is never pulled)
    client i:            x_0 = x_r, y_0 = 0
                         for t = 0..tau-1:
                             x_t = x_{t-1} - eta y_t            (t >= 1: tau-1 effective local moves)
                             y_{t+1} = y_t + grad f_i(x_t) - grad f_i(x_{t-1})
                                                               (grad f_i(x_{-1}) := g_i, the stored LAST
                                                                gradient, persistent across rounds, init 0)
                         g_i <- grad f_i(x_{tau-1})
    client i -> server:  PUSH y_tau                            (d floats)
    server:              y_{r+1} = y_r + sum_{i in S_r} y_tau,i (a SUM, never an average: spec pitfall 7)
                         x_{r+1} = x_r - eta y_{r+1}

In the paper's matrix form (eq. 13-14; the switched order of eq. 65-68 in the proofs) this is
x_{k+1} = R_k (x_k - eta D_k y_k), y_{k+1} = C_k (y_k + grad f(x_{k+1}) - grad f(x_k)), with the row-stochastic
pull R(S_r) (eq. 4: row i in S_r copies the server's row 0) and the column-stochastic push C(S_r) = R(S_r)^T
(the server's row sums the participants'). On the wire, the two are distinct message kinds: the task's request
is counted as ``pull`` (x down) and its reply as ``push`` (y_tau up), per link, in both engines.

The server needs no participation statistics. Invariant (spec 3.4.1): y = sum_i g_i after every round, which is
1^T y_k = 1^T grad f(x_k) of the matrix form (C_k column stochastic). The local direction grad f_i(x_t) - g_i
vanishes at the fixed point x*, g_i = grad f_i(x*) (spec 3.4.6).

Who decides S_r (``decided_by``):
- ``"server"`` (default): the PS draws S_r from the participation model (participation.py) and pulls to S_r.
- ``"client"``: arbitrary participation as it happens (Assumption 1: I_i ~ client i's own process, unknown to
  the server). The PS calls every client (``focus.open``, no tensors); each client draws its availability
  I_i(r) from its own model and its own seeded stream (participation.ClientAvailability) and answers only if
  available; the server closes the call at ``round_close.deadline_s`` or once ``round_close.quorum`` clients
  answered, and S_r = those who answered. With ``round_close.absent = "say"`` an unavailable client answers
  "away" at once instead of staying silent, so the call closes as soon as every client has answered (a round
  with an absent client no longer waits for its deadline); S_r, the models and the payload are the same.
  Then pull / push as above. Reproducibility: a client's I_i(r) is a
  pure function of (seed, client id, r), so both engines see the same S_r, the same models and the same bytes,
  PROVIDED every available client answers within the deadline and the quorum is 0 (wait for the deadline) or
  not smaller than the number of available clients in any round. With a smaller quorum the networked S_r is
  "the first Q to answer" (arrival order) while the in-process one is the first Q in client order: the runs
  may differ (both still keep the tracking invariant); the run records which answered (``arrivals``), and the
  in-process replay of it (``fedhop simulate --replay``) is bit-identical.

Who starts the messages (``flow``, with ``decided_by = "client"``, flat only): ``"server"`` (default) as above,
the PS's call and the push as the reply to its pull task; ``"client"`` (the paper's flow, issue 16): a client
posts its own ``focus.pull`` for its next available round (and, with ``absent = "say"``, one saying it is away
for each round before it), the PS's round r takes one intent per client from its mailbox (closing once every
client was heard from, or at the deadline), answers each pull with x_r (``focus.train``), and the client POSTS
``focus.push`` with y_tau, then its next intents. Same draws, S_r, model and payload as the called flow; the
first intents (and those of a resumed PS, or of a client whose push was lost) are started by a kick
(``focus.join``, control). docs/focus-wire.md.

Through an edge tier (``topology.edges > 0``): C(S_r) factors into two column-stochastic sums, C = C_PS C_edge:
each edge sums its clients' pushes (canonical client order) and pushes ONE vector to the PS, which sums the
edges' (canonical edge order). A product of column-stochastic matrices is column stochastic, so the tracking
invariant still holds exactly; the server trajectory equals the flat run's up to the association of the sum
(floating point: ~1e-16 relative per round, not bit-identical). The PS receives one d-vector per edge with a
participant instead of one per participant. S_r is the flat run's: the PS draws it over all clients
(server-decided), or each edge calls its own clients (client-decided; the edges report who answered).

SG-FOCUS (App. E, Alg. 2): every gradient is a stochastic gradient on a fresh mini-batch, and the "previous"
gradient is the STORED one, never re-evaluated on the new batch (spec pitfall 8). Here: ``batch_size > 0``.

Choices the paper leaves open (options, spec defaults):
- ``empty_round``: a round with S_r empty is skipped ("the code skips such rounds", spec 4): no messages,
  server state unchanged, the round counter still advances (the round is reported with the same model).
  ``"step"`` instead applies Algorithm 1 literally (x -= eta y with the unchanged y), which is what the matrix
  form (spec 3.2) does.
- ``init``: ``"zero"`` is Algorithm 1's own init (g_i = 0, y = 0), used in the experiments. ``"matched"`` is
  the matrix form's init (spec 3.4.5): a virtual full round with tau = 1 before round 0, i.e. every client
  computes g_i = grad f_i(x0), y = sum_i g_i and x = x0 - eta y: the engine's set-up step, whose messages are
  counted under round index SETUP_ROUND (-1). It involves every client, whoever decides participation.
- A participant whose push does not arrive is treated as a non-participant: its g_i is rolled back at its
  next pull (participation.ServerLedger / ClientLedger), which keeps y = sum_i g_i exact. An edge none of whose
  clients' pushes arrived fails its task instead of pushing zeros (the same y), so that a round in which no
  client trained is not counted as trained (``transport.min_participants``).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from fedhop.common.algorithms.local import loss_and_grad, sample_batch
from fedhop.common.algorithms.participation import (
    ClientAvailability,
    ClientLedger,
    LedgerSnapshot,
    ParticipationState,
    ServerLedger,
    participants,
)
from fedhop.common.engine.api import (
    Algorithm,
    Comm,
    NoAnswer,
    NodeContext,
    NodeId,
    Reply,
    Scalar,
    register,
    task,
)
from fedhop.common.options.focus import FocusOptions, RoundClose, SGFocusOptions, check_spec  # noqa: F401  (re-exported)
from fedhop.common.wire.bundle import Bundle, axpy, clone, weighted_sum, zeros_like

if TYPE_CHECKING:
    pass

PULL, PUSH = "pull", "push"  # the meter kinds of a FOCUS task's request (x down) and reply (y_tau up)


def local_tracker(ctx: NodeContext, x: Bundle, g_prev: Bundle, tau: int, eta: float, batch_size: int,
                  gen: torch.Generator) -> tuple[Bundle, Bundle]:
    """The client's tau-step routine (Alg. 1 lines 6-10); returns y_tau and the last gradient computed."""
    xt = clone(x)
    y = zeros_like(x)
    for t in range(tau):
        if t > 0:
            xt = axpy(-eta, y, xt)  # x_t = x_{t-1} - eta y_t
        xb, yb = sample_batch(ctx.data, batch_size, gen)
        _, g = loss_and_grad(ctx.ws, xt, xb, yb)
        y = {k: y[k] + g[k] - g_prev[k] for k in y}  # y_{t+1} = y_t + grad f_i(x_t) - grad f_i(x_{t-1})
        g_prev = g
    return y, g_prev


@dataclass
class ClientState:
    """Client i: g_i, the last gradient it computed (None = 0 before its first round), the ledger, and (client-
    decided participation) its own availability process."""

    g: Bundle | None = None
    ledger: LedgerSnapshot | None = None
    availability: ClientAvailability | None = None


def node_state(role: str) -> ClientState | None:
    return ClientState() if role == "client" else None


@task("focus.local", kinds=(PULL, PUSH))
def focus_local(ctx: NodeContext, x: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: the request PULLs x (counted as ``pull``); the reply PUSHes y_tau (counted as ``push``)."""
    ClientLedger.begin(ctx, args, ("g",))
    st: ClientState = ctx.state
    g_prev = st.g if st.g is not None else zeros_like(x)
    gen = ctx.rng("focus.local", ctx.round)
    o: FocusOptions = ctx.opts
    y, st.g = local_tracker(ctx, x, g_prev, int(args["local_steps"]), o.lr, o.batch_size, gen)
    return Reply(y)


@task("focus.edge", kinds=(PULL, PUSH))
def focus_edge(ctx: NodeContext, x: Bundle, args: dict[str, Scalar]) -> Reply:
    """Edge: pull x to its clients among ``args["clients"]``, and push ONE vector up: the sum of the y_tau that
    arrived, in canonical client order (the edge's C_edge, column stochastic); ``pushed`` names them."""
    mine = set(ctx.children)
    chosen = [c for c in str(args["clients"]).split(",") if c in mine]
    fwd: dict[str, Scalar] = {"local_steps": args["local_steps"], "rollback": args.get("rollback", "")}
    replies = ctx.comm.scatter(chosen, "focus.local", x, fwd, expect=x)
    if chosen and not replies:  # no client of its trained: the edge is a missing participant, not a zero push
        raise RuntimeError(f"{ctx.node_id}: no push of its clients {chosen} arrived (see missing.csv)")
    total = weighted_sum((1.0, r.bundle) for r in replies.values()) if replies else zeros_like(x)
    return Reply(total, {"pushed": ",".join(replies)})


@task("focus.open")
def focus_open(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """The call of a round (``decided_by = "client"``). A client draws I_i(r) from its own process and answers
    (no tensors) only if available, else stays silent (:class:`NoAnswer`). An edge calls its own clients and
    answers with the ones that did (``available``)."""
    o: FocusOptions = ctx.opts
    if ctx.role == "edge":
        return Reply({}, {"available": ",".join(call_clients(ctx, list(ctx.children)))})
    if not available(ctx, ctx.round):
        if o.round_close.absent == "say":
            return Reply({}, {"away": 1})  # at once: the call need not wait for this client
        raise NoAnswer
    return Reply()


def available(ctx: NodeContext, round_idx: int) -> bool:
    """Client: I_i(round_idx), drawn from its own availability process and its own seeded stream (a pure
    function of (seed, client id, round): a round asked again is answered the same)."""
    o: FocusOptions = ctx.opts
    st: ClientState = ctx.state
    clients = ctx.topology.clients
    if st.availability is None or st.availability.model != o.participation:
        st.availability = ClientAvailability.build(o.participation, clients.index(ctx.node_id), len(clients),
                                                   ctx.np_rng("availability", "static"))
    return st.availability.available(round_idx, lambda r: ctx.np_rng("availability", r))


def call_clients(ctx: NodeContext, pool: list[NodeId]) -> list[NodeId]:
    """Call ``pool`` (clients) for the current round; the ones that answered, in canonical order."""
    close: RoundClose = ctx.opts.round_close
    replies = ctx.comm.scatter(pool, "focus.open", None, {}, deadline_s=close.deadline_s,
                               quorum=close.quorum or None, optional=True)
    return [n for n, r in replies.items() if not r.scalars.get("away")]


# -- flow = "client": the client's own pull and push ---------------------------------------------------------
JOIN, PULL_POST, TRAIN, PUSH_POST = "focus.join", "focus.pull", "focus.train", "focus.push"
# per PS comm (one per PS process, so a resumed PS starts afresh): the clients to kick in its next round
_TO_KICK: weakref.WeakKeyDictionary[Comm, set[NodeId]] = weakref.WeakKeyDictionary()


def announce(ctx: NodeContext, start: int) -> None:
    """Client (``flow = "client"``): post its intents from round ``start`` on, to its parent (the PS): a
    ``focus.pull`` for the first round it is available in (none when that is past the run's end), preceded, with
    ``round_close.absent = "say"``, by one ``focus.pull`` with ``away = 1`` ("I am away") per round it is not.
    Control messages (no tensors). Idempotent: a round's availability is a pure function of (seed, id, round)."""
    o: FocusOptions = ctx.opts
    parent = ctx.topology.parent[ctx.node_id]
    for r in range(start, ctx.spec.rounds):
        if available(ctx, r):
            ctx.comm.post(parent, PULL_POST, None, {}, round=r)
            return
        if o.round_close.absent == "say":
            ctx.comm.post(parent, PULL_POST, None, {"away": 1}, round=r)


@task(JOIN)
def focus_join(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: the kick (control) that (re)starts its chain of intents (:func:`client_pulls` says when the PS
    sends it): the client posts its intents from this round on (:func:`announce`); from then on it posts them
    itself, after each push."""
    announce(ctx, ctx.round)
    return Reply()


@task(PULL_POST, kinds=(PULL, PULL))
def focus_pull(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """A client's pull (or away) for round ``round`` is a post to the PS's mailbox, taken by its round with
    ``receive``; it never runs as a task (registered for its meter kind: ``pull``, control)."""
    raise RuntimeError(f"{ctx.node_id}: {PULL_POST} is posted to the PS, not run as a task")


@task(PUSH_POST, kinds=(PUSH, PUSH))
def focus_push(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """A client's push of y_tau is a post to the PS's mailbox (meter kind ``push``, d values); never run."""
    raise RuntimeError(f"{ctx.node_id}: {PUSH_POST} is posted to the PS, not run as a task")


@task(TRAIN, kinds=(PULL, PULL))
def focus_train(ctx: NodeContext, x: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: x_r answers its pull (the request, kind ``pull``, d values); it runs Alg. 1's local routine (as
    ``focus.local``), POSTS y_tau (``focus.push``: its own message, not a reply), then posts its intents from
    round r+1 on. The reply is an empty acknowledgement (control)."""
    y = focus_local(ctx, x, args).bundle
    ctx.comm.post(ctx.topology.parent[ctx.node_id], PUSH_POST, y, {}, round=ctx.round)
    announce(ctx, ctx.round + 1)
    return Reply()


def client_pulls(ctx: NodeContext) -> list[NodeId]:
    """S_r under ``flow = "client"``: the clients whose pull of round r the PS took before the round closed
    (``round_close.deadline_s``, or once every client pulled or said it is away), in canonical order.

    The round starts with the kick (:func:`focus_join`, control) to the clients whose chain of intents may be
    broken: every client in the first round this PS process runs (fresh or resumed: the intents a killed PS held
    are lost with it); later, a client pulled in the previous round whose push did not arrive (it may have died
    before posting its next intents) and, with ``absent = "say"``, a client not heard from in the previous round.
    A client kicked needlessly posts its intents again; the PS takes one per client and round."""
    clients = list(ctx.topology.clients)
    kick = _TO_KICK.get(ctx.comm, set(clients))
    if kick:
        ctx.comm.scatter(ctx.topology.sort(kick), JOIN, None, {})
    end = time.monotonic() + ctx.opts.round_close.deadline_s  # the networked engine's wait; in-process: none
    heard: set[NodeId] = set()
    pulled: list[NodeId] = []
    while len(heard) < len(clients):
        p = ctx.comm.receive(PULL_POST, round=ctx.round, deadline_s=max(0.0, end - time.monotonic()))
        if p is None:
            break
        if p.sender in heard:  # a pull sent again (a resumed PS's kick and a retried post): one per client
            continue
        heard.add(p.sender)
        if not p.scalars.get("away"):
            pulled.append(p.sender)
    _TO_KICK[ctx.comm] = {c for c in clients if c not in heard} if ctx.opts.round_close.absent == "say" else set()
    return ctx.topology.sort(pulled)


def _answer_pulls(ctx: NodeContext, chosen: list[NodeId], s: ServerState) -> ServerState:
    """``flow = "client"``: send x_r to each client that pulled (the model answers its pull), take the pushes
    they post (by sender and round, canonical order), then y += the sum, x -= eta y (as :func:`_pull_push`)."""
    o: FocusOptions = ctx.opts
    x, y = s.model, s.y
    args: dict[str, Scalar] = {"local_steps": o.local_steps, **s.ledger.args_for(chosen)}
    acks = ctx.comm.scatter(chosen, TRAIN, x, args)
    pushes: list[Bundle] = []
    arrived: set[NodeId] = set()
    for c in chosen:
        if c not in acks:  # its training failed: no push is waited for
            continue
        p = ctx.comm.receive(PUSH_POST, sender=c, round=ctx.round, expect=x)
        if p is not None:
            pushes.append(p.bundle)
            arrived.add(c)
    s.ledger.settle(ctx.round, chosen, arrived)
    _TO_KICK.setdefault(ctx.comm, set()).update(c for c in chosen if c not in arrived)
    if pushes:
        push = weighted_sum((1.0, b) for b in pushes)  # canonical order; a SUM
        y = {k: y[k] + push[k] for k in y}
    x = axpy(-o.lr, y, x)
    return ServerState(x, y, s.participation, s.ledger)


@dataclass
class ServerState:
    """x_r, the tracker y_r (= sum_i g_i after every round, spec 3.4.1), the participation process and the
    ledger of lost pushes."""

    model: Bundle
    y: Bundle
    participation: ParticipationState = field(default_factory=ParticipationState)
    ledger: ServerLedger = field(default_factory=ServerLedger)


def init(ctx: NodeContext) -> ServerState:
    """Algorithm 1's init: x_0, y_0 = 0 (and g_i = 0 on every client)."""
    x = ctx.initial_params()
    return ServerState(x, zeros_like(x))


def setup(ctx: NodeContext, s: ServerState) -> ServerState:
    """Set-up step: with ``init = "matched"`` (spec 3.4.5) a virtual full round with tau = 1 before round 0."""
    if ctx.opts.init != "matched":
        return s
    return _pull_push(ctx, list(ctx.topology.clients), s, local_steps=1)


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """Round r (Alg. 1): S_r (drawn, or called), pull x_r, push y_tau, sum, step."""
    o: FocusOptions = ctx.opts
    if o.flow == "client":
        chosen = client_pulls(ctx)
        if chosen or o.empty_round == "step":
            s = _answer_pulls(ctx, chosen, s)
        if ctx.should_eval():
            ctx.report(**ctx.evaluate(s.model), participants=len(chosen))
        return s
    if o.decided_by == "client":
        chosen = call_round(ctx)
    else:
        chosen = participants(ctx, o.participation, s.participation, pool=ctx.topology.clients)
    if chosen or o.empty_round == "step":
        s = _pull_push(ctx, chosen, s, o.local_steps)
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(s.model), participants=len(chosen))
    return s


def call_round(ctx: NodeContext) -> list[NodeId]:
    """S_r when clients decide: the clients that answered the round's call (through their edges, if any)."""
    topo = ctx.topology
    if not topo.edges:
        return call_clients(ctx, list(ctx.children))
    answered: set[NodeId] = set()
    for e, r in ctx.comm.scatter(list(ctx.children), "focus.open", None, {}).items():
        cluster = set(topo.cluster(e))
        answered.update(c for c in str(r.scalars.get("available", "")).split(",") if c in cluster)
    return topo.sort(answered)


def _pull_push(ctx: NodeContext, chosen: list[str], s: ServerState, local_steps: int) -> ServerState:
    """Pull x to S_r and push back (directly, or through the edges), then y += the sum, x -= eta y."""
    o: FocusOptions = ctx.opts
    x, y, eta = s.model, s.y, o.lr
    args: dict[str, Scalar] = {"local_steps": local_steps, **s.ledger.args_for(chosen)}
    topo = ctx.topology
    if not topo.edges:
        replies = ctx.comm.scatter(chosen, "focus.local", x, args, expect=x)
        arrived: set[NodeId] = set(replies)
    else:
        edges = sorted({topo.parent[c] for c in chosen}, key=topo.ordinal)
        replies = ctx.comm.scatter(edges, "focus.edge", x, {**args, "clients": ",".join(chosen)}, expect=x)
        arrived = set()
        for e, r in replies.items():
            cluster = set(topo.cluster(e))
            arrived.update(c for c in str(r.scalars.get("pushed", "")).split(",") if c in cluster)
    s.ledger.settle(ctx.round, chosen, arrived)
    if replies:
        push = weighted_sum((1.0, r.bundle) for r in replies.values())  # canonical order; a SUM
        y = {k: y[k] + push[k] for k in y}  # y_{r+1} = y_r + sum_{i in S_r} y_tau,i
    x = axpy(-eta, y, x)  # x_{r+1} = x_r - eta y_{r+1}
    return ServerState(x, y, s.participation, s.ledger)


register(Algorithm("focus", FocusOptions, init, server_round, setup=setup, node_state=node_state,
                   check=check_spec))
register(Algorithm("sg-focus", SGFocusOptions, init, server_round, setup=setup,
                   node_state=node_state, check=check_spec))
