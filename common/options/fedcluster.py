"""Options of ``fedcluster`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.fedcluster``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from fedhop.common.options.fedavg import FedAvgOptions, solver_of
from fedhop.common.options.solver import LocalSolver
from fedhop.common.topology import Topology, build_topology

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec


class FedClusterOptions(FedAvgOptions):
    """Defaults are the paper's CIFAR-10 protocol (sec. IV-A, spec sec. 4.6): E = 20 local SGD steps of batch
    30, 10% of each cluster per cycle, lr 0.01 (= FedAvg's 0.1 / 10). Local solvers (sec. IV-C, spec sec. 3):
    ``solver`` sgd | momentum (heavy ball, dampening 0; the paper's SGDm uses momentum = 0.5) | adam
    (beta1 0.9, beta2 0.999, eps 1e-8); FedProx = ``prox_mu`` > 0 (the paper: 0.1) with the anchor
    W_{jM+K}, the model the cluster received. Optimizer state is reset at every activation ([UNSPECIFIED];
    spec default; the keep-state variant is not implemented)."""

    lr: float = Field(0.01, gt=0, description="local learning rate (read through lr_rule)")
    local_steps: int = Field(20, ge=1, description="E: local steps per activation")
    batch_size: int = Field(30, ge=0, description="mini-batch size; 0 = full local batch")
    participation: float = Field(0.1, gt=0, le=1, description="fraction of a cluster sampled per cycle")
    order: Literal["reshuffle", "fixed"] = Field(
        "reshuffle", description="cycle order: a new random permutation per round (App. A, the theory; "
        "[UNSPECIFIED] in the experiments) or Algorithm 1's fixed S_1..S_M")
    lr_rule: Literal["as_is", "over_M", "fixed_over_10"] = Field(
        "as_is", description="step size used: lr (as_is), lr / M (over_M: lr is FedAvg's rate; matches "
        "lr x sequential steps per round, parity under IID data, spec sec. 8.3), lr / 10 (fixed_over_10: the "
        "paper's rule 'one tenth of FedAvg's' for every M, sec. IV-A)")


    def local_solver(self, topology: Topology) -> LocalSolver:
        """FedAvg's solver at the step size ``lr_rule`` gives for M = topology.edges clusters."""
        return solver_of(self.model_copy(update={"lr": step_size(self, len(topology.edges))}))


def step_size(o: FedClusterOptions, m: int) -> float:
    """The local learning rate the devices use, by ``lr_rule`` (spec sec. 4.7, Fig. 5 [UNSPECIFIED])."""
    if o.lr_rule == "over_M":
        return o.lr / m
    if o.lr_rule == "fixed_over_10":
        return o.lr / 10
    return o.lr


def required_links(edges: Sequence[str], order: str) -> set[tuple[str, str]]:
    """Edge pairs that must be adjacent for every hand-off the cycle order can ask for: any two clusters
    under ``reshuffle`` (sigma_j is arbitrary, and round j's last cluster meets round j+1's first), the ring
    S_1 -> S_2 -> ... -> S_M -> S_1 under ``fixed``."""
    m = len(edges)
    if m < 2:
        return set()
    if order == "fixed":
        return {(edges[i], edges[(i + 1) % m]) for i in range(m)}
    return {(a, b) for a in edges for b in edges if a != b}


def check_topology(topo: Topology, order: str) -> None:
    """FedCluster hands the model edge -> edge directly, so the edge graph must hold every needed link."""
    missing = sorted((a, b) for a, b in required_links(topo.edges, order) if b not in topo.neighbours[a])
    if missing:
        need = 'topology.edge_graph = "complete"' if order == "reshuffle" else \
            'topology.edge_graph = "ring" or "complete"'
        shown = ", ".join(f"{a}->{b}" for a, b in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"fedcluster with order={order!r} hands the model between clusters that the edge "
                         f"graph does not link ({shown}); set {need}")


def check_spec(spec: RunSpec, o: FedClusterOptions) -> None:
    """Spec-time form of :func:`check_topology`: a missing edge link fails before anything starts."""
    check_topology(build_topology(spec.topology, spec.seed), o.order)
