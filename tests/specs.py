"""The one spec factory of the tests: a RunSpec from keyword arguments, every section optional.

A value left None is left out of the spec, so the RunSpec's own default applies (``device`` is the exception:
tests run on the CPU unless they say ``device=None``). Test files keep their presets (data set, model, options)
as a thin call of :func:`run_spec`::

    run_spec("fedchs", {"K": 2}, clients=6, edges=3, rounds=4, data={"dataset": "synthetic"}, model={"name": "logreg"})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedhop.common.spec import RunSpec

DIGITS: dict[str, Any] = {"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.5}
"""The digits data set split by a Dirichlet(0.5) draw, as the role and network tests use it."""

LINEAR_F64: dict[str, Any] = {"name": "linear", "bias": False, "init": "zeros", "dtype": "float64"}
"""The float64 linear model of the least-squares (FOCUS) tests."""


def focus_lsq(dim: int, rows: int, hetero: float = 1.0) -> dict[str, Any]:
    """The FOCUS least-squares data (iid, no notebook seed): ``rows`` rows of ``dim`` features per client."""
    return {"dataset": "focus-lsq", "partition": "iid",
            "options": {"dim": dim, "rows_per_client": rows, "notebook_seed": None, "hetero": hetero}}


def fgdro_toy(dim: int, samples: int, test: int = 10) -> dict[str, Any]:
    """The FGDRO toy data (iid): ``samples`` training and ``test`` test samples of ``dim`` features per client."""
    return {"dataset": "fgdro-toy", "partition": "iid",
            "options": {"dim": dim, "samples_per_client": samples, "test_per_client": test}}


def spec_dict(algorithm: str | None = "fedavg", options: Mapping[str, Any] | None = None, *,
              clients: int | None = None, edges: int | None = None, edge_graph: str | None = None,
              clients_per_edge: list[int] | None = None, rounds: int | None = None, seed: int | None = None,
              device: str | None = "cpu", name: str | None = None, data: Mapping[str, Any] | None = None,
              model: Mapping[str, Any] | None = None, transport: Mapping[str, Any] | None = None,
              **sections: Any) -> dict[str, Any]:
    """The raw spec (what a spec file holds) with the given fields; None leaves a field to its default.
    ``sections`` are further top-level fields (``testbed``, ``metrics``, ...), taken as given."""
    out: dict[str, Any] = {}
    if algorithm is not None:
        out["algorithm"] = {"name": algorithm} if options is None else {"name": algorithm, "options": dict(options)}
    topology = {k: v for k, v in (("clients", clients), ("edges", edges), ("clients_per_edge", clients_per_edge),
                                  ("edge_graph", edge_graph)) if v is not None}
    if topology:
        out["topology"] = topology
    for key, value in (("name", name), ("rounds", rounds), ("seed", seed), ("device", device)):
        if value is not None:
            out[key] = value
    for key, value in (("data", data), ("model", model), ("transport", transport)):
        if value is not None:
            out[key] = dict(value)
    out.update(sections)
    return out


def run_spec(algorithm: str | None = "fedavg", options: Mapping[str, Any] | None = None, **fields: Any) -> RunSpec:
    """The parsed (validated) RunSpec of :func:`spec_dict`'s fields."""
    return RunSpec.parse(spec_dict(algorithm, options, **fields))


class FailsFirstAttempt:
    """A fault for ``FaultPlan``: ``node`` fails the first attempt of round index ``rnd`` only (so that with
    ``min_participants`` = all clients and a retry the engine redoes that round once); ``calls`` counts how often
    that node was asked to run in that round."""

    def __init__(self, node: str = "client-0", rnd: int = 1) -> None:
        self.node, self.rnd, self.calls = node, rnd, 0

    def __call__(self, node: str, task: str, rnd: int) -> bool:
        if node == self.node and rnd == self.rnd:
            self.calls += 1
            return self.calls == 1
        return False
