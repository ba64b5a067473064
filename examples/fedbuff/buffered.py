"""FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation", Alg. 1), written as a
user protocol against ``fedhop.api`` only: asynchronous FL with ``ctx.comm.submit`` / ``ctx.comm.collect``.

The parameter server keeps C clients training at once (``concurrency``). Each runs Q local SGD steps from the
model it was handed, x^{tau}, and sends back its update Delta = x^{tau} - y^Q. The server takes the updates in
the order they come in, each weighted by its staleness s = t - tau:

    Delta_bar += Delta / sqrt(1 + s)                                       (Alg. 1 line 6, with the weight)
    after K updates:  x^{t+1} = x^t - server_lr * Delta_bar / K            (Alg. 1 lines 7-8)

and after every update it takes, hands the current model to an idle client (drawn at random), so that C stay
busy. One round of the run = one server step (K updates): ``rounds`` = T server steps. A task handed out in
round tau and collected in round t has staleness t - tau; the round's ``arrivals`` column records, for each
update taken, ``node:tau`` in the order taken: that order is what a replay follows.

It computes what the built-in ``fedbuff`` computes, float for float: the same random streams (the server's
``("async.pick", round, draw)`` for the idle client, each client's ``("async", job)`` for its batches), the
same arithmetic in the same order. ``tests/integration/test_fedbuff_example.py`` checks that, and that a
networked run replayed in one process (``fedhop simulate --replay``) gives its model bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedhop.api import (
    Algorithm,
    Bundle,
    NodeContext,
    Reply,
    RunSpec,
    Scalar,
    axpy,
    local_sgd,
    sub,
    task,
    zeros_like,
)


class Options(BaseModel):
    """``[algorithm.options]``: the built-in ``fedbuff``'s options, with its defaults."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(4, ge=1, description="clients training at any time (C)")
    buffer: int = Field(3, ge=1, description="K: client updates buffered per server step (one round = one step)")
    local_steps: int = Field(5, ge=1, description="local SGD steps per task (Q)")
    lr: float = Field(0.05, gt=0, description="client step size")
    batch_size: int = Field(32, ge=0, description="mini-batch size (0 = the whole local set)")
    server_lr: float = Field(1.0, gt=0, description="eta_g, the server's step on the buffered mean update")
    staleness: Literal["sqrt", "none"] = Field("sqrt", description="weight of an update of staleness s: "
                                               "1/sqrt(1+s) (the paper's) or 1")


def check(spec: RunSpec, o: Any) -> None:
    """At validation: no more clients busy at once than there are clients (raise naming the field)."""
    if o.concurrency > spec.topology.clients:
        raise ValueError(f"algorithm.options.concurrency ({o.concurrency}) exceeds topology.clients "
                         f"({spec.topology.clients})")


@dataclass
class ServerState:
    """The parameter server's state: saved after every round, restored on resume. (Tasks in flight when the
    server stops are lost: a resumed run hands out new ones.)"""

    model: Bundle  # x^t
    jobs: int = 0  # tasks handed out so far: the next task's job number (it names the client's random stream)


@task("buffered.delta")
def train_delta(ctx: NodeContext, x: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client (Alg. 1 lines 9-13): Q local SGD steps from x; replies Delta = x - y^Q. The batches come from the
    stream of the task's job number (not of the round: a client may get two tasks in one round)."""
    o: Options = ctx.opts
    y, loss = local_sgd(ctx, x, steps=o.local_steps, lr=o.lr, batch_size=o.batch_size,
                        gen=ctx.rng("async", int(args["job"])))
    return Reply(sub(x, y), {"loss": loss, "n": len(ctx.data)})


def keep_busy(ctx: NodeContext, model: Bundle, jobs: int, concurrency: int, draw: int) -> int:
    """Submit the model to idle clients, drawn uniformly at random, until ``concurrency`` are busy; returns the
    job count after them."""
    busy = set(ctx.comm.in_flight())
    idle = [c for c in ctx.topology.clients if c not in busy]  # canonical order
    rng = ctx.np_rng("async.pick", ctx.round, draw)
    while len(busy) < concurrency and idle:
        c = idle.pop(int(rng.integers(len(idle))))
        ctx.comm.submit(c, "buffered.delta", model, {"job": jobs}, expect=model)
        jobs += 1
        busy.add(c)
    return jobs


def init(ctx: NodeContext) -> ServerState:
    return ServerState(ctx.initial_params())


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    """One server step: K staleness-weighted updates, in the order they come in, then the step."""
    o: Options = ctx.opts
    x, jobs = s.model, s.jobs
    buf = zeros_like(x)
    stale: list[int] = []
    losses: list[float] = []
    for k in range(o.buffer):
        jobs = keep_busy(ctx, x, jobs, o.concurrency, k)
        got = ctx.comm.collect(1)  # the next update to come in: (node, reply, round it was submitted in)
        if not got:  # nothing usable before transport.round_deadline_s
            break
        _, reply, submitted = got[0]
        st = ctx.round - submitted  # staleness
        weight = 1.0 / math.sqrt(1.0 + st) if o.staleness == "sqrt" else 1.0
        buf = axpy(weight, reply.bundle, buf)  # Delta_bar += weight * Delta
        stale.append(st)
        losses.append(float(reply.scalars["loss"]))
    if stale:
        x = axpy(-o.server_lr / o.buffer, buf, x)  # x^{t+1} = x^t - eta_g Delta_bar / K
    metrics: dict[str, Scalar] = {"updates": len(stale)}
    if stale:
        metrics.update(staleness_mean=sum(stale) / len(stale), staleness_max=max(stale),
                       train_loss=sum(losses) / len(losses))
    if ctx.should_eval():
        metrics.update(ctx.evaluate(x))
    ctx.report(**metrics)  # after the round's last collect: the report carries its arrivals
    return ServerState(x, jobs)


ALGORITHM = Algorithm(
    name="buffered",
    options=Options,
    init=init,
    round=server_round,
    needs_edges=False,
    check=check,
    summary="FedBuff, buffered asynchronous aggregation (Nguyen et al. 2022), as a user module",
)
