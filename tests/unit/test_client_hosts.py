"""Client hosts without processes: id lists (``fedhop clients --ids``), how ``launch`` groups clients into hosts,
the host's shared Workspace (each id's partition bit-identical to its own process's), and the CLI's checks."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
import torch

from fedhop.cli import build_parser, main
from fedhop.client.host import ClientPrefix, HostShare, run_clients
from fedhop.client_ids import IdListError, format_ids, parse_ids, resolve_per_process
from fedhop.common.engine.workspace import Workspace
from fedhop.common.exit_codes import ExitCode
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.launch import client_groups, role_cmd
from fedhop.transport.node_config import NodeConfig
from tests.specs import DIGITS, run_spec


def _spec(clients: int = 6, edges: int = 2) -> RunSpec:
    return run_spec("fedavg", clients=clients, edges=edges, name="hosts", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [8]})


# -- id lists ------------------------------------------------------------------------------------------------

def test_ranges_and_single_ids_in_the_order_given() -> None:
    assert parse_ids("client-0..client-3,client-12") == ["client-0", "client-1", "client-2", "client-3", "client-12"]
    assert parse_ids(" client-7 , client-2..client-3 ") == ["client-7", "client-2", "client-3"]
    assert parse_ids("client-5..client-5") == ["client-5"]
    assert len(parse_ids("client-0..client-499")) == 500


@pytest.mark.parametrize(("text", "needle"), [
    ("", "no client ids given"),
    ("client-0,,client-2", "empty item"),
    ("client-0,", "empty item"),
    ("edge-1", "'edge-1' in 'edge-1' is not a client id"),
    ("client-01", "no leading zeros"),
    ("client-x", "'client-x' in 'client-x' is not a client id"),
    ("client-3..client-1", "range 'client-3..client-1' runs backwards: write client-1..client-3"),
    ("client-0..7", "'7' in 'client-0..7' is not a client id"),
    ("client-0..client-3,client-2", "client-2 is listed twice"),
    ("client-1,client-1", "client-1 is listed twice"),
])
def test_bad_id_lists_name_the_problem(text: str, needle: str) -> None:
    with pytest.raises(IdListError) as e:
        parse_ids(text)
    assert needle in str(e.value)


@pytest.mark.parametrize("ids", [["client-0"], ["client-0", "client-1"], ["client-3", "client-4", "client-9"],
                                 ["client-9", "client-2", "client-3"], [f"client-{i}" for i in range(64)]])
def test_format_reads_back_as_the_same_ids(ids: list[str]) -> None:
    assert parse_ids(format_ids(ids)) == ids


def test_format_writes_runs_as_ranges() -> None:
    assert format_ids(["client-0", "client-1", "client-2", "client-7"]) == "client-0..client-2,client-7"


# -- launch's grouping ---------------------------------------------------------------------------------------

def test_groups_follow_the_parents_and_split_evenly() -> None:
    topo = build_topology(_spec(clients=7, edges=2).topology, 0)  # edge-0: client-0..3, edge-1: client-4..6
    assert client_groups(topo, 64) == [("edge-0", ["client-0", "client-1", "client-2", "client-3"]),
                                       ("edge-1", ["client-4", "client-5", "client-6"])]
    assert client_groups(topo, 3) == [("edge-0", ["client-0", "client-1"]), ("edge-0", ["client-2", "client-3"]),
                                      ("edge-1", ["client-4", "client-5", "client-6"])]
    assert client_groups(topo, 1) == [(topo.parent[c], [c]) for c in topo.clients]


def test_groups_without_edges_cover_every_client_once() -> None:
    topo = build_topology(_spec(clients=130, edges=0).topology, 0)
    groups = client_groups(topo, 64)
    assert [len(ids) for _, ids in groups] == [43, 43, 44]
    assert [c for _, ids in groups for c in ids] == list(topo.clients)
    assert {p for p, _ in groups} == {"ps"}
    with pytest.raises(ValueError, match="must be >= 1"):
        client_groups(topo, 0)


def test_a_host_is_started_with_its_id_list() -> None:
    cmd = role_cmd("clients", "client-0..client-3", "127.0.0.1:5", device="cpu")
    assert cmd[3:8] == ["clients", "--ids", "client-0..client-3", "--connect", "127.0.0.1:5"]
    assert role_cmd("client", "client-3", "127.0.0.1:5")[3:6] == ["client", "--id", "client-3"]


# -- the shared Workspace ------------------------------------------------------------------------------------

def test_a_hosts_partitions_are_each_clients_own_and_built_alone() -> None:
    spec = _spec()
    mine = ["client-1", "client-4", "client-5"]
    host = Workspace(spec, "cpu", own_clients=mine)
    every = Workspace(spec, "cpu").fed
    for c in mine:
        got, want = host.client_data(c), every.clients[int(c.split("-")[1])]
        assert torch.equal(got.x, want.x) and torch.equal(got.y, want.y), c
    assert "fed" not in host.__dict__  # only the host's partitions were materialised
    assert host._own_many is not None and sorted(host._own_many) == [1, 4, 5]


def test_ids_outside_the_run_do_not_break_the_others_data() -> None:
    host = Workspace(_spec(clients=3, edges=0), "cpu", own_clients=["client-0", "client-9"])
    assert len(host.client_data("client-0")) > 0


def test_one_workspace_per_spec_for_every_id() -> None:
    share = HostShare(["client-0", "client-1"], "cpu")
    js = _spec().model_dump_json()
    ws = share.workspace(js)
    assert share.workspace(js) is ws and ws.spec == _spec()
    assert share.workspace(_spec(clients=4).model_dump_json()) is not ws


def test_log_records_carry_the_id_of_the_thread_that_wrote_them() -> None:
    f = ClientPrefix(["client-3"])

    def record(thread: str) -> logging.LogRecord:
        r = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
        r.threadName = thread
        f.filter(r)
        return r

    assert record("client-3").client == "client-3"
    assert record("client-3-tasks").client == "client-3"
    assert record("client-4").client == "host" and record("MainThread").client == "host"


# -- the commands --------------------------------------------------------------------------------------------

def test_bad_ids_are_a_usage_error_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clients", "--ids", "client-4..client-2", "--connect", "127.0.0.1:1"]) == ExitCode.USAGE
    assert "fedhop clients: --ids: range 'client-4..client-2' runs backwards" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "needle"), [("0", "must be >= 1 or auto, got 0"),
                                              ("many", "'many' is neither a number nor 'auto'")])
def test_launch_refuses_a_bad_clients_per_process(value: str, needle: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["launch", "--clients-per-process", value])
    assert e.value.code == ExitCode.USAGE
    assert f"argument --clients-per-process: {needle}" in capsys.readouterr().err


def test_auto_is_about_one_host_per_core_and_one_per_parent_for_small_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedhop.client_ids.cores", lambda: 2)
    assert resolve_per_process("auto", 1000) == 500
    assert resolve_per_process("auto", 6) == 16  # the floor: one host per parent
    assert resolve_per_process(3, 1000) == 3
    monkeypatch.setattr("fedhop.client_ids.cores", lambda: 16)
    assert resolve_per_process("auto", 1000) == 63
    topo = build_topology(_spec(clients=1000, edges=0).topology, 0)
    assert len(client_groups(topo, resolve_per_process("auto", 1000))) == 16


def test_help_of_the_host_and_launch_options() -> None:
    choices = build_parser()._subparsers._group_actions[0].choices
    text = " ".join(choices["clients"].format_help().split())
    assert "client-0..client-9,client-12" in text and "(default: 60.0)" in text
    assert "--tls" in text and "--state-dir" in text and "--data-path" in text
    text = " ".join(choices["launch"].format_help().split())
    assert "--clients-per-process K" in text and "(default: auto)" in text


# -- the host's exit code --------------------------------------------------------------------------------------

HOST = NodeConfig("a client host", "127.0.0.1:1")  # what the ids share (run_client is faked: never dialed)


def _fake_clients(monkeypatch: pytest.MonkeyPatch, plan: dict[str, tuple[bool, int]],
                  hold: threading.Event) -> list[str]:
    """``run_client`` replaced: id -> (says Ready first, exit code); ids with code -1 stay in the run until
    ``hold`` is set. Returns the ids that said Ready."""
    said: list[str] = []

    async def fake(config: NodeConfig, *, on_ready: Any = None, host: Any = None) -> int:
        node = config.node_id
        assert isinstance(host, HostShare) and node in host.ids
        ready, code = plan[node]
        if ready:
            said.append(node)
            on_ready(node)
        if code == -1:
            await asyncio.get_running_loop().run_in_executor(None, hold.wait, 30)
            return 0
        return code

    monkeypatch.setattr("fedhop.client.main.run_client_async", fake)
    return said


def test_an_id_that_cannot_join_ends_the_host_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    hold = threading.Event()
    said = _fake_clients(monkeypatch, {"client-0": (True, -1), "client-1": (False, ExitCode.USER_CODE),
                                       "client-2": (True, -1)}, hold)
    try:
        assert run_clients(["client-0", "client-1", "client-2"], HOST) == ExitCode.USER_CODE
        assert not hold.is_set()  # the others were still serving: the host did not wait for them
    finally:
        hold.set()
    assert "client-1" not in said


def test_once_in_the_run_the_host_waits_for_every_id_and_reports_the_first_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_clients(monkeypatch, {"client-0": (True, 0), "client-1": (True, ExitCode.PARENT_LOST),
                                "client-2": (True, ExitCode.RUN_NOT_FINISHED)}, threading.Event())
    assert run_clients(["client-0", "client-1", "client-2"], HOST) == ExitCode.PARENT_LOST


def test_a_host_whose_ids_all_finish_exits_0(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_clients(monkeypatch, {f"client-{i}": (True, 0) for i in range(40)}, threading.Event())
    assert run_clients([f"client-{i}" for i in range(40)], HOST, join_slots=3) == ExitCode.OK
