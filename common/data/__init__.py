"""Offline datasets and partitioners (docs/design.md section 10).

Importing this package registers every dataset: each dataset module registers itself on import, so a
module that adds one (see ``registry.py`` for how to write it) adds its name to the first import below.
"""

from fedhop.common.data import (  # noqa: F401  (imported for their registrations)
    builtin,
    cifar,
    fedcluster_gauss,  # FedCluster E1 Gaussian label skew
    fgdro_toy,  # FGDRO sec. 8 toy
    focus_lsq,  # FOCUS Fig. 4 least squares
    idx,
    leaf,
)
from fedhop.common.data.base import CentralData, Dataset, FederatedData, make_rng
from fedhop.common.data.build import build_federated_data
from fedhop.common.data.registry import DATASETS, get_dataset, register_dataset
from fedhop.common.data_spec import DataSpec

__all__ = [
    "DATASETS",
    "CentralData",
    "DataSpec",
    "Dataset",
    "FederatedData",
    "build_federated_data",
    "get_dataset",
    "make_rng",
    "register_dataset",
]
