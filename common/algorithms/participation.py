"""Client participation models (FOCUS spec, section 4; Ying, Li, Yang, "Exact and Linear Convergence for
Federated Learning under Arbitrary Client Participation is Attainable", arXiv 2503.20117, Assumption 1).

The server draws the participating set S_r of round r itself, from its own RNG streams: the per-client
parameters (p_i, q_i, ...) from ``ctx.np_rng("participation", "static")`` once, and round r's draw from
``ctx.np_rng("participation", r)``. The draw is therefore a pure function of (seed, round, chain state), the
same on every engine. Models:

- ``full``: S_r = all clients (Case 1, p_i = 1).
- ``uniform``: m of N uniformly without replacement (Case 3a, p_i = m/N).
- ``bernoulli``: ACTIVE participation (Case 2): client i joins independently with probability p_i; |S_r| is
  random and may be 0. p_i is given or drawn once from groups of uniform ranges; the default groups are
  FOCUS Fig. 9's "bern" scheme: 90% of clients p_i ~ U(0.1, 0.3), the other 10% p_i ~ U(0.1, 0.9).
- ``weighted``: PASSIVE participation (Case 3): m clients drawn without replacement by successive sampling
  from the categorical q (as ``numpy.random.choice(N, m, replace=False, p=q)`` does, spec pitfall 10); q is
  given or drawn once as q_i ~ U(0, 1) + offset, normalised (the Fig. 4 notebook's recipe).
- ``markov``: a two-state Markov chain per client, P(1 -> 1) = p_stay, P(0 -> 1) = p_join_i (not covered by
  the paper's theory, Sec. 5.3). Stationary participation frequency p_join / (1 - p_stay + p_join).
- ``cyclic``: deterministic blocks of m consecutive clients in turn (spec 7.3).
- ``trace``: a recorded rounds x clients 0/1 table (CSV or .npy) replayed row by row.

Client-decided participation (FOCUS's ``decided_by = "client"``): instead of the server drawing S_r, every
client i draws its own availability each round from its own process (:class:`ClientAvailability`: ``full``,
``bernoulli``, ``markov`` or ``trace``, the models that are per-client by nature), from its own streams
``ctx.np_rng("availability", "static")`` (p_i, once) and ``ctx.np_rng("availability", r)`` (round r). Its
availability in round r is therefore a pure function of (seed, client id, r), whatever messages reached it.

A plain float f (FedAvg's historical option) means "uniform, m = max(1, round(f N))" and is drawn exactly as
:func:`fedhop.common.algorithms.fedavg.sample_participants` draws it, so float specs keep their old streams.

This module also holds the family's answer to "what does a missing participant mean" for algorithms with
persistent client state (FOCUS's last gradient, SCAFFOLD's c_i): a reply that did not arrive is treated as
if the client had not participated. The server remembers (client, round) of every lost reply and names it
in the next task it sends to that client (``args["rollback"]``); the client then restores the state it had
before that round (:class:`ClientLedger`). Without this, a lost FOCUS push would break the tracking invariant
y = sum_i g_i for good.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel

from fedhop.common.options.participation import (  # noqa: F401  (re-exported: the options live in fedhop.common.options)
    CLIENT_DECIDABLE,
    FIG9_BERN_GROUPS,
    BernoulliParticipation,
    CyclicParticipation,
    FullParticipation,
    MarkovParticipation,
    Participation,
    ParticipationModel,
    ProbGroup,
    TraceParticipation,
    UniformParticipation,
    WeightedParticipation,
)
from fedhop.common.wire.bundle import Bundle, clone

if TYPE_CHECKING:
    from fedhop.common.engine.api import NodeContext, NodeId, Scalar


# A float in (0, 1] is FedAvg's "fraction of clients per round" (uniform m = max(1, round(f N))).


# -- the sampling processes (pure numpy; the engine-facing helper is `participants`) -----------------------

def group_probabilities(groups: list[ProbGroup], n: int, rng: np.random.Generator) -> np.ndarray:
    """p_i for n clients: consecutive blocks of floor(fraction * n) clients per group (the last group takes
    the rest), each p_i ~ U(low, high) drawn in client order."""
    p = np.empty(n)
    start = 0
    for k, g in enumerate(groups):
        stop = n if k == len(groups) - 1 else min(n, start + int(g.fraction * n))
        p[start:stop] = rng.uniform(g.low, g.high, size=stop - start)
        start = stop
    return p


def group_index(groups: list[ProbGroup], n: int, i: int) -> int:
    """The group client ``i`` (of n, client-id order) falls in, as :func:`group_probabilities` assigns them."""
    start = 0
    for k, g in enumerate(groups):
        stop = n if k == len(groups) - 1 else min(n, start + int(g.fraction * n))
        if start <= i < stop:
            return k
        start = stop
    raise ValueError(f"client index {i} is outside the {n} clients the groups cover")


def _per_client(v: float | list[float], n: int, what: str) -> np.ndarray:
    if isinstance(v, list):
        if len(v) != n:
            raise ValueError(f"{what} has {len(v)} entries for {n} clients")
        return np.asarray(v, dtype=float)
    return np.full(n, float(v))


@dataclass
class ParticipationProcess:
    """One run's participation process: static per-client parameters plus (Markov) the chain state."""

    model: Any
    n: int
    p: np.ndarray | None = None  # bernoulli p_i / markov p_join_i
    q: np.ndarray | None = None  # weighted q_i
    p_init: np.ndarray | None = None  # markov initial-state probabilities
    on: np.ndarray | None = None  # markov: who participated last round
    table: np.ndarray | None = None  # trace: the recorded rounds x clients table
    rounds_drawn: int = 0

    @classmethod
    def build(cls, model: Any, n: int, rng: np.random.Generator) -> ParticipationProcess:
        """Draw the static per-client parameters once (``rng`` = the server's static stream)."""
        proc = cls(model, n)
        if isinstance(model, BernoulliParticipation):
            proc.p = (_per_client(model.p, n, "p") if model.p is not None
                      else group_probabilities(model.groups, n, rng))
        elif isinstance(model, WeightedParticipation):
            q = _per_client(model.q, n, "q") if model.q is not None else rng.random(n) + model.q_offset
            proc.q = q / q.sum()
        elif isinstance(model, MarkovParticipation):
            proc.p = (_per_client(model.p_join, n, "p_join") if model.p_join is not None
                      else model.join_scale * group_probabilities(model.groups, n, rng))
            proc.p_init = rng.uniform(model.init_low, model.init_high, size=n)
        elif isinstance(model, TraceParticipation):
            proc.table = model.table()
            if proc.table.shape[1] != n:
                raise ValueError(f"trace {model.path} has {proc.table.shape[1]} columns for {n} clients")
        return proc

    def sample(self, round_idx: int, rng: np.random.Generator) -> np.ndarray:
        """Indices (sorted) of the participants of round ``round_idx``; ``rng`` is that round's stream."""
        m, n = self.model, self.n
        if isinstance(m, FullParticipation):
            mask = np.ones(n, dtype=bool)
        elif isinstance(m, UniformParticipation):
            mask = np.zeros(n, dtype=bool)
            mask[rng.choice(n, size=min(m.m, n), replace=False)] = True
        elif isinstance(m, BernoulliParticipation):
            assert self.p is not None
            mask = rng.random(n) < self.p
        elif isinstance(m, WeightedParticipation):
            assert self.q is not None
            mask = np.zeros(n, dtype=bool)
            mask[successive_sample(self.q, min(m.m, n), rng)] = True
        elif isinstance(m, MarkovParticipation):
            assert self.p is not None and self.p_init is not None
            u = rng.random(n)
            mask = u < self.p_init if self.on is None else np.where(self.on, u < m.p_stay, u < self.p)
            self.on = mask
        elif isinstance(m, CyclicParticipation):
            mask = np.zeros(n, dtype=bool)
            mask[(round_idx * m.m + np.arange(min(m.m, n))) % n] = True
        elif isinstance(m, TraceParticipation):
            assert self.table is not None
            rows = self.table.shape[0]
            if round_idx >= rows and not m.wrap:
                raise IndexError(f"trace {m.path} has {rows} rows; round {round_idx} is past its end")
            mask = self.table[round_idx % rows]
        else:
            raise TypeError(f"unknown participation model {m!r}")
        self.rounds_drawn += 1
        return np.flatnonzero(mask)

    def inclusion_probabilities(self) -> np.ndarray | None:
        """P(i in S_r) in the long run where it has a closed form (None for passive weighted sampling)."""
        m, n = self.model, self.n
        if isinstance(m, FullParticipation):
            return np.ones(n)
        if isinstance(m, UniformParticipation | CyclicParticipation):
            return np.full(n, min(m.m, n) / n)
        if isinstance(m, BernoulliParticipation):
            return self.p
        if isinstance(m, MarkovParticipation):
            assert self.p is not None
            return self.p / (1.0 - m.p_stay + self.p)
        if isinstance(m, TraceParticipation):
            assert self.table is not None
            return self.table.mean(axis=0)  # the replayed frequency (exact over whole passes of the table)
        return None


def successive_sample(q: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """m distinct indices: each draw picks i with probability q_i / (sum of q over the not-yet-drawn)."""
    avail = np.ones(len(q), dtype=bool)
    out = np.empty(m, dtype=np.int64)
    for j in range(m):
        w = np.where(avail, q, 0.0)
        cdf = np.cumsum(w)
        i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        i = min(i, len(q) - 1)
        while not avail[i]:  # guards the measure-zero boundary case cdf[i] == u * total
            i -= 1
        out[j] = i
        avail[i] = False
    return out


@dataclass
class ClientAvailability:
    """Client i's own availability process (client-decided participation), part of the client's state.

    - ``full``: always available.
    - ``bernoulli``: available in round r iff u_r < p_i, u_r ~ U(0, 1) from the client's round-r stream; p_i is
      the model's p (or p[i]), or drawn once from the client's group (``groups``, client-id order).
    - ``markov``: the two-state chain of :class:`MarkovParticipation`: round 0 available w.p. p_init_i; then
      P(1 -> 1) = p_stay, P(0 -> 1) = p_join_i. Rounds a client did not hear of are drawn when it next hears
      (and a round asked again is answered the same), so its state at round r depends only on (seed, id, r).
    - ``trace``: column i of the recorded table, row r (row r mod rows with ``wrap``).
    """

    model: Any
    index: int  # i: the client's position among all clients (client-id order)
    n: int
    p: float = 1.0  # bernoulli p_i / markov p_join_i
    p_init: float = 1.0  # markov: P(available in round 0)
    on: bool | None = None  # markov: the chain's state in round ``drawn``
    drawn: int = -1  # the last round drawn
    column: np.ndarray | None = None  # trace: this client's column of the table

    @classmethod
    def build(cls, model: Any, index: int, n: int, rng: np.random.Generator) -> ClientAvailability:
        """Client ``index`` of ``n``'s process; ``rng`` is the client's static stream (used for p_i only)."""
        if not isinstance(model, CLIENT_DECIDABLE):
            raise ValueError(f"participation kind {getattr(model, 'kind', model)!r} cannot be decided by each "
                             "client alone; use full, bernoulli, markov or trace")
        av = cls(model, index, n)
        if isinstance(model, BernoulliParticipation):
            if model.p is not None:
                av.p = float(_per_client(model.p, n, "p")[index])
            else:
                g = model.groups[group_index(model.groups, n, index)]
                av.p = float(rng.uniform(g.low, g.high))
        elif isinstance(model, MarkovParticipation):
            if model.p_join is not None:
                av.p = float(_per_client(model.p_join, n, "p_join")[index])
            else:
                g = model.groups[group_index(model.groups, n, index)]
                av.p = model.join_scale * float(rng.uniform(g.low, g.high))
            av.p_init = float(rng.uniform(model.init_low, model.init_high))
        elif isinstance(model, TraceParticipation):
            table = model.table()
            if table.shape[1] != n:
                raise ValueError(f"trace {model.path} has {table.shape[1]} columns for {n} clients")
            av.column = table[:, index].astype(bool)
        return av

    def available(self, round_idx: int, rng_of: Any) -> bool:
        """Is the client available in round ``round_idx``? ``rng_of(r)`` is its stream for round r."""
        m = self.model
        if isinstance(m, FullParticipation):
            return True
        if isinstance(m, TraceParticipation):
            assert self.column is not None
            rows = len(self.column)
            if round_idx >= rows and not m.wrap:
                raise IndexError(f"trace {m.path} has {rows} rows; round {round_idx} is past its end")
            return bool(self.column[round_idx % rows])
        if isinstance(m, BernoulliParticipation):
            return bool(rng_of(round_idx).random() < self.p)
        assert isinstance(m, MarkovParticipation)
        if round_idx < self.drawn:  # a round asked again after a rollback (resume): replay the chain from 0
            self.on, self.drawn = None, -1
        for r in range(self.drawn + 1, round_idx + 1):
            u = rng_of(r).random()
            self.on = bool(u < self.p_init) if self.on is None else bool(u < (m.p_stay if self.on else self.p))
        self.drawn = round_idx
        return bool(self.on)


@dataclass
class ParticipationState:
    """The server's participation process, part of its explicit state (None until the first draw)."""

    process: ParticipationProcess | None = None


def participants(ctx: NodeContext, participation: float | BaseModel, state: ParticipationState | None = None,
                 pool: tuple[NodeId, ...] | None = None) -> list[NodeId]:
    """S_r for the current round ``ctx.round`` among ``pool`` (default: the node's children), canonical order.

    A participation model's process (static parameters, Markov chain state) lives in ``state``.
    """
    pool = tuple(ctx.topology.sort(pool if pool is not None else ctx.children))
    if isinstance(participation, float | int):
        from fedhop.common.algorithms.fedavg import sample_participants

        return sample_participants(ctx, pool, float(participation))
    if state is None:
        raise ValueError("a participation model needs the server's ParticipationState")
    proc = state.process
    if proc is None or proc.model != participation or proc.n != len(pool):
        proc = ParticipationProcess.build(participation, len(pool), ctx.np_rng("participation", "static"))
        state.process = proc
    idx = proc.sample(ctx.round, ctx.np_rng("participation", ctx.round))
    return [pool[int(i)] for i in idx]


# -- missing participants for clients with persistent state ----------------------------------------------

@dataclass
class ServerLedger:
    """Server side: the clients whose last reply was lost, and the round of that reply."""

    lost: dict[str, int] = field(default_factory=dict)

    def args_for(self, targets: list[NodeId]) -> dict[str, Scalar]:
        """Control scalar naming the lost (client, round) pairs among ``targets``: "client-3@17,client-5@20"."""
        return {"rollback": ",".join(f"{t}@{self.lost[t]}" for t in targets if t in self.lost)}

    def settle(self, round_idx: int, targets: list[NodeId], arrived: Collection[NodeId]) -> None:
        """``arrived``: the targets whose reply (push) reached the server; the others' rounds are lost."""
        for t in targets:
            if t in arrived:
                self.lost.pop(t, None)
            else:
                self.lost[t] = round_idx


@dataclass
class LedgerSnapshot:
    """A client's state fields as they were before round ``round``."""

    round: int
    before: dict[str, Any]


class ClientLedger:
    """Client side: keeps the state of before each round so that a lost reply can be undone.

    Call :meth:`begin` at the start of a task: it rolls back first if the server names this client's last
    round, then snapshots the fields of ``ctx.state`` it will modify. ``ctx.state`` has a ``ledger`` field.
    """

    @staticmethod
    def begin(ctx: NodeContext, args: dict[str, Scalar], keys: tuple[str, ...]) -> None:
        st = ctx.state
        lost = dict(item.split("@") for item in str(args.get("rollback", "")).split(",") if item)
        snap: LedgerSnapshot | None = st.ledger
        if snap is not None and lost.get(ctx.node_id) == str(snap.round):
            for k in keys:
                setattr(st, k, snap.before[k])
        st.ledger = LedgerSnapshot(ctx.round, {k: _copy(getattr(st, k)) for k in keys})


def _copy(v: Bundle | None) -> Bundle | None:
    return None if v is None else clone(v)
