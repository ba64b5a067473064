"""``fedhop compose`` with a ``[network]`` profile: the services with a shaped link run through
deploy/container_net.py with NET_ADMIN, the spec and the trace files mounted, and a listening node behind the
delay proxy binds its role to loopback; without a profile nothing of that is generated."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedhop.common.spec import RunSpec, SpecError
from fedhop.deploy.compose import ComposeOptions, compose_files, write_compose
from tests.specs import run_spec


def spec(network: dict | None, edges: int = 2, clients: int = 4) -> RunSpec:
    s = run_spec("fedchs", clients=clients, edges=edges, edge_graph="ring", name="gen", rounds=2, device=None)
    return RunSpec.parse({**s.model_dump(mode="json", exclude_none=True), **({"network": network} if network else {})})


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


ENTRY = ["python", "-m", "fedhop.deploy.container_net", "--node"]


def test_without_a_profile_no_service_shapes() -> None:
    base, _ = compose_files(spec(None), ComposeOptions(spec_path="s.toml"))
    for name, svc in base["services"].items():
        assert "cap_add" not in svc and "entrypoint" not in svc, name
    assert flag(base["services"]["ps"]["command"], "--listen") == "0.0.0.0:50051"


def test_a_rate_on_the_edge_ps_links_shapes_the_ps_and_the_edges_only() -> None:
    base, _ = compose_files(spec({"edge_ps": {"mbit": 20}}), ComposeOptions(spec_path="s.toml"))
    svc = base["services"]
    shaped = {n for n, s in svc.items() if "cap_add" in s}
    assert shaped == {"ps", "edge-0", "edge-1"}  # each sends on an edge <-> PS link; no client does
    for n in shaped:
        assert svc[n]["cap_add"] == ["NET_ADMIN"]
        assert svc[n]["entrypoint"] == [*ENTRY, n, "--spec", "/etc/fedhop/spec.toml", "--"]
        assert "./s.toml:/etc/fedhop/spec.toml:ro" in svc[n]["volumes"]
    assert svc["ps"]["volumes"] == ["./s.toml:/etc/fedhop/spec.toml:ro", "${FEDHOP_RUNS:-./runs}:/runs"]
    assert svc["edge-0"]["command"][0] == "edge"  # the role's arguments, after the entrypoint's "--"
    assert flag(svc["edge-0"]["command"], "--listen") == "0.0.0.0:50061"  # no delay: no proxy


def test_delay_puts_the_listening_nodes_behind_the_proxy_and_mounts_the_traces(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "loss.csv").write_text("time_s,loss\n0,0\n30,0.02\n")
    s = spec({"client_edge": {"delay_ms": 25, "trace": "traces/loss.csv"}})
    a, _ = write_compose(s, "spec.toml", tmp_path)
    svc = yaml.safe_load(a.read_text())["services"]
    for e in ("edge-0", "edge-1"):
        assert svc[e]["entrypoint"][-3:] == ["--proxy-port", "50061", "--"]
        assert flag(svc[e]["command"], "--listen") == "127.0.0.1:50061"
        assert flag(svc[e]["command"], "--advertise") == f"{e}:50061"  # its peers still dial the service name
        assert "./traces/loss.csv:/etc/fedhop/traces/loss.csv:ro" in svc[e]["volumes"]
    assert "cap_add" not in svc["ps"]  # edge <-> PS is not shaped
    # the edges send on the lossy direction: they turn their segmentation offloads off (through the entrypoint)
    client = svc["client-0"]  # loss on what it receives (after 30 s): shaped, but it runs no proxy
    assert client["cap_add"] == ["NET_ADMIN"] and "--proxy-port" not in client["entrypoint"]
    assert client["healthcheck"]["test"][:3] == ["CMD", "fedhop", "health"]
    # Swarm's DNS lists a task once healthy, and its peers shape their links to it from then on: a shaped client
    # is probed as often as the PS and the edges (an unshaped one every 30 s)
    assert client["healthcheck"]["interval"] == "3s" and svc["ps"]["healthcheck"]["interval"] == "3s"
    assert svc["client-3"]["healthcheck"]["interval"] == "3s"
    unshaped = yaml.safe_load(write_compose(spec({"edge_ps": {"mbit": 5}}), "spec.toml", tmp_path)[0].read_text())
    assert unshaped["services"]["client-0"]["healthcheck"]["interval"] == "30s"


def test_a_trace_that_cannot_be_read_is_refused_when_the_file_is_generated(tmp_path: Path) -> None:
    s = spec({"edge_edge": {"trace": "gone.csv"}})
    with pytest.raises(SpecError, match=r"network.edge_edge.trace: cannot read .*gone.csv"):
        write_compose(s, "spec.toml", tmp_path)
    (tmp_path / "gone.csv").write_text("time_s,mbit\n0,ten\n")
    with pytest.raises(SpecError, match="row 2, column mbit: 'ten' is not a number"):
        write_compose(s, "spec.toml", tmp_path)


def test_a_delay_shapes_every_receiver_of_a_delayed_direction_clients_too() -> None:
    """The kernel delay holds what a node receives (deploy/kernel_delay.py), so a client of a delayed link runs
    the entrypoint too; the edges keep their --proxy-port for the proxy fallback (the entrypoint opens the role's
    listen address when the kernel holds the delay)."""
    base, _ = compose_files(spec({"client_edge": {"delay_ms": 25}}), ComposeOptions(spec_path="s.toml"))
    svc = base["services"]
    assert {n for n, s in svc.items() if "cap_add" in s} == {"edge-0", "edge-1", *(f"client-{i}" for i in range(4))}
    assert "--proxy-port" not in svc["client-0"]["entrypoint"]
    assert svc["edge-0"]["entrypoint"][-3:] == ["--proxy-port", "50061", "--"]
