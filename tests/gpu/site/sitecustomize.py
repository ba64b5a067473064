"""Deterministic algorithms in every Python process of a GPU test (tests/gpu/gpuutil.py puts this folder first on
PYTHONPATH): the fork server of ``fedhop launch`` (whose forked children inherit the setting), every interpreter it
starts instead, and ``fedhop simulate`` / ``fedhop launch`` run as commands. fedhop itself has no switch for it.

Only when ``FEDHOP_TEST_DETERMINISTIC=1``; with it, ``CUBLAS_WORKSPACE_CONFIG`` must be set too (PyTorch refuses a
cuBLAS call under deterministic algorithms without it).
"""

import os

if os.environ.get("FEDHOP_TEST_DETERMINISTIC") == "1":
    import torch

    torch.use_deterministic_algorithms(True)
