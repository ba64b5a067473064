"""The unit tier's guard fires: a unit test that opens a network socket or starts a process fails with the
reason (tests/unit/conftest.py), and the tier markers are applied by folder (tests/conftest.py)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests.conftest import tier_of
from tests.unit.conftest import TierViolation

_MESSAGE = "unit tests open no sockets/processes: move this test to tests/net"


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_an_inet_socket_is_refused(family):
    with pytest.raises(TierViolation, match=_MESSAGE):
        socket.socket(family, socket.SOCK_STREAM)


def test_a_default_socket_and_a_connection_are_refused():
    with pytest.raises(TierViolation, match=_MESSAGE):
        socket.socket()
    with pytest.raises(TierViolation, match=_MESSAGE):
        socket.create_connection(("127.0.0.1", 9))


def test_a_unix_socket_pair_stays_allowed():
    """The asyncio event loop's self-pipe is an AF_UNIX socket pair: it opens no network socket."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"


def test_a_subprocess_is_refused():
    with pytest.raises(TierViolation, match=_MESSAGE):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_a_multiprocessing_process_is_refused():
    with pytest.raises(TierViolation, match=_MESSAGE):
        p = multiprocessing.get_context("spawn").Process(target=print)
        p.start()
        p.join(60)  # without the guard: a child that prints an empty line


def test_a_fork_is_refused():
    with pytest.raises(TierViolation, match=_MESSAGE):
        pid = os.fork()
        if pid == 0:  # without the guard: the child must not go on running the tests
            os._exit(0)
        os.waitpid(pid, 0)


def test_a_grpc_server_and_channel_are_refused():
    with pytest.raises(TierViolation, match=_MESSAGE):
        grpc.server(None)
    with pytest.raises(TierViolation, match=_MESSAGE):
        grpc.insecure_channel("127.0.0.1:1")


def test_the_tiers_follow_the_folders(request):
    tests = Path(__file__).resolve().parents[1]
    assert tier_of(tests / "unit" / "test_x.py") == "unit"
    assert tier_of(tests / "net" / "test_x.py") == "net"
    assert tier_of(tests / "integration" / "test_x.py") == "processes"
    assert tier_of(tests / "testbed" / "test_x.py") == "testbed"
    assert tier_of(tests / "gpu" / "test_x.py") == "gpu"
    assert tier_of(tests / "layering.py") is None
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("net") is None
