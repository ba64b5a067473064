"""Each node builds only what it needs: a client's own partition, the PS's test set; both bit-identical to what
the in-process engine (every partition at once) gives. Also the ``trace`` participation model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedhop.common.algorithms.participation import ParticipationProcess, TraceParticipation
from fedhop.common.data import DataSpec, build_federated_data
from fedhop.common.data.build import build_client_data, build_test_data
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec, SpecError
from tests.specs import run_spec
from tests.unit import byo_fixtures

CASES = [
    {"dataset": "digits", "partition": "iid"},
    {"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.3},
    {"dataset": "digits", "partition": "dirichlet", "dirichlet_mode": "per_client", "standardize": True},
    {"dataset": "digits", "partition": "shards", "shards_per_client": 2, "train_limit": 900},
    {"dataset": "synthetic", "partition": "major_class", "rho_device": 0.5, "n_clusters": 2, "rho_cluster": 0.5,
     "samples_per_client": 100},
    {"dataset": "synthetic", "partition": "imbalanced", "test_limit": 50},
    {"dataset": "digits-img", "partition": "dirichlet", "n_clusters": 2, "cluster_iid": True, "standardize": True},
    {"dataset": "focus-lsq", "partition": "iid", "options": {"dim": 5, "rows_per_client": 7}},
    {"dataset": "leaf-synthetic", "partition": "iid", "standardize": True, "train_limit": 20},
]


def _same(a, b) -> None:
    assert a.x.dtype == b.x.dtype and a.y.dtype == b.y.dtype
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['dataset']}-{c['partition']}")
def test_one_client_alone_equals_its_partition_of_everything(case: dict) -> None:
    spec = DataSpec.model_validate(case)
    n, seed = 6, 11
    fed = build_federated_data(spec, n, seed)
    for k in (0, 3, n - 1):
        own, meta = build_client_data(spec, n, seed, k)
        _same(own, fed.clients[k])
        assert (meta.input_shape, meta.num_classes, meta.task) == (fed.input_shape, fed.num_classes, fed.task)
    test, _ = build_test_data(spec, n, seed)
    _same(test, fed.test)


def _spec(**data) -> RunSpec:
    return run_spec("fedavg", {"local_steps": 2}, clients=5, rounds=2,
                    data={"dataset": "digits", "partition": "dirichlet", **data})


def test_workspace_of_a_client_loads_only_its_own_partition() -> None:
    spec = _spec()
    full = Workspace(spec, "cpu")
    ws = Workspace(spec, "cpu")
    _same(ws.client_data("client-2"), full.fed.clients[2])
    assert "fed" not in ws.__dict__ and "test" not in ws.__dict__  # nothing else was built
    p_client, p_full = ws.initial_params(), full.initial_params()  # model from the client's own data shape
    assert all(torch.equal(p_client[k], p_full[k]) for k in p_full)
    assert "test" not in ws.__dict__
    ps = Workspace(spec, "cpu")
    _same(ps.test, full.fed.test)
    assert "fed" not in ps.__dict__
    assert ps.evaluate(p_full) == full.evaluate(p_full)
    # a second client's partition builds everything (the in-process engine's case), still identical
    _same(ws.client_data("client-4"), full.fed.clients[4])
    assert "fed" in ws.__dict__
    _same(ws.client_data("client-2"), full.fed.clients[2])


def test_a_user_source_is_asked_only_for_what_the_node_needs() -> None:
    spec = RunSpec.parse({"rounds": 1, "device": "cpu", "topology": {"clients": 4},
                          "data": {"source": "tests.unit.byo_fixtures:source", "num_classes": 3},
                          "model": {"name": "tests.unit.byo_fixtures:build"}})
    byo_fixtures.CALLS.clear()
    client = Workspace(spec, "cpu")
    client.client_data("client-3")
    client.model  # noqa: B018
    assert byo_fixtures.CALLS == [("train", 3)]
    byo_fixtures.CALLS.clear()
    ps = Workspace(spec, "cpu")
    ps.model, ps.test  # noqa: B018
    assert byo_fixtures.CALLS == [("test", None)]
    byo_fixtures.CALLS.clear()
    assert Workspace(spec, "cpu").client_sizes() == {f"client-{k}": 5 + k for k in range(4)}
    assert sorted(byo_fixtures.CALLS, key=str) == sorted([("test", None)] + [("train", k) for k in range(4)], key=str)


def test_data_path_override_reaches_the_source(tmp_path: Path) -> None:
    spec = RunSpec.parse({"rounds": 1, "device": "cpu", "topology": {"clients": 2},
                          "data": {"source": "tests.unit.byo_fixtures:source", "num_classes": 3, "path": "/spec/path"},
                          "model": {"name": "tests.unit.byo_fixtures:build"}})
    ws = Workspace(spec, "cpu", str(tmp_path))
    assert ws.data_spec.path == tmp_path and ws.data_spec.source == spec.data.source


# -- trace participation ---------------------------------------------------------------------------------------

TABLE = np.array([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1]])


def _trace_spec(path: Path, rounds: int, clients: int = 4, wrap: bool = False) -> RunSpec:
    return RunSpec.parse({
        "rounds": rounds, "device": "cpu", "topology": {"clients": clients},
        "algorithm": {"name": "focus", "options": {"lr": 0.05, "local_steps": 2,
                                                   "participation": {"kind": "trace", "path": str(path),
                                                                     "wrap": wrap}}},
        "data": {"dataset": "digits", "partition": "iid", "train_limit": 200}, "model": {"name": "logreg"}})


@pytest.mark.parametrize("fmt", ["csv", "npy"])
def test_trace_is_replayed_row_by_row(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"t.{fmt}"
    if fmt == "npy":
        np.save(path, TABLE.astype(bool))
    else:
        path.write_text("# recorded\n" + "\n".join(",".join(map(str, r)) for r in TABLE) + "\n\n")
    result = InProcessEngine(_trace_spec(path, rounds=3)).run()
    assert [r["participants"] for r in result.rounds] == TABLE.sum(axis=1).tolist()
    proc = ParticipationProcess.build(TraceParticipation(path=path, wrap=True), 4, np.random.default_rng(0))
    rows = [proc.sample(r, np.random.default_rng(r)).tolist() for r in range(5)]
    assert rows == [[0, 2], [3], [0, 1, 2, 3], [0, 2], [3]]  # wraps to row 0 after the last row
    assert proc.inclusion_probabilities().tolist() == pytest.approx([2 / 3, 1 / 3, 2 / 3, 2 / 3])


def test_trace_spec_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("\n".join(",".join(map(str, r)) for r in TABLE))
    with pytest.raises(SpecError, match=r"algorithm\.options\.participation: trace .* has 4 columns, "
                                        r"topology\.clients is 5"):
        _trace_spec(path, rounds=3, clients=5)
    with pytest.raises(SpecError, match=r"has 3 rows for 4 rounds; .* set wrap = true"):
        _trace_spec(path, rounds=4)
    assert _trace_spec(path, rounds=4, wrap=True).rounds == 4
    with pytest.raises(SpecError, match="trace file not found"):
        _trace_spec(tmp_path / "absent.csv", rounds=1)
    path.write_text("1,0,2,0\n")
    with pytest.raises(SpecError, match="entries must be 0 or 1"):
        _trace_spec(path, rounds=1)
    path.write_text("1,0,1,0\n1,0\n")
    with pytest.raises(SpecError, match=r"t\.csv:2: 2 columns, the first row has 4"):
        _trace_spec(path, rounds=1)
    np.save(tmp_path / "v.npy", np.ones(4))
    with pytest.raises(SpecError, match=r"a trace is a 2-D rounds x clients table, got shape \(4,\)"):
        _trace_spec(tmp_path / "v.npy", rounds=1)
