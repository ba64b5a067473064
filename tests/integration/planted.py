"""A planted divergence for tests/integration/test_check.py: a training loss that reads the process it runs in.

The in-process engine trains every client in the checking process; over real processes each client trains in
its own. A loss scaled by a number drawn from the process id therefore trains differently in the two engines
(unless both clients' pids equal the checker's modulo 1000), which ``fedhop check`` must catch."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F


def pid_loss(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy times 1 + (pid mod 1000) / 100: the kind of state a protocol must never read."""
    return F.cross_entropy(outputs, y) * (1.0 + (os.getpid() % 1000) / 100.0)
