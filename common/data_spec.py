"""DataSpec: which dataset, how it is split across clients (the ``[data]`` table of a run spec)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fedhop.common import catalog
from fedhop.common.user_code import check_ref
from fedhop.common.validation import check_options

# the fields that apply to a user data.source (every other one configures a built-in dataset)
SOURCE_FIELDS = frozenset({"source", "num_classes", "path", "options", "split_seed"})

Partition = Literal["iid", "dirichlet", "shards", "major_class", "imbalanced"]


class DataSpec(BaseModel):
    """Dataset and partition of a run. Every field has a default; unknown fields are rejected.

    Partitions (``common/data/partition.py``):

    - ``iid``: uniform random split into near-equal parts.
    - ``dirichlet``: label skew with concentration ``dirichlet_lambda`` (Fed-CHS App. A; FOCUS App. F.1).
      ``dirichlet_mode="per_class"`` splits each class over clients with ``Dir(lambda 1_N)`` (Hsu et al.
      2019); ``"per_client"`` gives each client ``n/N`` samples with class proportions ``Dir(lambda 1_C)``
      (or ``Dir(lambda * class_prior)`` with ``dirichlet_prior_scaled``, as the FOCUS code does).
    - ``shards``: sort by label, cut into ``n_clients * shards_per_client`` shards, deal ``shards_per_client``
      random shards to each client (McMahan et al. 2017).
    - ``major_class``: FedCluster sec. IV-A/IV-E (docs/specs/fedcluster.md 4.3-4.5): each client draws
      ``samples_per_client`` samples, ``rho_device`` of them from its major class; with ``rho_cluster``, the
      major classes of the ``n_clusters`` contiguous clusters follow the rho_cluster matrix. Samples are
      reused across clients (the paper's 500k draws from 50k images), so clients may overlap.
    - ``imbalanced``: FGDRO App. G: keep ``imbalance_keep`` of the samples of ``imbalance_classes`` (default
      every other class: 0, 2, 4, ...), then the ``per_client`` Dirichlet(``dirichlet_lambda``) split of Shen
      et al. 2021, whose code FGDRO used. The test set is left balanced.

    With ``n_clusters > 0`` and ``cluster_iid``, the training pool is first split IID over the clusters
    (contiguous client ranges of ``cluster_sizes``), then the partition runs inside each cluster: Fed-CHS's
    "IID among clusters, non-IID within a cluster" (Fig. 4).

    ``source`` replaces all of the above with the user's own function (``common/data/source.py``): it returns
    each client's partition and the test set, ``num_classes`` says what ``y`` holds; only ``path``,
    ``options`` and ``split_seed`` apply besides.

    ``test_fraction`` applies to datasets without their own test split (digits, synthetic, LEAF); MNIST
    and CIFAR use their standard test files.
    """

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field("digits", description="registered dataset name")
    source: str | None = Field(None, description="user data instead of `dataset`: 'package.module:function' "
                               "returning (x, y) for one client's partition or the test set "
                               "(common/data/source.py)")
    num_classes: int | None = Field(None, ge=0, description="with `source`: the number of classes "
                                    "(0 = regression)")
    path: Path | None = Field(None, description="directory or file for file-backed datasets")
    options: dict[str, Any] = Field(default_factory=dict, description="the dataset's own options")
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    split_seed: int | None = Field(None, ge=0, description="seed of data generation/split/partition; "
                                   "default: the run seed")
    train_limit: int | None = Field(None, ge=1, description="random subsample of the training pool")
    test_limit: int | None = Field(None, ge=1, description="random subsample of the test set")
    standardize: bool = Field(False, description="zero-mean/unit-variance features (train statistics; "
                              "per channel for images)")

    partition: Partition = "dirichlet"
    dirichlet_lambda: float = Field(0.5, gt=0.0)
    dirichlet_mode: Literal["per_class", "per_client"] = "per_class"
    dirichlet_prior_scaled: bool = False
    min_samples_per_client: int = Field(1, ge=1, description="per_class Dirichlet repair floor")
    shards_per_client: int = Field(2, ge=1)

    rho_device: float = Field(0.5, ge=0.0, le=1.0, description="FedCluster major-class fraction per device")
    samples_per_client: int | None = Field(None, ge=1, description="major_class: samples per device "
                                           "(default: training pool size // n_clients)")
    rho_cluster: float | None = Field(None, ge=0.0, le=1.0, description="FedCluster cluster-level ratio")
    n_clusters: int = Field(0, ge=0, description="clusters (= edge servers), contiguous in client id order")
    cluster_sizes: list[int] | None = Field(None, description="explicit cluster sizes; default: as even as "
                                            "possible, the first clusters one larger")
    cluster_iid: bool = False

    imbalance_classes: list[int] | None = Field(None, description="minority classes; default 0, 2, 4, ...")
    imbalance_keep: float = Field(0.2, gt=0.0, le=1.0)

    union_of: int | None = Field(None, ge=1, description="build the data (generation, partition, limits, "
                                 "standardization) as for this many clients, then give their union to the run's "
                                 "one client: a centralized baseline's pool, 'the union of the device data' "
                                 "(FedCluster spec 4.6); needs topology.clients = 1")

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, v: str) -> str:
        catalog.dataset(v)  # raises with the list of valid names
        return v

    @field_validator("source")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        return v if v is None else check_ref(v, "")

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if info.data.get("source") is not None:
            return v  # the source's own options: passed to it as request.options
        name = info.data.get("dataset")
        if name is None or name not in catalog.DATASETS:
            return v
        check_options("dataset", name, catalog.dataset(name).options, v)
        return v

    @field_validator("cluster_sizes")
    @classmethod
    def _sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or min(v) < 1):
            raise ValueError("cluster_sizes must be a non-empty list of positive integers")
        return v

    @field_validator("imbalance_classes")
    @classmethod
    def _classes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or min(v) < 0 or len(set(v)) != len(v)):
            raise ValueError("imbalance_classes must be distinct non-negative class ids")
        return v

    @model_validator(mode="after")
    def _source_alone(self) -> DataSpec:
        """With ``source`` the user's function is the partition: the built-in dataset's fields do not apply."""
        if self.source is None:
            if self.num_classes is not None:
                raise ValueError("num_classes applies to a data.source only (a built-in dataset knows its classes)")
            return self
        if self.num_classes is None:
            raise ValueError("num_classes: required with data.source (the number of classes; 0 = regression)")
        if self.num_classes == 1:
            raise ValueError("num_classes: 1 class cannot be classified; use 0 for regression or >= 2")
        stray = [f for f, info in type(self).model_fields.items()
                 if f not in SOURCE_FIELDS and getattr(self, f) != info.get_default(call_default_factory=True)]
        if stray:
            raise ValueError(f"{', '.join(stray)}: built-in dataset/partition fields do not apply with data.source "
                             "(the source returns each client's partition itself)")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> DataSpec:
        if self.source is not None:
            return self
        entry = catalog.dataset(self.dataset)
        if entry.file_backed and self.path is None:
            raise ValueError(f"path: dataset {self.dataset!r} is read from files; set data.path to the "
                             "directory that holds them")
        if self.cluster_sizes is not None and self.n_clusters not in (0, len(self.cluster_sizes)):
            raise ValueError(f"cluster_sizes has {len(self.cluster_sizes)} entries but n_clusters is "
                             f"{self.n_clusters}")
        if self.rho_cluster is not None:
            if self.partition != "major_class":
                raise ValueError("rho_cluster applies to partition='major_class' only")
            if self.clusters_given() == 0:
                raise ValueError("rho_cluster needs n_clusters (or cluster_sizes)")
        if self.cluster_iid and self.clusters_given() == 0:
            raise ValueError("cluster_iid needs n_clusters (or cluster_sizes)")
        if self.cluster_iid and self.partition == "major_class":
            raise ValueError("cluster_iid cannot be combined with partition='major_class' "
                             "(use rho_cluster for cluster-level structure)")
        return self

    def clusters_given(self) -> int:
        return len(self.cluster_sizes) if self.cluster_sizes is not None else self.n_clusters

    def dataset_options(self) -> Any:
        """``options`` validated into the dataset's own options model."""
        return catalog.dataset(self.dataset).options.model_validate(self.options)

    def effective_seed(self, run_seed: int) -> int:
        return self.split_seed if self.split_seed is not None else run_seed
