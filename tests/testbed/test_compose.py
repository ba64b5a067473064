"""The compose testbed end to end (root + Docker; ``make test-testbed``): a generated compose file runs a short
Fed-CHS job (PS, three edges, clients) and a short FOCUS job (no edges) to completion under Compose v2 and
Compose v1, with wire bytes per link from the kernel; the same file deploys on a single-node Docker Swarm, also
with wire bytes per link.
Everything it starts is torn down (containers, networks, volumes, the swarm it created)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.deploy.compose import write_compose
from fedhop.deploy.compose_run import format_table, run_compose
from fedhop.deploy.link_table import LinkBytes, read_link_table
from fedhop.deploy.wire import read_wire_csv
from tests.specs import DIGITS, run_spec
from tests.testbed.docker_env import sh, unique_name, wait_for

CASES = {
    # edge -> edge hand-offs over a ring of three edges, one client each
    "fedchs": dict(algorithm="fedchs", clients=3, edges=3, edge_graph="ring", options={}),
    # clients straight under the PS: the generated file has no edge services
    "focus": dict(algorithm="focus", clients=3, edges=0, edge_graph="random", options={}),
}
COMPOSE = {"v2": ["docker", "compose"], "v1": ["docker-compose"]}


def spec_for(case: str, rounds: int = 3) -> RunSpec:
    c = CASES[case]
    return run_spec(c["algorithm"], c["options"], clients=c["clients"], edges=c["edges"], edge_graph=c["edge_graph"],
                    name=f"testbed-{case}", rounds=rounds, seed=7, data=DIGITS, model={"name": "mlp", "hidden": [16]},
                    # containers import torch concurrently on a small machine: joining can take minutes
                    transport={"round_deadline_s": 120.0, "join_timeout_s": 900.0})


def project_objects(project: str) -> list[str]:
    """Containers, networks and volumes Compose labelled with ``project`` that still exist."""
    label = f"label=com.docker.compose.project={project}"
    left = []
    for kind in ("container", "network", "volume"):
        cmd = ["docker", kind, "ls", "--filter", label, "--format", "{{.Name}}" if kind != "container" else
               "{{.Names}}"]
        if kind == "container":
            cmd.insert(3, "-a")
        left += [f"{kind} {n}" for n in sh(*cmd).stdout.split()]
    return left


def write_files(case: str, folder: Path, image: str, tls: bool = False) -> RunSpec:
    spec = spec_for(case)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.toml").write_text(spec.to_toml())
    if tls:  # service names are node ids, which every certificate names: no --host needed
        sh(sys.executable, "-m", "fedhop", "certs", "init", "spec.toml", "--out", "certs", cwd=folder)
    write_compose(spec, "spec.toml", folder, image=image, tls="certs" if tls else None)
    return spec


@pytest.mark.parametrize("version", ["v2", "v1"])
@pytest.mark.parametrize("case", list(CASES))
def test_compose_up_runs_to_completion_with_wire_bytes(case: str, version: str, tmp_path: Path, docker_image: str,
                                                        compose_v2) -> None:
    spec = write_files(case, tmp_path / "project", docker_image)
    compose = COMPOSE[version]
    project = unique_name(f"-{case}-{version}-")
    try:
        run = run_compose(compose, project, tmp_path / "project", tmp_path / "runs", "run", timeout_s=1500)
        print(f"\n{case} under compose {version}:\n{format_table(run.links)}")
        assert run.rc == 0, f"compose up exited {run.rc}:\n{run.log[-6000:]}"
    finally:
        subprocess.run([*compose, "-p", project, "down", "-v", "--remove-orphans"], cwd=tmp_path / "project",
                       capture_output=True)
    assert project_objects(project) == [], "compose down left objects behind"

    res = json.loads((run.run_dir / "results.json").read_text())
    assert [r["round"] for r in res["rounds"]] == list(range(1, spec.rounds + 1))
    assert res["missing"] == []
    # the PS's meter, merged from every container, and the kernel's counters, per directed link
    by_link = assert_link_levels(spec, run.links)
    table = (run.run_dir / "link_bytes.csv").read_text().splitlines()
    assert table[0] == ("src,dst,messages,payload_bytes,message_bytes,wire_bytes,message_per_payload,"
                        "wire_per_payload,wire_minus_message")
    assert len(table) == len(run.links) + 1
    assert read_link_table(run.run_dir / "link_bytes.csv") == run.links
    wire_csv = read_wire_csv(run.run_dir / "wire.csv")  # the counters, attributed to node pairs
    assert {(r.src, r.dst): r.bytes for r in wire_csv} == {(r.src, r.dst): r.wire for r in run.links if r.wire}
    if case == "fedchs":
        assert any(s.startswith("edge-") and d.startswith("edge-") and r.payload > 0
                   for (s, d), r in by_link.items()), "no edge -> edge hand-off on the wire"
    else:
        assert not any(n.startswith("edge-") for link in by_link for n in link)


def assert_link_levels(spec: RunSpec, links: list[LinkBytes]) -> dict[tuple[str, str], LinkBytes]:
    """Every tree link has a row; payload <= message <= wire wherever messages flowed; returns rows by link."""
    topo = build_topology(spec.topology, spec.seed)
    tree = {(c, p) for c, p in topo.parent.items()} | {(p, c) for c, p in topo.parent.items()}
    by_link = {(r.src, r.dst): r for r in links}
    assert tree <= set(by_link), f"links without any row: {tree - set(by_link)}"
    assert [r for r in links if r.payload > 0], "no link carried payload"
    for r in links:
        if r.message > 0:
            assert r.wire is not None and r.payload <= r.message <= r.wire, r
    return by_link


def test_swarm_stack_deploy_runs_to_completion(tmp_path: Path, docker_image: str, single_node_swarm: str) -> None:
    """`fedhop stack-run`: the same generated compose file on a single-node swarm (overlay network, placement by
    node labels, results in the PS's bind-mounted run folder) with wire bytes per link counted on the overlay's
    bridge; the stack, its network and the counters are gone afterwards."""
    project = tmp_path / "project"
    spec = write_files("fedchs", project, docker_image)
    runs = tmp_path / "runs"
    stack = unique_name("swarm")
    try:
        run = subprocess.run([sys.executable, "-m", "fedhop", "stack-run", str(project), "--stack", stack, "--runs",
                              str(runs), "--name", "swarm", "--timeout", "1500"], capture_output=True, text=True)
        print(f"\nfedchs on a single-node swarm (fedhop stack-run):\n{run.stdout}{run.stderr}")
        log = (runs / "swarm.stack.log").read_text(errors="replace") if (runs / "swarm.stack.log").exists() else ""
        assert run.returncode == 0, f"stack-run exited {run.returncode}:\n{log[-6000:]}"
        assert "counters in overlay namespaces 1-" in log, log[-2000:]
        # stack-run removed what it deployed
        assert stack not in sh("docker", "stack", "ls", "--format", "{{.Name}}").stdout.split()
        assert subprocess.run(["docker", "network", "inspect", f"{stack}_fl"], capture_output=True).returncode != 0
    finally:
        subprocess.run(["docker", "stack", "rm", stack], capture_output=True)
        wait_for("the stack's network to go", lambda: subprocess.run(
            ["docker", "network", "inspect", f"{stack}_fl"], capture_output=True).returncode != 0, 120)
    assert f"fedhop_{stack}" not in sh("nft", "list", "tables").stdout
    res = json.loads((runs / "swarm" / "results.json").read_text())
    assert [r["round"] for r in res["rounds"]] == list(range(1, spec.rounds + 1))
    assert res["missing"] == []
    links = read_link_table(runs / "swarm" / "link_bytes.csv")
    by_link = assert_link_levels(spec, links)
    assert any(s.startswith("edge-") and d.startswith("edge-") and r.payload > 0 and r.wire
               for (s, d), r in by_link.items()), "no edge -> edge hand-off on the overlay's wire"


def test_compose_with_tls_runs_to_completion(tmp_path: Path, docker_image: str, compose_v2) -> None:
    """`fedhop compose SPEC --tls certs`: every container mounts ca.crt and its own certificate and key, every role
    runs with --tls (mutual TLS on PS <-> edge, edge <-> edge and edge <-> client), the healthchecks and the
    children's lingering probe the PS over TLS; Fed-CHS runs to completion with wire bytes per link."""
    folder = tmp_path / "project"
    spec = write_files("fedchs", folder, docker_image, tls=True)
    project = unique_name("-fedchs-tls-")
    try:
        run = run_compose(compose_v2, project, folder, tmp_path / "runs", "run", timeout_s=1500)
        print(f"\nfedchs with TLS under compose v2:\n{format_table(run.links)}")
        assert run.rc == 0, f"compose up exited {run.rc}:\n{run.log[-6000:]}"
        ps_log = sh(*compose_v2, "-p", project, "logs", "--no-color", "ps", cwd=folder).stdout
        edge_log = sh(*compose_v2, "-p", project, "logs", "--no-color", "edge-0", cwd=folder).stdout
    finally:
        subprocess.run([*compose_v2, "-p", project, "down", "-v", "--remove-orphans"], cwd=folder,
                       capture_output=True)
    assert project_objects(project) == []
    assert "links: mutual TLS" in ps_log and "links: mutual TLS" in edge_log, (ps_log[-3000:], edge_log[-3000:])
    res = json.loads((run.run_dir / "results.json").read_text())
    assert [r["round"] for r in res["rounds"]] == list(range(1, spec.rounds + 1)) and res["missing"] == []
    by_link = assert_link_levels(spec, run.links)
    assert any(s.startswith("edge-") and d.startswith("edge-") and r.payload > 0
               for (s, d), r in by_link.items()), "no edge -> edge hand-off"


def test_gpu_profile_reserves_nvidia_devices_and_builds_cuda_torch(tmp_path: Path, compose_v2) -> None:
    """`docker compose --profile gpu config` (Compose's own parser; no GPU or daemon needed): the gpu service
    reserves every NVIDIA GPU and builds its image with PyPI's torch (a CUDA build) instead of the CPU index;
    without the profile there is no gpu service."""
    import yaml

    folder = tmp_path / "project"
    write_files("fedchs", folder, "fedhop:testbed")
    with_gpu = yaml.safe_load(sh(*compose_v2, "--profile", "gpu", "config", cwd=folder).stdout)
    without = yaml.safe_load(sh(*compose_v2, "config", cwd=folder).stdout)
    assert "gpu" not in without["services"] and "ps" in without["services"]
    gpu = with_gpu["services"]["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    assert devices[0]["count"] in ("all", -1)  # Compose writes "all" as -1
    args = gpu["build"]["args"]
    assert args["TORCH_SPEC"] == "torch" and args["TORCH_INDEX_URL"] == ""
    assert gpu["build"]["dockerfile"].endswith("deploy/Dockerfile") and gpu["image"] == "fedhop:gpu"
    assert gpu["command"][:4] == ["launch", "/etc/fedhop/spec.toml", "--device", "auto"]
    # and the Dockerfile turns those build args into the torch it installs
    dockerfile = (Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile").read_text()
    assert 'pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"' in dockerfile
