"""What FedAsync and FedBuff share: keeping C clients busy (the asynchronous protocols' client pool) and the
clients' task. Asynchronous FL is written with ``submit`` / ``collect`` (common/engine/api.py): the PS hands the
current model to a client and goes on; it takes updates in the order they come in.

Unspecified choices, named: an idle client is drawn uniformly at random among the idle ones (FedBuff Alg. 1
"sample"; FedAsync's scheduler is unspecified), from the PS's stream ``(async.pick, round, draw)``; a task is
identified by a job number (the PS's count of tasks handed out), which names the client's random stream, so that
a client that gets two tasks in one round draws two different batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhop.common.algorithms.local import local_train, solver_for
from fedhop.common.engine.api import NodeContext, NodeId, Reply, Scalar, task
from fedhop.common.wire.bundle import Bundle, sub


@dataclass
class PoolState:
    """The PS's count of tasks handed out (the next job number)."""

    jobs: int = 0


@dataclass
class ServerState:
    """What FedAsync's and FedBuff's PS keeps: the model x^t and the pool's job count."""

    model: Bundle  # x^t
    pool: PoolState = field(default_factory=PoolState)


def keep_busy(ctx: NodeContext, pool: PoolState, concurrency: int, model: Bundle, task_name: str, draw: int) -> None:
    """Submit ``task_name`` with ``model`` to idle clients, drawn at random, until ``concurrency`` are busy."""
    busy = set(ctx.comm.in_flight())
    idle = [c for c in ctx.topology.clients if c not in busy]
    rng = ctx.np_rng("async.pick", ctx.round, draw)
    while len(busy) < concurrency and idle:
        c = idle.pop(int(rng.integers(len(idle))))
        ctx.comm.submit(c, task_name, model, {"job": pool.jobs}, expect=model)
        pool.jobs += 1
        busy.add(c)


def staleness_of(ctx: NodeContext, submitted: int) -> int:
    """How many server steps the model an update was computed from is behind: this round minus its round."""
    return ctx.round - submitted


@task("async.delta")
def train_delta(ctx: NodeContext, x: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client (FedBuff Alg. 1 lines 9-13): Q local SGD steps from x; replies Delta = x - y_Q."""
    y, loss = local_train(ctx.ws, x, ctx.data, solver_for(ctx, args), ctx.rng("async", int(args["job"])))
    return Reply(sub(x, y), {"loss": loss, "n": len(ctx.data)})


@task("async.model")
def train_model(ctx: NodeContext, x: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client (FedAsync Alg. 1, worker): Q local steps from x (with the proximal term rho, if set); replies x_new."""
    y, loss = local_train(ctx.ws, x, ctx.data, solver_for(ctx, args), ctx.rng("async", int(args["job"])),
                          consume=True)
    return Reply(y, {"loss": loss, "n": len(ctx.data)})


def mean_staleness(stale: list[int]) -> dict[str, Scalar]:
    return {"staleness_mean": sum(stale) / len(stale), "staleness_max": max(stale)} if stale else {}


__all__ = ["NodeId", "PoolState", "ServerState", "keep_busy", "mean_staleness", "staleness_of"]
