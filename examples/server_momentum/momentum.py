"""FedAvg with server momentum (FedAvgM; Hsu, Qi & Brown 2019, "Measuring the effects of non-identical data
distribution"), written as a user protocol against ``fedhop.api`` only.

One round t, clients S = every client (canonical order):

    w_k   = LocalSGD_k(w^t, local_steps)                 on client k (task "server_momentum.train")
    avg   = sum_k (n_k / sum_j n_j) w_k                   on the parameter server, in canonical order
    delta = w^t - avg                                     the pseudo-gradient
    v     <- momentum * v + delta                         the server's velocity (its state, checkpointed)
    w^{t+1} = w^t - server_lr * v

With ``momentum = 0`` and ``server_lr = 1`` this is FedAvg. Run it with ``fedhop simulate spec.toml`` from this
folder (``spec.toml`` names ``algorithm.name = "momentum:ALGORITHM"``), or over real processes with
``fedhop launch spec.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from fedhop.api import Algorithm, Bundle, NodeContext, Reply, Scalar, local_sgd, task, weighted_mean, zeros_like


class Options(BaseModel):
    """The protocol's options: ``[algorithm.options]`` of the spec, validated like a built-in's."""

    model_config = ConfigDict(extra="forbid")  # a misspelt option is an error, not a silent default

    local_steps: int = Field(5, ge=1, description="local SGD steps per round")
    lr: float = Field(0.05, gt=0, description="client step size")
    batch_size: int = Field(32, ge=0, description="mini-batch size (0 = the whole local set)")
    server_lr: float = Field(1.0, gt=0, description="server step size on the momentum")
    momentum: float = Field(0.9, ge=0, lt=1, description="server momentum beta (0 = FedAvg)")


@dataclass
class ServerState:
    """The parameter server's state S: saved after every round and restored on resume."""

    model: Bundle  # w^t
    velocity: Bundle  # v
    rounds_done: int = 0


@task("server_momentum.train")
def train(ctx: NodeContext, params: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: local SGD from the server's model; replies with the new model and the sample count."""
    o: Options = ctx.opts
    w, loss = local_sgd(ctx, params, steps=o.local_steps, lr=o.lr, batch_size=o.batch_size)
    return Reply(w, {"loss": loss, "n": len(ctx.data)})


def init(ctx: NodeContext) -> ServerState:
    w = ctx.initial_params()
    return ServerState(model=w, velocity=zeros_like(w))


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    o: Options = ctx.opts
    replies = ctx.comm.scatter(ctx.children, "server_momentum.train", s.model, expect=s.model)
    if not replies:  # nobody answered: keep the model (the engine logs who is missing)
        return s
    avg = weighted_mean((float(r.scalars["n"]), r.bundle) for r in replies.values())  # canonical order
    velocity = {k: o.momentum * s.velocity[k] + (s.model[k] - avg[k]) for k in s.model}
    model = {k: s.model[k] - o.server_lr * velocity[k] for k in s.model}
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(model))
    return ServerState(model=model, velocity=velocity, rounds_done=s.rounds_done + 1)


ALGORITHM = Algorithm(
    name="server-momentum",
    options=Options,
    init=init,
    round=server_round,
    needs_edges=False,  # server + clients only: a spec with edges is refused at validation
    summary="FedAvg with server momentum (FedAvgM, Hsu et al. 2019)",
)
