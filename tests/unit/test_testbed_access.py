"""Secure and watchable testbeds without root: the compose file's --tls wiring, the namespace testbed's
certificate check (its --http binding is in tests/net/test_testbed_access.py, the runs themselves in
tests/testbed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhop.common.spec import RunSpec
from fedhop.deploy.compose import TLS_TARGET, ComposeOptions, compose_files
from fedhop.deploy.netns import TestbedError, plan_network
from fedhop.deploy.testbed_tls import check_folder
from fedhop.transport.certs import init_folder
from tests.specs import run_spec

NODES = [("ps", "server"), ("edge-0", "edge"), ("edge-1", "edge"), ("client-0", "client"), ("client-1", "client")]


def _spec() -> RunSpec:
    return run_spec("fedchs", clients=2, edges=2, edge_graph="ring", name="t", rounds=1, device=None)


def test_compose_with_tls_mounts_only_each_nodes_own_files_and_drops_insecure() -> None:
    base, override = compose_files(_spec(), ComposeOptions(spec_path="spec.toml", tls="certs"))
    for name, svc in base["services"].items():
        cmd = svc["command"]
        assert "--insecure" not in cmd and cmd[cmd.index("--tls") + 1] == TLS_TARGET, name
        tls_mounts = sorted(v for v in svc["volumes"] if v.startswith("./certs/"))
        own = ("ca.crt", f"{name}.crt", f"{name}.key")
        assert tls_mounts == sorted(f"./certs/{f}:{TLS_TARGET}/{f}:ro" for f in own), name
        probe = svc["healthcheck"]["test"]
        if name.startswith("client-"):  # a client's health-only port is plaintext
            assert "--tls" not in probe
        else:
            assert probe[probe.index("--tls"):] == ["--tls", TLS_TARGET, "--id", name]
    gpu = override["services"]["gpu"]["command"]
    assert gpu[gpu.index("--tls") + 1] == "auto"  # one container: launch's throw-away certificates
    plain, _ = compose_files(_spec(), ComposeOptions(spec_path="spec.toml"))
    assert all("--insecure" in s["command"] or s["command"][0] == "client" for s in plain["services"].values())
    assert not any("--tls" in s["command"] for s in plain["services"].values())


def test_testbed_certificates_must_name_the_testbed_addresses(tmp_path: Path) -> None:
    net = plan_network(NODES, "10.231.0.0/16", tag="fhtest")
    plain = tmp_path / "plain"
    init_folder(plain, [n for n, _ in NODES])
    with pytest.raises(TestbedError) as e:
        check_folder(plain, net, Path("spec.toml"))
    assert "ps (10.231.0.1), edge-0 (10.231.0.2), edge-1 (10.231.0.3)" in str(e.value)
    assert "--host ps=10.231.0.1 --host edge-0=10.231.0.2 --host edge-1=10.231.0.3" in str(e.value)

    good = tmp_path / "good"
    init_folder(good, [n for n, _ in NODES], hosts={"ps": ["10.231.0.1"], "edge-0": ["10.231.0.2"],
                                                   "edge-1": ["10.231.0.3"]})
    check_folder(good, net, Path("spec.toml"))  # no error
    (good / "client-1.key").unlink()
    with pytest.raises(TestbedError, match=r"no certificate or key for \['client-1'\]"):
        check_folder(good, net, Path("spec.toml"))


