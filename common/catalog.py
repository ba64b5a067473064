"""The catalogue: every algorithm, dataset and model a run spec may name, by name, without torch.

Validating a run spec needs, for each name the spec uses, what the spec may say about it (the options model,
whether the algorithm needs edge servers, its spec-time check, whether a dataset is read from files); running
it needs the code (the algorithm's rounds, the dataset's builder, the network). The first lives here, as a
static table of names and ``"package.module:attribute"`` references into the torch-free modules of
:mod:`fedhop.common.options`, imported by name when a spec names the entry. The code registers itself in
``fedhop.common.engine.api.ALGORITHMS``, ``fedhop.common.data.registry.DATASETS`` and
``fedhop.common.models.registry.MODELS``; each registration is checked against this table (same options model,
same facts), so the two cannot drift apart. An algorithm's module is imported only when a run needs it
(:func:`fedhop.common.engine.api.get_algorithm` imports ``AlgorithmInfo.module`` by name).

A dataset, model or algorithm registered at run time under a name this table does not list (an extension, a
test) is added to it by its registration, with its options model itself instead of a reference.

Adding a built-in: put its options model (and its spec-time check, if any) in a module of
``fedhop.common.options`` that imports no torch, name it in the table below, and register the code under the
same name with the same options model.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from fedhop.common.validation import NoOptions

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec

Ref = str  # "package.module:attribute" in a torch-free module
Check = Callable[["RunSpec", Any], None]


@cache
def resolve(ref: Ref) -> Any:
    """The object a ``"package.module:attribute"`` reference names (its module imported on first use)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _obj(v: Any) -> Any:
    return resolve(v) if isinstance(v, str) else v


@dataclass(frozen=True)
class AlgorithmInfo:
    """What a spec may say about an algorithm, and where its code lives."""

    name: str
    module: str  # the module that registers the algorithm (imported by name when a run needs it)
    options_ref: Ref | type[BaseModel]
    needs_edges: bool | None = None  # True: needs topology.edges > 0; False: needs edges == 0
    check_ref: Ref | Check | None = None  # further checks of a whole spec (raise ValueError naming the field)
    summary: str = ""  # one line for `fedhop algorithms` and `fedhop spec --explain`
    peers: str = "none"  # the client peer graph it needs (topology.peer_graph's default): none, ring, random

    @property
    def options(self) -> type[BaseModel]:
        return _obj(self.options_ref)

    @property
    def check(self) -> Check | None:
        return None if self.check_ref is None else _obj(self.check_ref)


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    options_ref: Ref | type[BaseModel] = NoOptions
    file_backed: bool = False  # read from files under DataSpec.path (required)

    @property
    def options(self) -> type[BaseModel]:
        return _obj(self.options_ref)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    options_ref: Ref | type[BaseModel] = NoOptions

    @property
    def options(self) -> type[BaseModel]:
        return _obj(self.options_ref)


_A = "fedhop.common.algorithms."
_O = "fedhop.common.options."


def _algo(name: str, module: str, options: str, needs_edges: bool | None, summary: str = "", *,
          check: str | None = None, peers: str = "none", options_module: str | None = None) -> AlgorithmInfo:
    om = options_module or module  # where its options model (and check) live, under common/options/
    return AlgorithmInfo(name, _A + module, f"{_O}{om}:{options}", needs_edges,
                         None if check is None else f"{_O}{om}:{check}", summary, peers)


ALGORITHMS: dict[str, AlgorithmInfo] = {a.name: a for a in (
    _algo("centralized-sgd", "centralized", "CentralizedSGDOptions", False,
          "centralized mini-batch SGD on one trainer holding the pooled data (FedCluster's "
          "baseline)", check="check_spec"),
    _algo("dpsgd", "dpsgd", "DPSGDOptions", False,
          "D-PSGD (Lian et al. 2017): local SGD, then gossip averaging with Metropolis-Hastings weights on a "
          "client peer graph; no PS in the model path", peers="ring"),
    _algo("dr-dsgd", "dr_dsgd", "DRDSGDOptions", False,
          "DR-DSGD (Issaid et al. 2022) with server averaging"),
    _algo("drfa", "drfa", "DRFAOptions", False,
          "DRFA (Deng et al. 2020): distributionally robust FedAvg"),
    _algo("drfa-prox", "drfa", "DRFAProxOptions", False,
          "DRFA-Prox (Deng et al. 2020, Alg. 2): DRFA with a KL-regularised prox step on lambda"),
    _algo("fedadam", "fedadam", "FedAdamOptions", False,
          "FedAdam (Reddi et al. 2021): server-side Adam on the mean update"),
    _algo("fedasync", "fedasync", "FedAsyncOptions", False,
          "FedAsync (Xie et al. 2019): each update mixed in as it arrives, staleness-discounted",
          check="check_spec", options_module="asynchronous"),
    _algo("fedbuff", "fedbuff", "FedBuffOptions", False,
          "FedBuff (Nguyen et al. 2022): asynchronous updates buffered K at a time, staleness-weighted",
          check="check_spec", options_module="asynchronous"),
    _algo("fedau", "fedau", "FedAUOptions", False,
          "FedAU (Wang & Ji 2023): online 1/p_i aggregation weights"),
    _algo("fedavg", "fedavg", "FedAvgOptions", None,
          "FedAvg; through edges when the topology has them"),
    _algo("fedchs", "fedchs", "FedCHSOptions", True,
          "Fed-CHS: sequential cluster walk, K interactions per cluster"),
    _algo("fedcluster", "fedcluster", "FedClusterOptions", True,
          "FedCluster: M clusters (= edges) train in turn each round; the model cycles edge -> "
          "edge", check="check_spec"),
    _algo("fgdro-cvar", "fgdro", "FGDROCVaROptions", False,
          "FGDRO-CVaR (Guo & Yang 2024, Alg. 1): averages (w, s), d+1 floats"),
    _algo("fgdro-kl", "fgdro", "FGDROKLOptions", False,
          "FGDRO-KL (Alg. 2): averages (w, m, v), 2d+1 floats"),
    _algo("fgdro-kl-adam", "fgdro", "FGDROKLAdamOptions", False,
          "FGDRO-KL-Adam (Alg. 3): averages (w, m, q, v), 3d+1 floats"),
    _algo("focus", "focus", "FocusOptions", None,
          "FOCUS (Ying et al. 2025, Alg. 1): push-pull, exact under arbitrary participation; flat or through "
          "edges", check="check_spec"),
    _algo("hier-local-qsgd", "qsgd", "HierLocalQSGDOptions", True,
          "Hier-Local-QSGD: client-edge-cloud local SGD with QSGD-quantised uploads"),
    _algo("hierfavg", "fedavg", "HierFAVGOptions", True,
          "HierFAVG: kappa2 edge rounds per cloud round"),
    _algo("local-adam", "fgdro", "LocalAdamOptions", False,
          "LocalAdam (FGDRO App. D, Alg. 4): local Adam steps, averages (w, m, q), 3d floats"),
    _algo("mifa", "mifa", "MifaOptions", False,
          "MIFA (Gu et al. 2021), correct version: stale updates of absent clients"),
    _algo("proxskip", "proxskip", "ProxSkipOptions", False,
          "ProxSkip / Scaffnew (Mishchenko et al. 2022), communication every tau steps"),
    _algo("scaffold", "scaffold", "ScaffoldOptions", False,
          "SCAFFOLD (Karimireddy et al. 2020), option II"),
    _algo("sg-focus", "focus", "SGFocusOptions", None,
          "SG-FOCUS (Ying et al. 2025, Alg. 2): stochastic FOCUS", check="check_spec"),
    _algo("wrwgd", "wrwgd", "WRWGDOptions", False,
          "WRWGD: one model on a Metropolis-Hastings walk over clients, handed from client to client",
          peers="random"),
)}

_D = _O + "datasets:"
DATASETS: dict[str, DatasetInfo] = {d.name: d for d in (
    DatasetInfo("cifar10", file_backed=True),
    DatasetInfo("cifar100", file_backed=True),
    DatasetInfo("digits"),
    DatasetInfo("digits-img"),
    DatasetInfo("fashion-mnist", file_backed=True),
    DatasetInfo("fedcluster-gauss", _D + "GaussLabelSkewOptions"),
    DatasetInfo("fgdro-toy", _D + "FGDROToyOptions"),
    DatasetInfo("focus-lsq", _D + "FocusLsqOptions"),
    DatasetInfo("leaf-synthetic", _D + "LeafOptions"),
    DatasetInfo("mnist", file_backed=True),
    DatasetInfo("synthetic", _D + "SyntheticOptions"),
    DatasetInfo("synthetic-regression", _D + "RegressionOptions"),
)}

_M = _O + "models:"
MODELS: dict[str, ModelInfo] = {m.name: m for m in (
    ModelInfo("alexnet-small", _M + "AlexNetOptions"),
    ModelInfo("cnn2", _M + "CNN2Options"),
    ModelInfo("cnn3"),
    ModelInfo("lenet", _M + "LeNetOptions"),
    ModelInfo("linear"),
    ModelInfo("logreg"),
    ModelInfo("mlp"),
    ModelInfo("mlp200"),
)}


# user algorithms named by reference ("package.module:NAME"), imported on first use; never listed with the
# built-ins (`fedhop algorithms`)
USER_ALGORITHMS: dict[str, AlgorithmInfo] = {}


def user_algorithm(ref: str) -> AlgorithmInfo:
    """The entry of the user algorithm ``ref`` (``"package.module:NAME"``, NAME a ``fedhop.api.Algorithm``):
    its module is imported (a UserCodeError names ``algorithm.name`` when that fails or NAME is no algorithm)."""
    info = USER_ALGORITHMS.get(ref)
    if info is None:
        from fedhop.common.user_code import load_algorithm

        algo = load_algorithm(ref)
        summary = algo.summary or f"user algorithm {ref}"
        info = USER_ALGORITHMS[ref] = AlgorithmInfo(ref, ref.partition(":")[0], algo.options, algo.needs_edges,
                                                    algo.check, summary, algo.peers)
    return info


def algorithm(name: str) -> AlgorithmInfo:
    if ":" in name:
        return user_algorithm(name)
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))} (or your own: "
                         f"'package.module:NAME', docs/protocols.md){_did_you_mean(name, ALGORITHMS)}")
    return ALGORITHMS[name]


def dataset(name: str) -> DatasetInfo:
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(sorted(DATASETS))}"
                         f"{_did_you_mean(name, DATASETS)}") from None


def model(name: str) -> ModelInfo:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}"
                         f"{_did_you_mean(name, MODELS)}") from None


def _did_you_mean(name: str, known: dict[str, Any]) -> str:
    """``"; did you mean 'x'?"`` for the closest known name (difflib), worded as fedhop/cli/suggest.py's."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _differs(kind: str, name: str, what: str, listed: Any, registered: Any) -> ValueError:
    return ValueError(f"{kind} {name!r} is registered with {what} {registered!r}, but fedhop.common.catalog lists "
                      f"{listed!r}: register it with the catalogue's")


def add_algorithm(name: str, module: str, options: type[BaseModel], needs_edges: bool | None,
                  check: Check | None, summary: str = "", peers: str = "none") -> AlgorithmInfo:
    """Called by ``engine.api.register``: a listed algorithm must match its entry (options model, needs_edges,
    check); another one is added, under the module that registered it. Returns the entry (its summary)."""
    info = ALGORITHMS.get(name)
    if info is None:
        info = ALGORITHMS[name] = AlgorithmInfo(name, module, options, needs_edges, check, summary, peers)
        return info
    if peers != info.peers:
        raise _differs("algorithm", name, "peers", info.peers, peers)
    if summary and summary != info.summary:
        raise _differs("algorithm", name, "summary", info.summary, summary)
    for what, listed, registered in (("options", info.options, options), ("needs_edges", info.needs_edges,
                                     needs_edges), ("check", info.check, check)):
        if listed is not registered:
            raise _differs("algorithm", name, what, listed, registered)
    return info


def add_dataset(name: str, options: type[BaseModel], file_backed: bool) -> None:
    """Called by ``data.registry.register_dataset``: a listed dataset must match its entry; another is added."""
    info = DATASETS.get(name)
    if info is None:
        DATASETS[name] = DatasetInfo(name, options, file_backed)
        return
    if info.options is not options:
        raise _differs("dataset", name, "options", info.options, options)
    if info.file_backed != file_backed:
        raise _differs("dataset", name, "file_backed", info.file_backed, file_backed)


def add_model(name: str, options: type[BaseModel]) -> None:
    """Called by ``models.registry.register_model``: a listed model must match its entry; another is added."""
    info = MODELS.get(name)
    if info is None:
        MODELS[name] = ModelInfo(name, options)
        return
    if info.options is not options:
        raise _differs("model", name, "options", info.options, options)


def references() -> list[Ref]:
    """Every reference of the static table (the layering tests import-check the modules they name)."""
    out: list[Ref] = []
    for a in ALGORITHMS.values():
        out += [r for r in (a.options_ref, a.check_ref) if isinstance(r, str)]
    out += [d.options_ref for d in DATASETS.values() if isinstance(d.options_ref, str)]
    out += [m.options_ref for m in MODELS.values() if isinstance(m.options_ref, str)]
    return out
