"""The catalogue (``fedhop.common.catalog``) and the registries of the code agree: the spec is validated against
the first without importing the second, so a difference would let a spec through that the run then refuses."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from fedhop.common import catalog
from fedhop.common.data import DATASETS
from fedhop.common.engine.api import ALGORITHMS, get_algorithm, load_algorithms
from fedhop.common.models import MODELS
from fedhop.common.validation import NoOptions


class OtherOptions(BaseModel):
    x: int = 0


def test_every_algorithm_matches_its_entry() -> None:
    load_algorithms()
    assert set(ALGORITHMS) == set(catalog.ALGORITHMS)
    for name, algo in ALGORITHMS.items():
        info = catalog.algorithm(name)
        assert algo.options is info.options, name
        assert algo.needs_edges is info.needs_edges, name
        assert algo.check is info.check, name
        assert algo.summary == info.summary and info.summary, name
        assert algo.init.__module__ == info.module, name  # the module get_algorithm imports registers it


def test_every_dataset_and_model_matches_its_entry() -> None:
    for name in catalog.DATASETS:
        assert name in DATASETS, name
    for name, entry in DATASETS.items():
        info = catalog.dataset(name)
        assert (entry.options, entry.file_backed) == (info.options, info.file_backed), name
    assert set(MODELS) == set(catalog.MODELS)
    for name, entry in MODELS.items():
        assert entry.options is catalog.model(name).options, name


def test_get_algorithm_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown algorithm 'fedavgg'; known: centralized-sgd, dpsgd, dr-dsgd, "):
        get_algorithm("fedavgg")
    assert get_algorithm("fedavg").options is catalog.algorithm("fedavg").options


def test_a_registration_that_differs_from_its_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="algorithm 'fedavg' is registered with options"):
        catalog.add_algorithm("fedavg", "x", OtherOptions, None, None)
    with pytest.raises(ValueError, match="algorithm 'fedavg' is registered with needs_edges True"):
        catalog.add_algorithm("fedavg", "x", catalog.algorithm("fedavg").options, True, None)
    with pytest.raises(ValueError, match="dataset 'mnist' is registered with file_backed False"):
        catalog.add_dataset("mnist", NoOptions, False)
    with pytest.raises(ValueError, match="model 'lenet' is registered with options"):
        catalog.add_model("lenet", NoOptions)


def test_a_name_the_catalogue_does_not_list_is_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "MODELS", dict(catalog.MODELS))
    with pytest.raises(ValueError, match="unknown model 'test-catalog'; valid names: alexnet-small, cnn2"):
        catalog.model("test-catalog")
    catalog.add_model("test-catalog", OtherOptions)
    assert catalog.model("test-catalog").options is OtherOptions
