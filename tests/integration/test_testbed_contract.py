"""The testbed contract with real processes (the unit side is tests/unit/test_testbed_contract.py): the supervisor
stops the rest when one exits early, and compose-run and the namespace counters driven through stand-ins for
``docker``, ``nft`` and ``ip`` (small scripts run as processes). No root, no Docker."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fedhop.deploy import link_table
from fedhop.deploy.compose_run import run_compose
from fedhop.deploy.link_table import LinkBytes
from fedhop.deploy.processes import Processes
from fedhop.deploy.wire import (
    WireCount,
    read_wire_csv,
)


def test_supervisor_reports_an_early_exit_with_its_log_and_stops_the_rest(tmp_path: Path) -> None:
    procs = Processes(tmp_path / "logs")
    try:
        procs.start("quitter", [sys.executable, "-c", "import sys; print('no spec'); sys.exit(3)"])
        sleeper = procs.start("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], env={"X": "1"})
        assert procs.wait(60)["quitter"] == 3
        failure = procs.startup_failure()
        assert failure is not None and failure.startswith("quitter exited with code 3") and "no spec" in failure
    finally:
        procs.stop(5.0)
    assert sleeper.poll() is not None


# -- compose-run through the contract, with stand-ins for docker and nft ------------------------------------------
FAKE_DOCKER = """\
#!{python}
import json, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write("docker " + " ".join(args) + "\\n")
if args[-2:] == ["--exit-code-from", "ps"]:  # the run: the PS writes its meters into the run folder
    run = os.path.join(os.environ["FEDHOP_RUNS"], os.environ["FEDHOP_RUN"])
    os.makedirs(run, exist_ok=True)
    shutil.copy(os.environ["FAKE_LINKS"], os.path.join(run, "links.csv"))
    sys.exit(0)
if args[:2] == ["network", "inspect"]:
    print(json.dumps([{{"IPAM": {{"Config": [{{"Subnet": "172.30.0.0/16"}}]}},
                       "Containers": {{"c1": {{"IPv4Address": "172.30.0.2/16"}},
                                      "c2": {{"IPv4Address": "172.30.0.3/16"}}}}}}]))
elif args[0] == "inspect":
    names = {{"c1": "ps", "c2": "client-0"}}
    print(json.dumps([{{"Id": i, "Name": "/" + i, "Config": {{"Labels": {{"com.docker.compose.service": names[i]}}}}}}
                      for i in args[1:]]))
"""
FAKE_NFT = """\
#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write("nft " + " ".join(args) + "\\n")
if args[:2] == ["-j", "list"]:
    elem = lambda s, d, p, b: {{"elem": {{"val": {{"concat": [s, d]}}, "counter": {{"packets": p, "bytes": b}}}}}}
    print(json.dumps({{"nftables": [{{"set": {{"elem": [elem("172.30.0.2", "172.30.0.3", 5, 900),
                                                   elem("172.30.0.3", "172.30.0.2", 4, 500),
                                                   elem("172.30.0.3", "172.30.0.1", 1, 80)]}}}}]}}))
else:
    sys.stdin.read()
"""


def test_compose_run_counts_attributes_and_writes_the_per_link_table(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("nft", FAKE_NFT)):
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    links = tmp_path / "links.csv"
    links.write_text("src,dst,kind,phase,round,messages,payload_bytes,message_bytes\n"
                     "ps,client-0,model,down,1,1,600,700\nclient-0,ps,result,up,1,1,300,350\n")
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.setenv("FAKE_LINKS", str(links))
    run = run_compose(["docker", "compose"], "fhp", tmp_path, tmp_path / "runs", "r1", timeout_s=60)
    assert run.rc == 0 and run.run_dir == (tmp_path / "runs" / "r1").resolve()
    assert run.links == [LinkBytes("client-0", "ps", 300, 350, 500, 1), LinkBytes("ps", "client-0", 600, 700, 900, 1)]
    assert link_table.read_link_table(run.run_dir / "link_bytes.csv") == run.links
    assert read_wire_csv(run.run_dir / "wire.csv") == [WireCount("client-0", "ps", 4, 500, None, "bridge"),
                                                       WireCount("ps", "client-0", 5, 900, None, "bridge")]
    made = calls.read_text().splitlines()
    assert made.index("docker compose -p fhp up --no-start") < made.index(
        "nft -f -") < made.index("docker compose -p fhp up --exit-code-from ps")
    assert made[-1] == "nft delete table bridge fedhop_fhp"  # the counters go when the testbed stops
    assert "compose up ended with 0" in run.log


# -- the namespace testbed's fallback: interface counters ---------------------------------------------------------
FAKE_IP = """\
#!{python}
import json, sys
args = sys.argv[1:]
assert args[0] == "-n" and args[-2:] == ["dev", "eth0"], args
rx_bytes, rx_packets, tx_bytes, tx_packets = {{"fhx-ps": (100, 2, 300, 3), "fhx-client-0": (5000, 9, 700, 6)}}[args[1]]
print(json.dumps([{{"ifname": "eth0", "stats64": {{"rx": {{"bytes": rx_bytes, "packets": rx_packets}},
                                                  "tx": {{"bytes": tx_bytes, "packets": tx_packets}}}}}}]))
"""


def test_without_nft_a_one_peer_namespace_counts_on_its_interface(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from fedhop.deploy.kernel_bytes import NamespaceCounters
    from fedhop.deploy.netns import plan_network

    (tmp_path / "ip").write_text(FAKE_IP.format(python=sys.executable))
    (tmp_path / "ip").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nft on it
    net = plan_network([("ps", "server"), ("edge-0", "edge"), ("client-0", "client")], "10.9.0.0/24", tag="fhx")
    counters = NamespaceCounters(net, {"ps": ["edge-0"], "edge-0": ["ps", "client-0"], "client-0": ["edge-0"]})
    assert counters.backend == "veth"
    counters.install()
    reading = counters.read()  # edge-0 has two peers: its interface cannot tell them apart
    assert reading.rows == (WireCount("ps", "edge-0", 3, 300, None, "veth"),
                            WireCount("edge-0", "ps", 2, 100, None, "veth"),
                            WireCount("client-0", "edge-0", 6, 700, None, "veth"),
                            WireCount("edge-0", "client-0", 9, 5000, None, "veth"))
    assert not reading.complete and "no wire count for links of ['edge-0']" in reading.notes[0]
