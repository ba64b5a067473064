"""``fedhop stack-run`` before it deploys anything (no Docker needed: a stand-in ``docker`` on PATH answers from a
scenario and records every call), and the pieces it shares with compose-run. The run itself, with wire bytes,
is tests/testbed/test_compose.py::test_swarm_stack_deploy_runs_to_completion."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest

from fedhop.cli import main
from fedhop.common.spec import RunSpec
from fedhop.deploy.compose import write_compose
from fedhop.deploy.compose_run import attribute
from fedhop.deploy.swarm_run import placement_labels, stack_addresses
from fedhop.deploy.wire import PairBytes
from tests.specs import run_spec

FAKE_DOCKER = """\
#!{python}
import json, os, sys
scenario = json.load(open(os.environ["FAKE_DOCKER_SCENARIO"]))
with open(os.environ["FAKE_DOCKER_CALLS"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
for key, answer in scenario.items():  # keys come longest first: the longest matching prefix wins
    if args[:len(key.split())] == key.split():
        sys.stdout.write(answer)
        sys.exit(0)
sys.stderr.write("fake docker: no answer for " + " ".join(args) + "\\n")
sys.exit(1)
"""


def spec(edges: int) -> RunSpec:
    return run_spec("fedchs" if edges else "focus", clients=3, edges=edges, edge_graph="ring", name="gen", rounds=1,
                    device=None)


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Put a stand-in ``docker`` (and ``nft``, ``nsenter``, never called here) first on PATH; returns a function
    that sets the scenario (arguments prefix -> stdout) and one that lists the calls made."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER.format(python=sys.executable))
    for tool in ("nft", "nsenter"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    scenario, calls = tmp_path / "scenario.json", tmp_path / "calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_SCENARIO", str(scenario))
    monkeypatch.setenv("FAKE_DOCKER_CALLS", str(calls))
    monkeypatch.setattr(os, "geteuid", lambda: 0)

    def answer(table: dict[str, str]) -> None:
        scenario.write_text(json.dumps(dict(sorted(table.items(), key=lambda kv: -len(kv[0].split())))))

    def made() -> list[str]:
        return calls.read_text().splitlines() if calls.exists() else []

    return answer, made


def project(tmp_path: Path, edges: int = 3) -> Path:
    folder = tmp_path / "project"
    write_compose(spec(edges), "spec.toml", folder)
    return folder


def nodes_with(labels: dict[str, str]) -> str:
    return json.dumps([{"ID": "n1", "Spec": {"Labels": labels}}])


MANAGER = {"info": "active true\n", "stack ls": "", "node ls": "n1\n"}


def test_placement_labels_are_those_the_generated_file_constrains_on(tmp_path: Path) -> None:
    assert placement_labels(project(tmp_path) / "docker-compose.yml") == {"fedhop.ps", "fedhop.edges",
                                                                          "fedhop.clients"}
    assert placement_labels(project(tmp_path / "flat", edges=0) / "docker-compose.yml") == {"fedhop.ps",
                                                                                            "fedhop.clients"}


def test_no_compose_file_is_named(tmp_path: Path, capsys) -> None:
    assert main(["stack-run", str(tmp_path)]) == 2
    assert "no docker-compose.yml in" in capsys.readouterr().err


def test_not_root_is_refused_before_docker_is_asked(tmp_path: Path, fake_docker, monkeypatch, capsys) -> None:
    _, made = fake_docker
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["stack-run", str(project(tmp_path))]) == 2
    assert "needs root" in capsys.readouterr().err
    assert made() == []


def test_no_swarm_says_how_to_make_one(tmp_path: Path, fake_docker, capsys) -> None:
    answer, made = fake_docker
    answer({"info": "inactive false\n"})
    assert main(["stack-run", str(project(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "in no swarm (state 'inactive')" in err and "docker swarm init" in err
    assert not any(c.startswith(("stack", "network")) for c in made())


def test_a_worker_is_sent_to_a_manager(tmp_path: Path, fake_docker, capsys) -> None:
    answer, _ = fake_docker
    answer({"info": "active false\n"})
    assert main(["stack-run", str(project(tmp_path))]) == 2
    assert "swarm worker: run stack-run on a manager" in capsys.readouterr().err


def test_missing_node_labels_are_named_with_the_command_that_adds_them(tmp_path: Path, fake_docker, capsys) -> None:
    answer, made = fake_docker
    answer({**MANAGER, "node inspect": nodes_with({"fedhop.ps": "true", "fedhop.edges": "false"})})
    assert main(["stack-run", str(project(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "no swarm node is labelled fedhop.clients=true, fedhop.edges=true" in err
    assert "docker node update --label-add fedhop.clients=true --label-add fedhop.edges=true NODE" in err
    assert not any(c.startswith("stack deploy") for c in made())


def test_a_stack_already_there_is_neither_deployed_over_nor_removed(tmp_path: Path, fake_docker, capsys) -> None:
    answer, made = fake_docker
    answer({**MANAGER, "stack ls": "other\nfedhop\n"})
    assert main(["stack-run", str(project(tmp_path))]) == 2
    assert "a stack 'fedhop' is deployed already: `docker stack rm fedhop` or pick --stack" in capsys.readouterr().err
    assert not any(c.startswith(("stack deploy", "stack rm")) for c in made())


def test_bad_stack_name_and_options_are_refused(tmp_path: Path, fake_docker, capsys) -> None:
    answer, made = fake_docker
    answer(MANAGER)
    assert main(["stack-run", str(project(tmp_path)), "--stack", "Fed Hop"]) == 2
    assert "stack name must be lower-case letters" in capsys.readouterr().err
    assert main(["stack-run", str(project(tmp_path)), "--timeout", "0"]) == 2
    assert "--timeout must be positive" in capsys.readouterr().err
    assert made() == []


def test_stack_addresses_map_every_task_of_the_stack_to_its_node(fake_docker) -> None:
    answer, _ = fake_docker
    verbose = [{"Services": {
        "fh_edge-0": {"Tasks": [{"Name": "fh_edge-0.1.x", "EndpointIP": "10.0.1.5"}]},
        "fh_client-2": {"Tasks": [{"Name": "fh_client-2.1.y", "EndpointIP": "10.0.1.9"}]},
        "other_ps": {"Tasks": [{"Name": "other_ps.1.z", "EndpointIP": "10.0.1.7"}]},
    }}]
    answer({"network inspect --verbose fh_fl": json.dumps(verbose)})
    assert stack_addresses("fh_fl", "fh") == {"10.0.1.5": "edge-0", "10.0.1.9": "client-2"}


def test_attribute_puts_wire_bytes_beside_the_meters_and_writes_wire_csv(tmp_path: Path) -> None:
    with (tmp_path / "links.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src", "dst", "kind", "messages", "payload_bytes", "message_bytes"])
        w.writerow(["edge-0", "edge-1", "handoff", "2", "1000", "1100"])
        w.writerow(["edge-0", "edge-1", "bye", "1", "0", "20"])
        w.writerow(["client-0", "edge-0", "result", "3", "300", "360"])
    pairs = {("10.0.1.5", "10.0.1.6"): PairBytes(10, 1500), ("10.0.1.6", "10.0.1.5"): PairBytes(4, 200),
             ("10.0.1.5", "10.0.1.99"): PairBytes(1, 60)}  # nobody holds .99: left out
    rows = attribute(tmp_path, pairs, {"10.0.1.5": "edge-0", "10.0.1.6": "edge-1"})
    assert rows == [
        {"src": "client-0", "dst": "edge-0", "payload_bytes": 300, "message_bytes": 360, "messages": 3,
         "wire_bytes": 0},
        {"src": "edge-0", "dst": "edge-1", "payload_bytes": 1000, "message_bytes": 1120, "messages": 3,
         "wire_bytes": 1500},
        {"src": "edge-1", "dst": "edge-0", "payload_bytes": 0, "message_bytes": 0, "messages": 0, "wire_bytes": 200},
    ]
    assert (tmp_path / "wire.csv").read_text().splitlines()[1:] == [
        "client-0,edge-0,3,300,360,0", "edge-0,edge-1,3,1000,1120,1500", "edge-1,edge-0,0,0,0,200"]
    assert attribute(tmp_path / "nothing", pairs, {}) == []
