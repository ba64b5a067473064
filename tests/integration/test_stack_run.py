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
from fedhop.deploy import contract
from fedhop.deploy.compose import write_compose
from fedhop.deploy.contract import collect
from fedhop.deploy.link_table import LinkBytes, read_link_table
from fedhop.deploy.swarm_run import StackTestbed, placement_labels, stack_addresses
from fedhop.deploy.wire import BridgeCounters, PairBytes, WireCount, read_wire_csv
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


class FixedPairs:
    """A pair source (compose's bridge, a swarm overlay) that has counted ``pairs``."""

    def __init__(self, pairs: dict[tuple[str, str], PairBytes]) -> None:
        self.pairs = pairs

    def install(self) -> None: ...

    def read(self) -> dict[tuple[str, str], PairBytes]:
        return self.pairs

    def remove(self) -> None: ...


def test_bridge_counters_put_wire_bytes_beside_the_meters_in_wire_csv_and_link_bytes_csv(tmp_path: Path) -> None:
    with (tmp_path / "links.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src", "dst", "kind", "messages", "payload_bytes", "message_bytes"])
        w.writerow(["edge-0", "edge-1", "handoff", "2", "1000", "1100"])
        w.writerow(["edge-0", "edge-1", "bye", "1", "0", "20"])
        w.writerow(["client-0", "edge-0", "result", "3", "300", "360"])
    pairs = {("10.0.1.5", "10.0.1.6"): PairBytes(10, 1500), ("10.0.1.6", "10.0.1.5"): PairBytes(4, 200),
             ("10.0.1.5", "10.0.1.99"): PairBytes(1, 60)}  # nobody holds .99: left out
    reading = BridgeCounters(FixedPairs(pairs), lambda: {"10.0.1.5": "edge-0", "10.0.1.6": "edge-1"}).read()
    assert reading.complete and reading.notes == ("60 B between addresses no node of the run held (left out)",)
    rows = collect(tmp_path, reading)
    assert rows == [  # a bridge sees every packet: a link it has no count for carried 0 bytes
        LinkBytes("client-0", "edge-0", payload=300, message=360, wire=0, messages=3),
        LinkBytes("edge-0", "edge-1", payload=1000, message=1120, wire=1500, messages=3),
        LinkBytes("edge-1", "edge-0", payload=0, message=0, wire=200, messages=0),
    ]
    assert (tmp_path / "link_bytes.csv").read_text().splitlines() == [
        "src,dst,messages,payload_bytes,message_bytes,wire_bytes,message_per_payload,wire_per_payload,"
        "wire_minus_message",
        "client-0,edge-0,3,300,360,0,1.2000,0.0000,-360", "edge-0,edge-1,3,1000,1120,1500,1.1200,1.5000,380",
        "edge-1,edge-0,0,0,0,200,,,200"]
    assert read_link_table(tmp_path / "link_bytes.csv") == rows
    assert (tmp_path / "wire.csv").read_text().splitlines() == [
        "src,dst,packets,wire_bytes,wire_bytes_at_dst,source", "edge-0,edge-1,10,1500,,bridge",
        "edge-1,edge-0,4,200,,bridge"]
    assert read_wire_csv(tmp_path / "wire.csv") == list(reading.rows)
    assert collect(tmp_path / "nothing", reading) is None  # no run folder: nothing written
    assert not (tmp_path / "nothing").exists()


class HeldOverlay(FixedPairs):
    """An overlay whose one namespace (``1-abc``) was held and counted ``pairs``."""

    def namespaces(self) -> list[str]:
        return ["1-abc"]


def test_stack_testbed_waits_for_the_ps_task_and_writes_wire_csv_link_bytes_csv_and_the_log(
        tmp_path: Path, fake_docker) -> None:
    answer, made = fake_docker
    runs = tmp_path / "runs"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "links.csv").write_text("src,dst,kind,messages,payload_bytes,message_bytes\n"
                                           "edge-0,edge-1,handoff,2,1000,1100\n")
    done = json.dumps([{"Status": {"State": "complete", "ContainerStatus": {"ExitCode": 0}, "Err": ""}}])
    verbose = [{"Services": {"fh_edge-0": {"Tasks": [{"EndpointIP": "10.0.1.5"}]},
                             "fh_edge-1": {"Tasks": [{"EndpointIP": "10.0.1.6"}]}}}]
    answer({**MANAGER, "node inspect": nodes_with({"fedhop.ps": "true", "fedhop.edges": "true",
                                                   "fedhop.clients": "true"}),
            "stack deploy": "", "service ps fh_ps": "t1\n", "stack ps fh": "t1\n", "inspect t1": done,
            "network inspect --verbose fh_fl": json.dumps(verbose), "network inspect fh_fl": json.dumps([{}]),
            "stack services fh": "fh_ps\n", "service logs --no-task-ids fh_ps": "results in /runs/r1\n"})
    bed = StackTestbed("fh", project(tmp_path), runs, "r1", settle_s=30)
    overlay = HeldOverlay({("10.0.1.5", "10.0.1.6"): PairBytes(12, 1700), ("10.0.1.6", "10.0.1.5"): PairBytes(5, 300)})
    bed.overlay = overlay
    bed.counters = BridgeCounters(overlay, lambda: bed.book.book, backend="overlay")
    outcome = contract.run(bed, timeout_s=60)
    assert outcome.rc == 0 and outcome.out == (runs / "r1").resolve()
    assert outcome.links == [LinkBytes("edge-0", "edge-1", 1000, 1100, 1700, 2),
                             LinkBytes("edge-1", "edge-0", 0, 0, 300, 0)]
    assert read_wire_csv(runs / "r1" / "wire.csv")[0] == WireCount("edge-0", "edge-1", 12, 1700, None, "overlay")
    assert read_link_table(runs / "r1" / "link_bytes.csv") == outcome.links
    log = (runs / "r1.stack.log").read_text()
    assert log.startswith("results in /runs/r1\n")
    assert "[fedhop stack-run] PS task complete, exit code 0\n" in log
    assert "counters in overlay namespaces 1-abc" in log
    assert "stack deploy -c docker-compose.yml fh" in made()
    assert not any(c.startswith("stack rm") for c in made())  # the caller removes the stack
