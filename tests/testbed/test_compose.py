"""The compose testbed end to end (root + Docker; ``make test-testbed``): a generated compose file runs a short
Fed-CHS job (PS, three edges, clients) and a short FOCUS job (no edges) to completion under Compose v2 and
Compose v1, with wire bytes per link from the kernel; the same file deploys on a single-node Docker Swarm.
Everything it starts is torn down (containers, networks, volumes, the swarm it created)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fedhop.common.engine.topology import build_topology
from fedhop.common.spec import RunSpec
from fedhop.deploy.compose import write_compose
from fedhop.deploy.compose_run import format_table, run_compose
from tests.testbed.docker_env import sh, wait_for

CASES = {
    # edge -> edge hand-offs over a ring of three edges, one client each
    "fedchs": dict(algorithm="fedchs", clients=3, edges=3, edge_graph="ring", options={}),
    # clients straight under the PS: the generated file has no edge services
    "focus": dict(algorithm="focus", clients=3, edges=0, edge_graph="random", options={}),
}
COMPOSE = {"v2": ["docker", "compose"], "v1": ["docker-compose"]}


def spec_for(case: str, rounds: int = 3) -> RunSpec:
    c = CASES[case]
    return RunSpec.parse({
        "name": f"testbed-{case}",
        "rounds": rounds,
        "seed": 7,
        "device": "cpu",
        "algorithm": {"name": c["algorithm"], "options": c["options"]},
        "topology": {"clients": c["clients"], "edges": c["edges"], "edge_graph": c["edge_graph"]},
        "data": {"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.5},
        "model": {"name": "mlp", "hidden": [16]},
        # containers import torch concurrently on a small machine: joining can take minutes
        "transport": {"round_deadline_s": 120.0, "join_timeout_s": 900.0},
    })


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


def write_files(case: str, folder: Path, image: str) -> RunSpec:
    spec = spec_for(case)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.toml").write_text(spec.to_toml())
    write_compose(spec, "spec.toml", folder, image=image)
    return spec


@pytest.mark.parametrize("version", ["v2", "v1"])
@pytest.mark.parametrize("case", list(CASES))
def test_compose_up_runs_to_completion_with_wire_bytes(case: str, version: str, tmp_path: Path, docker_image: str,
                                                        compose_v2) -> None:
    spec = write_files(case, tmp_path / "project", docker_image)
    compose = COMPOSE[version]
    project = f"fht-{case}-{version}"
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
    topo = build_topology(spec.topology, spec.seed)
    tree = {(c, p) for c, p in topo.parent.items()} | {(p, c) for c, p in topo.parent.items()}
    by_link = {(r["src"], r["dst"]): r for r in run.links}
    assert tree <= set(by_link), f"links without any row: {tree - set(by_link)}"
    carrying = [r for r in run.links if r["payload_bytes"] > 0]
    assert carrying, "no link carried payload"
    for r in run.links:
        if r["message_bytes"] > 0:
            assert r["payload_bytes"] <= r["message_bytes"] <= r["wire_bytes"], r
    wire_csv = (run.run_dir / "wire.csv").read_text().splitlines()
    assert wire_csv[0] == "src,dst,messages,payload_bytes,message_bytes,wire_bytes"
    assert len(wire_csv) == len(run.links) + 1
    if case == "fedchs":
        assert any(s.startswith("edge-") and d.startswith("edge-") and r["payload_bytes"] > 0
                   for (s, d), r in by_link.items()), "no edge -> edge hand-off on the wire"
    else:
        assert not any(n.startswith("edge-") for link in by_link for n in link)


def _swarm_state() -> str:
    return sh("docker", "info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()


def test_swarm_stack_deploy_runs_to_completion(tmp_path: Path, docker_image: str) -> None:
    """The same generated compose file on a single-node swarm: overlay network, placement by node labels,
    results in the PS's bind-mounted run folder."""
    spec = write_files("fedchs", tmp_path / "project", docker_image)
    runs = tmp_path / "runs"
    runs.mkdir()
    created = _swarm_state() != "active"
    if created:
        sh("docker", "swarm", "init", "--advertise-addr", "127.0.0.1")
    stack = "fhswarm"
    node = sh("docker", "info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
    try:
        sh("docker", "node", "update", "--label-add", "fedhop.ps=true", "--label-add", "fedhop.edges=true",
           "--label-add", "fedhop.clients=true", node)
        env = {"FEDHOP_RUNS": str(runs), "FEDHOP_RUN": "swarm", "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
        sh("docker", "stack", "deploy", "-c", "docker-compose.yml", stack, cwd=tmp_path / "project", env=env)
        network = sh("docker", "network", "inspect", f"{stack}_fl", "--format", "{{.Driver}}").stdout.strip()
        assert network == "overlay"

        def ps_finished() -> str:
            out = sh("docker", "service", "ps", f"{stack}_ps", "--format", "{{.CurrentState}}").stdout.strip()
            return out if out.split(" ")[0] in ("Complete", "Failed", "Rejected", "Shutdown") else ""

        state = wait_for("the PS task to end", ps_finished, timeout_s=1500, period_s=2)
        task = sh("docker", "service", "ps", f"{stack}_ps", "-q", "--no-trunc").stdout.split()[0]
        code = sh("docker", "inspect", task, "--format", "{{.Status.ContainerStatus.ExitCode}}").stdout.strip()
        logs = sh("docker", "service", "logs", f"{stack}_ps").stdout[-4000:]
        assert state.startswith("Complete") and code == "0", f"PS task {state}, exit {code}:\n{logs}"
    finally:
        subprocess.run(["docker", "stack", "rm", stack], capture_output=True)
        wait_for("the stack's network to go", lambda: subprocess.run(
            ["docker", "network", "inspect", f"{stack}_fl"], capture_output=True).returncode != 0, 120)
        subprocess.run(["docker", "node", "update", "--label-rm", "fedhop.ps", "--label-rm", "fedhop.edges",
                        "--label-rm", "fedhop.clients", node], capture_output=True)
        if created:
            sh("docker", "swarm", "leave", "--force")
            subprocess.run(["docker", "network", "rm", "docker_gwbridge"], capture_output=True)  # swarm init's
    res = json.loads((runs / "swarm" / "results.json").read_text())
    assert [r["round"] for r in res["rounds"]] == list(range(1, spec.rounds + 1))
    assert res["missing"] == []
