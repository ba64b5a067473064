"""The local solver an algorithm's options describe (steps, step size, momentum, Adam, FedProx): plain
numbers, read by ``fedhop.common.algorithms.local`` which runs it."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LocalSolver:
    """Local steps of SGD, optionally with heavy-ball momentum, weight decay, a FedProx term or Adam.

    FedProx (Li et al. 2020): minimise f_k(w) + mu/2 ||w - w_anchor||^2, i.e. gradient + mu (w - w_anchor).
    Optimizer state is reset at every activation.

    ``lr_K > 0`` selects the decaying schedule of Fed-CHS App. B.1: step t uses
    ``lr / (lr_K * sqrt(step_offset + t + 1))`` (``step_offset`` places these steps inside a longer round).
    """

    steps: int
    lr: float
    batch_size: int
    solver: str = "sgd"  # sgd | momentum | adam
    momentum: float = 0.0
    weight_decay: float = 0.0
    prox_mu: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    lr_K: int = 0  # 0: constant lr
    step_offset: int = 0

    def lr_at(self, t: int) -> float:
        """The step size of local step ``t`` (0-based)."""
        if self.lr_K <= 0:
            return self.lr
        return self.lr / (self.lr_K * math.sqrt(self.step_offset + t + 1))
