"""RunSpec validation: bad config fails before anything starts, naming the field."""

import pytest

from fedhop.cli.console import DEFAULT_SPEC
from fedhop.common.spec import RunSpec, SpecError


def test_default_spec_loads_and_round_trips_through_toml():
    spec = RunSpec.load(DEFAULT_SPEC)
    again = RunSpec.from_toml(spec.to_toml())
    assert again == spec


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"rounds": 0}, "rounds"),
        ({"algorithm": {"name": "nope"}}, "unknown algorithm 'nope'"),
        ({"algorithm": {"name": "fedavg", "options": {"lr": -1}}}, "algorithm.options for 'fedavg': lr"),
        ({"algorithm": {"name": "fedavg", "options": {"lrr": 0.1}}}, "lrr"),
        ({"topology": {"clients": 2, "edges": 3}}, "topology.edges (3) exceeds"),
        ({"topology": {"clients": 4, "edges": 2, "clients_per_edge": [1, 2]}}, "sum to topology.clients"),
        ({"device": "gpu"}, "device must be"),
        ({"algorithm": {"name": "hierfavg"}, "topology": {"edges": 0}}, "needs edge servers"),
        ({"transport": {"chunk_bytes": 10}}, "transport.chunk_bytes"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_bad_fields_are_named(raw, needle):
    with pytest.raises(SpecError) as e:
        RunSpec.parse(raw, "test.toml")
    assert needle in str(e.value)
    assert "test.toml" in str(e.value)


def test_bad_toml_and_missing_file(tmp_path):
    with pytest.raises(SpecError, match="not valid TOML"):
        RunSpec.from_toml("rounds = = 3")
    with pytest.raises(SpecError, match="spec file not found"):
        RunSpec.load(tmp_path / "absent.toml")


def test_options_are_typed():
    spec = RunSpec.parse({"algorithm": {"name": "fedavg", "options": {"local_steps": 3}}})
    opts = spec.options()
    assert opts.local_steps == 3 and opts.lr == 0.1


def test_data_clusters_must_match_topology():
    with pytest.raises(SpecError, match=r"data clusters \(3\) must equal topology.edges \(2\)"):
        RunSpec.parse({"topology": {"clients": 6, "edges": 2},
                       "data": {"partition": "iid", "n_clusters": 3, "cluster_iid": True}})
    ok = RunSpec.parse({"topology": {"clients": 6, "edges": 2},
                        "data": {"partition": "iid", "n_clusters": 2, "cluster_iid": True}})
    assert ok.data.n_clusters == 2


def test_fedcluster_missing_edge_links_fail_at_validation():
    with pytest.raises(SpecError, match='edge_graph = "complete"'):
        RunSpec.parse({"algorithm": {"name": "fedcluster"},
                       "topology": {"clients": 20, "edges": 6, "edge_graph": "ring"}})
    ok = RunSpec.parse({"algorithm": {"name": "fedcluster", "options": {"order": "fixed"}},
                        "topology": {"clients": 20, "edges": 6, "edge_graph": "ring"}})
    assert ok.topology.edge_graph == "ring"


def test_device_resolution_is_explicit():
    import torch

    from fedhop.common.engine.workspace import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        assert resolve_device("cuda:0") == torch.device("cuda:0")
        with pytest.raises(RuntimeError, match="GPU"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            resolve_device("cuda:0")


def test_cli_spec_fills_every_default_and_round_trips(tmp_path, capsys):
    from fedhop.cli import main

    src = tmp_path / "s.toml"
    src.write_text('[algorithm]\nname = "focus"\n[algorithm.options]\nparticipation = {kind = "uniform", m = 4}\n')
    assert main(["spec", str(src)]) == 0
    printed = capsys.readouterr().out
    full = RunSpec.from_toml(printed)
    assert full.algorithm.options["local_steps"] == 3  # FOCUS's default tau, now written out
    assert full.algorithm.options["participation"] == {"kind": "uniform", "m": 4}
    assert full.options() == RunSpec.load(src).options()


@pytest.mark.parametrize("command", ["simulate", "launch", "spec"])
def test_cli_refuses_a_bad_spec_before_starting_anything(tmp_path, capsys, command):
    from fedhop.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[topology]\nclients = 2\nedges = 3\n")
    assert main([command, str(bad), *(["--out", str(tmp_path / "run")] if command != "spec" else [])]) == 2
    assert "topology.edges (3) exceeds topology.clients (2)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
