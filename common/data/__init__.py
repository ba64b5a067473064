"""Offline datasets and partitioners (DESIGN.md section 7).

Importing this package registers the built-in datasets. A module that registers more adds one import
line below (see ``registry.py`` for how to write one).
"""

from fedhop.common.data.base import CentralData, Dataset, FederatedData, make_rng
from fedhop.common.data.registry import DATASETS, get_dataset, register_dataset
from fedhop.common.data.spec import DataSpec

# built-in datasets (import for the registration side effect)
from fedhop.common.data import builtin, cifar, idx, leaf  # noqa: E402, F401, I001
from fedhop.common.data import fgdro_toy  # noqa: E402, F401
from fedhop.common.data import fedcluster_gauss  # noqa: E402, F401
from fedhop.common.data.build import build_federated_data  # noqa: E402

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
from fedhop.common.data import focus_lsq  # noqa: E402, F401  (FOCUS Fig. 4 least squares)
