"""Options of ``fedasync`` and ``fedbuff`` (``[algorithm.options]``) and their spec-time check: torch-free, read at
validation; the algorithms live in ``fedhop.common.algorithms.fedasync`` / ``fedbuff``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedhop.common.options.solver import LocalSolver

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec
    from fedhop.common.topology import Topology


class AsyncClientOptions(BaseModel):
    """What both asynchronous algorithms share: the clients' local solver and how many train at once."""

    model_config = ConfigDict(extra="forbid")
    concurrency: int = Field(4, ge=1, description="clients training at any time (C); each that finishes is "
                             "replaced by an idle client drawn uniformly at random")
    local_steps: int = Field(5, ge=1, description="local SGD steps per task (Q)")
    lr: float = Field(0.05, gt=0, description="client step size")
    batch_size: int = Field(32, ge=0, description="mini-batch size; 0 = full local batch")

    def local_solver(self, topology: Topology) -> LocalSolver:
        return LocalSolver(steps=self.local_steps, lr=self.lr, batch_size=self.batch_size)


class FedBuffOptions(AsyncClientOptions):
    buffer: int = Field(3, ge=1, description="K: client updates buffered per server step (one round = one step)")
    server_lr: float = Field(1.0, gt=0, description="eta_g, the server's step on the buffered mean update")
    staleness: Literal["sqrt", "none"] = Field(
        "sqrt", description="weight of an update of staleness s: 1/sqrt(1+s) (the paper's choice) or 1")


class FedAsyncOptions(AsyncClientOptions):
    alpha: float = Field(0.6, gt=0, le=1, description="mixing weight alpha of x <- (1-a_t) x + a_t x_new")
    staleness_exponent: float = Field(0.5, ge=0, description="a of the polynomial staleness function "
                                      "s(t - tau) = (t - tau + 1)^-a (0: no staleness discount)")
    prox_mu: float = Field(0.0, ge=0, description="rho of the client's proximal term (FedAsync eq. 2; 0: none)")

    def local_solver(self, topology: Topology) -> LocalSolver:
        return LocalSolver(steps=self.local_steps, lr=self.lr, batch_size=self.batch_size, prox_mu=self.prox_mu)


def check_spec(spec: RunSpec, o: Any) -> None:
    """At most as many clients train at once as there are clients."""
    if o.concurrency > spec.topology.clients:
        raise ValueError(f"algorithm.options.concurrency ({o.concurrency}) exceeds topology.clients "
                         f"({spec.topology.clients})")
