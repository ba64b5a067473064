"""Randomized pairwise gossip with local SGD on a client ring, written as a user protocol against ``fedhop.api``
only (after Boyd, Ghosh, Prabhakar & Shah 2006, "Randomized gossip algorithms", synchronous variant).

Every client i keeps its own model x_i (x_i^0 = the initial model). Round t:

    M_t   = a random maximal matching of the peer graph                     (drawn by the PS from its seed)
    y_i   = LocalSGD_i(x_i^t, local_steps)                                 on every client ("gossip.train")
    i -> j: y_i, for each pair (i, j) of M_t, both ways                     (client -> client hand-offs)
    x_i^{t+1} = (y_i + y_j) / 2  if i is matched with j, else y_i           ("gossip.average")

The parameter server never touches a model during training: it draws the matching and sends it to the
clients in two messages without tensors (train, then average). After the last round it collects every x_i
and returns their mean (the run's final model). A partner whose model did not arrive (its hand-off failed, or
it missed the round) is skipped: the client keeps y_i. Each client evaluates its own model every
``eval_every`` rounds; the PS reports the mean over clients. Payload: d floats each way per matched pair and
round, nothing on the PS's links but the final collect.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from fedhop.api import (
    Algorithm,
    Bundle,
    HandOffError,
    NodeContext,
    Reply,
    Scalar,
    local_sgd,
    task,
    weighted_mean,
)

SLOT = "pair/"  # per sender: the partner's model lands in the inbox under "pair/<partner id>"


class Options(BaseModel):
    """``[algorithm.options]`` of the spec, validated like a built-in's."""

    model_config = ConfigDict(extra="forbid")

    local_steps: int = Field(2, ge=1, description="local SGD steps per round before the gossip")
    lr: float = Field(0.05, gt=0, description="client step size")
    batch_size: int = Field(32, ge=0, description="mini-batch size (0 = the whole local set)")


@dataclass
class Peer:
    """A client's state, saved with every checkpoint: its model, and its trained model between the two phases."""

    x: Bundle | None = None
    y: Bundle | None = None
    round: int = -1  # the round of ``y``


@dataclass
class Control:
    """The parameter server's state: it keeps no model."""

    rounds_done: int = 0


def node_state(role: str) -> Peer | None:
    return Peer() if role == "client" else None


def init(ctx: NodeContext) -> Control:
    return Control()


def matching(ctx: NodeContext) -> dict[str, str]:
    """A random maximal matching of the peer graph: client -> partner (both ways), from the PS's seeded stream of
    this round (the links in a random order, each taken when both its ends are still free)."""
    nb = ctx.topology.neighbours
    links = sorted({tuple(sorted((i, j))) for i in ctx.topology.clients for j in nb.get(i, ())})
    order = ctx.np_rng("gossip.matching", ctx.round).permutation(len(links))
    partner: dict[str, str] = {}
    for k in order:
        i, j = links[int(k)]
        if i not in partner and j not in partner:
            partner[i], partner[j] = j, i
    return partner


def encode(pairs: dict[str, str]) -> str:
    """The matching as one scalar argument: "client-0=client-1;client-1=client-0;..." (one message to all)."""
    return ";".join(f"{i}={j}" for i, j in sorted(pairs.items()))


def partner_of(ctx: NodeContext, args: dict[str, Scalar]) -> str:
    """This client's partner in the round's matching ("" when it sits the round out)."""
    pairs = dict(p.split("=") for p in str(args["pairs"]).split(";") if p)
    return pairs.get(ctx.node_id, "")


def _own(ctx: NodeContext) -> Bundle:
    st: Peer = ctx.state
    return st.x if st.x is not None else ctx.initial_params()


@task("gossip.train")
def train(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """Local SGD from x_i, then y_i to the partner (if any)."""
    o: Options = ctx.opts
    st: Peer = ctx.state
    y, loss = local_sgd(ctx, _own(ctx), steps=o.local_steps, lr=o.lr, batch_size=o.batch_size)
    st.y, st.round = y, ctx.round
    partner = partner_of(ctx, args)
    sent = False
    if partner:
        try:
            ctx.comm.hand_off(partner, SLOT, y, {"round": ctx.round})
            sent = True
        except HandOffError:
            pass  # the partner keeps its own model this round
    return Reply({}, {"loss": loss, "sent": sent})


@task("gossip.average")
def average(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    """x_i = (y_i + y_partner) / 2 when the partner's model of this round arrived, else y_i."""
    st: Peer = ctx.state
    y = st.y if st.y is not None and st.round == ctx.round else _own(ctx)
    theirs = None
    for key in [k for k in ctx.inbox if k.startswith(SLOT)]:
        bundle, scalars = ctx.inbox.pop(key)  # every slot is emptied; only this round's partner is used
        if key == SLOT + partner_of(ctx, args) and int(scalars["round"]) == ctx.round:
            theirs = bundle
    st.x = y if theirs is None else weighted_mean([(1.0, y), (1.0, theirs)])
    st.y = None
    out: dict[str, Scalar] = {"averaged": theirs is not None}
    if bool(args["eval"]):
        out.update(ctx.evaluate(st.x))
    return Reply({}, out)


@task("gossip.collect")
def collect(ctx: NodeContext, _: Bundle, args: dict[str, Scalar]) -> Reply:
    return Reply(_own(ctx))


def server_round(ctx: NodeContext, s: Control) -> Control:
    clients = list(ctx.topology.clients)
    pairs = matching(ctx)
    args: dict[str, Scalar] = {"pairs": encode(pairs), "eval": ctx.should_eval()}
    ctx.comm.scatter(clients, "gossip.train", None, args)  # every hand-off lands before anyone averages
    replies = ctx.comm.scatter(clients, "gossip.average", None, args)
    metrics: dict[str, Scalar] = {"pairs": len(pairs) // 2,
                                  "averaged": sum(bool(r.scalars["averaged"]) for r in replies.values())}
    evals = [r.scalars for r in replies.values() if "accuracy" in r.scalars]  # canonical order
    if evals:
        metrics["accuracy"] = sum(float(e["accuracy"]) for e in evals) / len(evals)
        metrics["loss"] = sum(float(e["loss"]) for e in evals) / len(evals)
    ctx.report(**metrics)
    return Control(s.rounds_done + 1)


def final(ctx: NodeContext, s: Control) -> Bundle:
    """The mean of every client's model, collected once after the last round."""
    got = ctx.comm.scatter(list(ctx.topology.clients), "gossip.collect", None, expect=ctx.initial_params())
    if not got:
        raise RuntimeError("gossip: no client gave its model for the final average")
    return weighted_mean((1.0, r.bundle) for r in got.values())


ALGORITHM = Algorithm(
    name="gossip",
    options=Options,
    init=init,
    round=server_round,
    final=final,
    node_state=node_state,
    needs_edges=False,  # clients only (peer links need a flat topology)
    handoff_slots=(SLOT,),  # per sender: "pair/<sender>"
    peers="ring",  # topology.peer_graph defaults to a ring of clients, who then listen for their peers
    summary="randomized pairwise gossip with local SGD on a client ring (no PS in the model path)",
)
