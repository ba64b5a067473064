"""A runnable spec per built-in algorithm: ``fedhop spec --template ALGORITHM`` prints it, ``fedhop launch
--algorithm NAME`` (and ``simulate``) runs it.

Each template has a topology the algorithm accepts (two edge servers for the hierarchical algorithms, none for
the others: flat is what the papers of the algorithms that may run either way describe) and the settings of the
paper it comes from where a spec can say them: the algorithm's options, the data partition, the model. The
sizes (clients, rounds) are kept small enough to run on a laptop in seconds; the header of the printed spec names
the paper's sizes. The settings are those of the reproductions (``fedhop reproduce``, ``docs/specs/*.md``).

Torch-free: a template is a plain TOML table, validated by :class:`fedhop.common.spec.RunSpec` like any spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedhop.common import catalog
from fedhop.common.spec import RunSpec, SpecError, toml_text

CLIENTS = 6  # the default run's clients (fedhop/default_spec.toml)
EDGES = 2  # its edge servers: the hierarchical templates have as many

# data + model profiles shared by several templates
_DIGITS = {"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.5}
_MLP = {"name": "mlp", "hidden": [64]}
# Fed-CHS App. A / B.1 (docs/specs/fedchs.md; `fedhop reproduce fedchs-digits`): Dirichlet lambda 0.3, K = 20
_FEDCHS_DATA = {"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.3, "standardize": True}
# FOCUS Fig. 4 (docs/specs/focus.md 5.1; `fedhop reproduce focus-fig4`): the notebook's least squares, x0 = 0
_LSQ_DATA = {"dataset": "focus-lsq", "partition": "iid", "options": {"dim": 50, "rows_per_client": 500}}
_LSQ_MODEL = {"name": "linear", "bias": False, "init": "zeros", "dtype": "float64"}
_LSQ_LR = 6e-4 * 500  # the full-participation panel's eta, times 500 (the paper's sum loss, fedhop's mean)
_FIG4 = "FOCUS paper Fig. 4 (docs/specs/focus.md 5.1, `fedhop reproduce focus-fig4`): least squares d = 50, " \
        "500 rows a client, tau = 3, full gradients, eta = 6e-4 (x 500 rows); paper: 16 clients, 500 rounds"
# FGDRO App. G (docs/specs/fgdro.md; `fedhop reproduce fgdro-toy`, part B): imbalanced digits, logreg
_FGDRO_DATA = {"dataset": "digits", "partition": "imbalanced", "dirichlet_lambda": 0.3, "imbalance_keep": 0.2,
               "standardize": True}
_FGDRO_OPTS = {"local_steps": 16, "batch_size": 32}
_FGDRO_KL = {"beta1": 0.1, "beta2": 0.01, "beta3": 0.1, "lam": 0.5}
_FGDRO = "FGDRO App. G (docs/specs/fgdro.md, `fedhop reproduce fgdro-toy` part B): imbalanced digits (every " \
         "other class kept at 20%), Dirichlet 0.3, logistic regression, 16 local steps of batch 32"
# FedCluster E1 (docs/specs/fedcluster.md 4; `fedhop reproduce fedcluster-e1`): Gaussian label skew, softmax regression
_GAUSS_DATA = {"dataset": "fedcluster-gauss", "partition": "major_class", "rho_device": 0.5, "samples_per_client": 500,
               "options": {"dim": 20, "classes": 10, "sep": 0.5, "test": "union"}}
_LOGREG0 = {"name": "logreg", "init": "zeros"}


@dataclass(frozen=True)
class Template:
    """One algorithm's runnable spec: what the spec says besides the defaults, and where it comes from."""

    algorithm: str
    source: str  # the paper / spec section the settings come from (printed in the header)
    options: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=lambda: dict(_DIGITS))
    model: dict[str, Any] = field(default_factory=lambda: dict(_MLP))
    rounds: int = 20
    clients: int = CLIENTS
    topology: dict[str, Any] = field(default_factory=dict)  # further topology keys (edge_graph, ...)
    extra: dict[str, Any] = field(default_factory=dict)  # further top-level keys (eval_every, ...)


_TEMPLATES: tuple[Template, ...] = (
    Template("centralized-sgd", "FedCluster E1's centralized baseline (docs/specs/fedcluster.md 4.6): one trainer "
             "on the union of the devices' data, 1000 iterations of batch 60 a round, lr 0.01",
             {"lr": 0.01, "iters_per_round": 1000, "batch_size": 60},
             data={**_GAUSS_DATA, "union_of": CLIENTS}, model=_LOGREG0, rounds=10, clients=1),
    Template("dr-dsgd", _FGDRO + "; DR-DSGD mu = 2", {**_FGDRO_OPTS, "lr": 0.05, "mu": 2.0},
             data=_FGDRO_DATA, model={"name": "logreg"}),
    Template("drfa", _FGDRO + "; DRFA gamma = 1e-3", {**_FGDRO_OPTS, "lr": 0.05, "gamma": 0.001},
             data=_FGDRO_DATA, model={"name": "logreg"}),
    Template("drfa-prox", _FGDRO + "; DRFA-Prox gamma = 0.01, KL reg = 0.5",
             {**_FGDRO_OPTS, "lr": 0.05, "gamma": 0.01, "reg": 0.5}, data=_FGDRO_DATA, model={"name": "logreg"}),
    Template("fedadam", _FGDRO + "; FedAdam server lr 0.01", {**_FGDRO_OPTS, "lr": 0.05, "server_lr": 0.01,
                                                              "weighting": "uniform"},
             data=_FGDRO_DATA, model={"name": "logreg"}),
    Template("fedau", _FIG4 + "; FedAU as in the notebook", {"lr": _LSQ_LR, "local_steps": 3, "batch_size": 0,
                                                             "variant": "notebook"},
             data=_LSQ_DATA, model=_LSQ_MODEL),
    Template("fedavg", "FedAvg (McMahan et al. 2017) on the default run's data: 5 local steps of batch 32, lr 0.1, "
             "every client every round (flat; set topology.edges > 0 to average through edge servers)"),
    Template("fedchs", "Fed-CHS App. B.1 (docs/specs/fedchs.md, `fedhop reproduce fedchs-digits`): K = 20 "
             "interactions per cluster, eta_k = 1/(K sqrt(k+1)), batch 32, Dirichlet lambda 0.3; paper: 100 "
             "clients, 10 edge servers", {"K": 20, "lr": 1.0, "lr_schedule": "sqrt", "batch_size": 32},
             data=_FEDCHS_DATA),
    Template("fedcluster", "FedCluster E1 (docs/specs/fedcluster.md 4, `fedhop reproduce fedcluster-e1`): 20 local "
             "steps of batch 30, 10% of a cluster per cycle, lr 0.01, complete edge graph, Gaussian label skew "
             "(rho_device 0.5), softmax regression from 0; paper: 1000 devices, M = 10 clusters",
             {"lr": 0.01, "local_steps": 20, "batch_size": 30, "participation": 0.1},
             data=_GAUSS_DATA, model=_LOGREG0, topology={"edge_graph": "complete"}),
    Template("fgdro-cvar", _FGDRO + "; FGDRO-CVaR beta1 = 0.1, K = 2", {**_FGDRO_OPTS, "lr": 0.05, "beta1": 0.1,
                                                                        "K": 2.0},
             data=_FGDRO_DATA, model={"name": "logreg"}),
    Template("fgdro-kl", _FGDRO + "; FGDRO-KL lambda = 0.5", {**_FGDRO_OPTS, "lr": 0.05, **_FGDRO_KL},
             data=_FGDRO_DATA, model={"name": "logreg"}),
    Template("fgdro-kl-adam", _FGDRO + "; FGDRO-KL-Adam lambda = 0.5, lr 0.005",
             {**_FGDRO_OPTS, "lr": 0.005, "beta4": 0.01, "tau": 1e-3, **_FGDRO_KL},
             data=_FGDRO_DATA, model={"name": "logreg"}),
    Template("focus", _FIG4 + "; FOCUS converges exactly (relative error 1e-12 within ~60 rounds)",
             {"lr": _LSQ_LR, "local_steps": 3, "batch_size": 0, "participation": {"kind": "full"}},
             data=_LSQ_DATA, model=_LSQ_MODEL, rounds=60),
    Template("hier-local-qsgd", "Fed-CHS's baseline (docs/specs/fedchs.md, `fedhop reproduce fedchs-digits`): "
             "tau1 = 5 local steps, tau2 = 4 edge rounds, QSGD s = 127 uploads, K = 20, batch 32; paper: 100 "
             "clients, 10 edge servers", {"K": 20, "local_steps": 5, "edge_rounds": 4, "batch_size": 32,
                                          "levels": 127, "cloud_levels": 127},
             data=_FEDCHS_DATA),
    Template("hierfavg", "HierFAVG (Liu et al. 2020): kappa1 = 5 local steps, kappa2 = 2 edge rounds per cloud "
             "round, lr 0.1, batch 32", {"lr": 0.1, "local_steps": 5, "edge_rounds": 2, "batch_size": 32}),
    Template("local-adam", _FGDRO + "; LocalAdam (App. D) lr 0.005", {**_FGDRO_OPTS, "lr": 0.005, "beta3": 0.1,
                                                                      "beta4": 0.01, "tau": 1e-3},
             data=_FGDRO_DATA, model={"name": "logreg"}),
    Template("mifa", _FIG4 + "; MIFA (the correct version), eta_g = 1", {"lr": _LSQ_LR, "local_steps": 3,
                                                                          "batch_size": 0, "server_lr": 1.0},
             data=_LSQ_DATA, model=_LSQ_MODEL),
    Template("proxskip", _FIG4 + "; ProxSkip/Scaffnew communicating every tau steps",
             {"lr": _LSQ_LR, "local_steps": 3, "batch_size": 0}, data=_LSQ_DATA, model=_LSQ_MODEL),
    Template("scaffold", _FIG4 + "; SCAFFOLD option II", {"lr": _LSQ_LR, "local_steps": 3, "batch_size": 0},
             data=_LSQ_DATA, model=_LSQ_MODEL),
    Template("sg-focus", "FOCUS paper App. F.1 / Fig. 9 on a CPU proxy (docs/specs/focus.md 5.2, E5): digits, "
             "Dirichlet(0.05 x class prior) per client, tau = 3, batch 32, eta = 2e-3, 'bern' participation "
             "(90% of clients p ~ U(0.1, 0.3), 10% p ~ U(0.1, 0.9)); paper: 32 clients, CIFAR-10, 10000 rounds",
             {"lr": 2e-3, "local_steps": 3, "batch_size": 32, "participation": {"kind": "bernoulli"}},
             data={"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.05,
                   "dirichlet_mode": "per_client", "dirichlet_prior_scaled": True}),
    Template("dpsgd", "D-PSGD (Lian et al. 2017, Alg. 1) on the default run's data: one local SGD step of batch 32 "
             "(lr 0.05) per round, then gossip averaging with Metropolis-Hastings weights over a client ring "
             "(topology.peer_graph = ring; clients listen for their peers)", {"local_steps": 1, "lr": 0.05},
             rounds=40, topology={"peer_graph": "ring"}),
    Template("fedasync", "FedAsync (Xie et al. 2019) on the default run's data: 4 of 6 clients training at once, "
             "5 local steps of batch 32, alpha = 0.6, staleness (s + 1)^-0.5 (Sec. 5.2's polynomial); one round = "
             "one update mixed in", {"concurrency": 4, "alpha": 0.6, "staleness_exponent": 0.5}, rounds=60),
    Template("fedbuff", "FedBuff (Nguyen et al. 2022) on the default run's data: 4 of 6 clients training at once, "
             "buffer K = 3, 5 local steps of batch 32, server lr 1, staleness weight 1/sqrt(1 + s); one round = one "
             "server step (paper: concurrency 1000, K = 10)", {"concurrency": 4, "buffer": 3}, rounds=40),
    Template("wrwgd", "Fed-CHS's baseline (docs/specs/fedchs.md, `fedhop reproduce fedchs-digits`): one model on a "
             "Metropolis-Hastings walk, K = 20 steps of batch 32 per round", {"K": 20, "batch_size": 32},
             data=_FEDCHS_DATA),
)
TEMPLATES: dict[str, Template] = {t.algorithm: t for t in _TEMPLATES}


def template(algorithm: str) -> Template:
    """The template of a built-in algorithm (a SpecError lists the names otherwise)."""
    if algorithm not in TEMPLATES:
        try:
            catalog.algorithm(algorithm)  # unknown: its message lists the known names
        except ValueError as e:
            raise SpecError(str(e)) from None
        raise SpecError(f"no template for algorithm {algorithm!r}: templates exist for the built-in algorithms "
                        f"({', '.join(sorted(TEMPLATES))}); write your own spec (docs/protocols.md)")
    return TEMPLATES[algorithm]


def template_raw(algorithm: str) -> dict[str, Any]:
    """The template as a spec table (every option of the algorithm written out, defaults filled in)."""
    t = template(algorithm)
    info = catalog.algorithm(algorithm)
    options = info.options.model_validate(t.options).model_dump(mode="json", exclude_none=True)
    edges = EDGES if info.needs_edges else 0
    return {
        "name": f"{algorithm}-{t.data.get('dataset', 'data')}",
        "rounds": t.rounds,
        "seed": 0,
        **t.extra,
        "algorithm": {"name": algorithm, "options": options},
        "topology": {"clients": t.clients, "edges": edges, **t.topology},
        "data": dict(t.data),
        "model": dict(t.model),
    }


def template_spec(algorithm: str) -> RunSpec:
    """The template, validated."""
    return RunSpec.parse(template_raw(algorithm), f"<template {algorithm}>")


def template_toml(algorithm: str) -> str:
    """The template as the TOML ``fedhop spec --template`` prints: a header naming the settings' source and how
    to run it, then the spec."""
    t = template(algorithm)
    info = catalog.algorithm(algorithm)
    shape = "hierarchical: PS, edge servers, clients" if info.needs_edges else (
        "one client holding the pooled data" if t.clients == 1 else "flat: PS and clients")
    header = [f"{algorithm}: {info.summary}", f"Topology: {shape}.", f"Settings: {t.source}.",
              f"Run it: fedhop simulate --algorithm {algorithm}   (or: fedhop launch --algorithm {algorithm}; "
              "or save this file and pass it as the spec).",
              "Change a field: --set KEY=VALUE; every field: fedhop spec --explain " + algorithm + "."]
    lines = []
    for h in header:
        lines += _wrap(h)
    return "".join(f"# {line}\n" for line in lines) + toml_text(template_raw(algorithm))


def _wrap(text: str, width: int = 116) -> list[str]:
    out, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = "  " + word
        else:
            line = f"{line} {word}" if line else word
    return [*out, line]
