"""``fedhop plan``: every node's command line per machine, each one the real parser accepts, each client
dialing its parent's address, edges advertising theirs; placement mistakes are usage errors."""

from __future__ import annotations

import json

import pytest

from fedhop.cli import build_parser, main
from fedhop.cli.console import load_spec
from fedhop.cli.plan import make_plan
from fedhop.client_ids import parse_ids
from fedhop.common.exit_codes import ExitCode
from fedhop.common.topology import build_topology

HOSTS = ["--host", "ps=ps.example.org", "--host", "edge-0=10.0.0.5", "--host", "edge-1=10.0.0.5",
         "--host", "client-0..client-1=10.0.1.1", "--host", "client-5=10.0.1.9"]


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_command_is_one_the_roles_accept(capsys: pytest.CaptureFixture[str]) -> None:
    got = plan_json(capsys, *HOSTS, "--tls", "certs", "--data-path", "/data", "--state-dir", "/var/fedhop")
    spec = load_spec(None)
    topo = build_topology(spec.topology, spec.seed)
    addr = got["addresses"]
    assert addr == {"ps": "ps.example.org:50051", "edge-0": "10.0.0.5:50061", "edge-1": "10.0.0.5:50062"}
    placed: dict[str, str] = {}
    parser = build_parser()
    for m in got["machines"]:
        for p in m["processes"]:
            assert p["argv"][0] == "fedhop"
            a = parser.parse_args(p["argv"][1:])  # the real command line parses
            assert a.tls == "certs"
            for node in p["nodes"]:
                placed[node] = m["host"]
            if p["role"] == "server":
                assert a.listen == "0.0.0.0:50051"
            elif p["role"] == "edge":
                assert a.connect == addr["ps"] and a.advertise == addr[a.id]
                assert a.listen == "0.0.0.0:" + addr[a.id].rsplit(":", 1)[1] and a.state_dir == "/var/fedhop"
            else:
                ids = [a.id] if p["role"] == "client" else parse_ids(a.ids)
                assert ids == p["nodes"] and a.data_path == "/data"
                assert {topo.parent[c] for c in ids} == {next(k for k, v in got["children"].items() if ids[0] in v)}
                assert a.connect == addr[topo.parent[ids[0]]]
    assert sorted(placed) == sorted(topo.all_nodes())
    assert placed["client-0"] == placed["client-1"] == "10.0.1.1" and placed["client-5"] == "10.0.1.9"
    assert placed["client-2"] == f"clients-of-{topo.parent['client-2']}"
    assert got["children"] == {e: [c for c in topo.clients if topo.parent[c] == e] for e in topo.edges}


def test_the_text_plan_names_machines_mapping_and_certificates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *HOSTS, "--tls", "certs"]) == 0
    text = capsys.readouterr().out
    assert "edge-0: client-0..client-2 (3)" in text and "edge-1: client-3..client-5 (3)" in text
    assert ("fedhop certs init --out certs --host ps=ps.example.org --host edge-0=10.0.0.5 --host edge-1=10.0.0.5"
            in text)
    assert "machine 10.0.0.5 (edge):" in text
    assert text.index("machine ps.example.org") < text.index("machine 10.0.0.5") < text.index("machine 10.0.1.1")


def test_a_flat_run_with_set_gives_the_ps_the_same_set(capsys: pytest.CaptureFixture[str]) -> None:
    got = plan_json(capsys, "--set", "topology.edges=0", "--set", "topology.clients=3")
    server = next(p for m in got["machines"] for p in m["processes"] if p["role"] == "server")
    assert server["argv"] == ["fedhop", "server", "--listen", "0.0.0.0:50051", "--insecure",
                              "--set", "topology.edges=0", "--set", "topology.clients=3"]
    assert got["children"] == {"ps": ["client-0", "client-1", "client-2"]}


@pytest.mark.parametrize(("host", "needle"), [
    ("edge-7=10.0.0.1", "edge-7 is not a node of this run"),
    ("client-0=10.0.0.1:5000", "a client listens on no port"),
    ("edge-0", "expected NODE=ADDR"),
    ("edge-0=h:99999", "is not a port"),
    ("client-3..client-1=h", "runs backwards"),
])
def test_placement_mistakes_are_usage_errors(host: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--host", host]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_two_listeners_on_one_port_are_refused() -> None:
    from fedhop.common.exit_codes import Fatal

    with pytest.raises(Fatal, match="both listen on h:7000"):
        make_plan(load_spec(None), None, [], ["edge-0=h:7000", "edge-1=h:7000"])
