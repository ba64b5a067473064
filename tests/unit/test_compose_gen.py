"""``fedhop compose``: one service per node with the right parents, a base file that ``docker stack deploy``
accepts, an override with health-ordered start, and the committed docker-compose files up to date."""

from __future__ import annotations

from pathlib import Path

import yaml

from fedhop.cli import main
from fedhop.common.spec import RunSpec
from fedhop.deploy.compose import ComposeOptions, compose_files
from tests.specs import run_spec

REPO = Path(__file__).resolve().parents[2]


def spec(edges: int, clients: int, algorithm: str = "fedavg") -> RunSpec:
    return run_spec(algorithm, clients=clients, edges=edges, edge_graph="ring", name="gen", rounds=2, device=None)


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_one_service_per_node_with_parents_from_the_topology() -> None:
    base, override = compose_files(spec(3, 7, "fedchs"), ComposeOptions(spec_path="s.toml"))
    svc = base["services"]
    assert list(svc) == ["ps", "edge-0", "edge-1", "edge-2", *[f"client-{i}" for i in range(7)]]
    assert svc["ps"]["command"][:2] == ["server", "/etc/fedhop/spec.toml"]
    assert svc["ps"]["volumes"] == ["./s.toml:/etc/fedhop/spec.toml:ro", "${FEDHOP_RUNS:-./runs}:/runs"]
    for e in ("edge-0", "edge-1", "edge-2"):
        cmd = svc[e]["command"]
        assert (flag(cmd, "--id"), flag(cmd, "--connect"), flag(cmd, "--advertise")) == (e, "ps:50051", f"{e}:50061")
    parents = {c: flag(svc[c]["command"], "--connect") for c in svc if c.startswith("client-")}
    assert sorted(set(parents.values())) == ["edge-0:50061", "edge-1:50061", "edge-2:50061"]
    for c, addr in parents.items():
        assert override["services"][c]["depends_on"] == {addr.split(":")[0]: {"condition": "service_healthy"}}
        assert flag(svc[c]["command"], "--health") == "0.0.0.0:50070"
        assert flag(svc[c]["command"], "--linger-until") == "ps:50051"
    assert override["services"]["edge-1"]["depends_on"] == {"ps": {"condition": "service_healthy"}}


def test_flat_topology_clients_dial_the_ps() -> None:
    base, _ = compose_files(spec(0, 3, "focus"), ComposeOptions(spec_path="s.toml"))
    svc = base["services"]
    assert list(svc) == ["ps", "client-0", "client-1", "client-2"]
    assert {flag(svc[c]["command"], "--connect") for c in svc if c != "ps"} == {"ps:50051"}


def test_clients_of_the_peer_graph_listen_for_their_peers() -> None:
    """WRWGD hands the model client -> client: every client listens (on the edges' port of its own container) and
    advertises its service name; a FedAvg client listens on nothing but its health port."""
    svc = compose_files(spec(0, 3, "wrwgd"), ComposeOptions(spec_path="s.toml"))[0]["services"]
    for c in ("client-0", "client-1", "client-2"):
        cmd = svc[c]["command"]
        assert (flag(cmd, "--listen"), flag(cmd, "--advertise")) == ("0.0.0.0:50061", f"{c}:50061")
        assert "--insecure" in cmd  # listening beyond loopback on plaintext is said out loud, as for an edge
    plain = compose_files(spec(0, 3, "fedavg"), ComposeOptions(spec_path="s.toml"))[0]["services"]
    assert "--listen" not in plain["client-0"]["command"]


def test_base_file_keeps_to_what_docker_stack_deploy_accepts() -> None:
    base, override = compose_files(spec(2, 4), ComposeOptions(spec_path="s.toml"))
    for name, s in base["services"].items():
        assert "profiles" not in s and "depends_on" not in s, name
        assert s["deploy"]["restart_policy"] == {"condition": "none"}
        assert s["deploy"]["placement"]["constraints"][0].startswith("node.labels.fedhop.")
        assert s["healthcheck"]["test"][:3] == ["CMD", "fedhop", "health"]
    assert base["networks"] == {"fl": {}}  # bridge under compose, overlay under swarm
    gpu = override["services"]["gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert gpu["build"]["args"]["TORCH_SPEC"] == "torch"


def test_committed_compose_files_are_generated_from_the_compose_spec(tmp_path: Path) -> None:
    assert main(["compose", str(REPO / "deploy" / "compose_spec.toml"), "--spec-path", "deploy/compose_spec.toml",
                 "--out-dir", str(tmp_path)]) == 0
    for name in ("docker-compose.yml", "docker-compose.override.yml"):
        committed = (REPO / name).read_text()
        generated = (tmp_path / name).read_text()
        assert committed == generated, f"{name} is stale: run `fedhop compose deploy/compose_spec.toml --out-dir .`"
    doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert sum(n.startswith("edge-") for n in doc["services"]) == 3


def test_compose_command_prints_the_base_file(capsys) -> None:
    assert main(["compose", str(REPO / "deploy" / "compose_spec.toml"), "--spec-path", "x.toml"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["services"]["ps"]["volumes"][0] == "./x.toml:/etc/fedhop/spec.toml:ro"


def test_every_role_takes_the_specs_device_unless_compose_is_told_one(capsys) -> None:
    """As `fedhop launch` (issue 19): no --device of compose's own, so a spec saying cuda fails in a CPU container
    with NO_DEVICE instead of training on the CPU unnoticed; ``--device`` sets every role's."""
    services = compose_files(spec(1, 2), ComposeOptions(spec_path="s.toml"))[0]["services"]
    assert all("--device" not in s["command"] for s in services.values())
    services = compose_files(spec(1, 2), ComposeOptions(spec_path="s.toml", device="cpu"))[0]["services"]
    assert {flag(s["command"], "--device") for s in services.values()} == {"cpu"}
    assert main(["compose", str(REPO / "deploy" / "compose_spec.toml"), "--device", "cuda:0"]) == 0
    assert flag(yaml.safe_load(capsys.readouterr().out)["services"]["ps"]["command"], "--device") == "cuda:0"
