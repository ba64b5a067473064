"""The unit tier's guard (no sockets, no processes: see tests/conftest.py) and fixtures shared by the unit tests of
the wire and the session (test_fuzz_session.py, test_hostile_session.py)."""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import socket
import subprocess
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest

from fedhop.common.wire import codec


class TierViolation(RuntimeError):
    """A unit test opened a network socket or started a process (or a gRPC server / channel)."""


_MOVE = "unit tests open no sockets/processes: move this test to tests/net"


def _refuse(what: str):
    raise TierViolation(f"{_MOVE} (or tests/integration if it starts processes); it tried {what}")


@contextlib.contextmanager
def no_sockets_or_processes() -> Iterator[None]:
    """While active: creating an AF_INET/AF_INET6 socket, starting a subprocess, a multiprocessing process, a
    fork, a gRPC server or a gRPC channel raises :class:`TierViolation`. AF_UNIX sockets (the asyncio event
    loop's self-pipe) stay allowed."""
    real_socket_init = socket.socket.__init__

    def guarded_socket_init(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
            name = "AF_INET" if family in (-1, socket.AF_INET) else "AF_INET6"
            _refuse(f"socket.socket({name})")
        real_socket_init(self, family, type, proto, fileno)

    def refusing(what: str):
        def refuse(*args, **kwargs):
            _refuse(what)
        return refuse

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "__init__", guarded_socket_init)
        mp.setattr(subprocess.Popen, "__init__", refusing("subprocess.Popen"))
        mp.setattr(multiprocessing.process.BaseProcess, "start", refusing("a multiprocessing process start"))
        mp.setattr(os, "fork", refusing("os.fork"))
        mp.setattr(os, "posix_spawn", refusing("os.posix_spawn"))
        mp.setattr(os, "posix_spawnp", refusing("os.posix_spawnp"))
        mp.setattr(grpc, "server", refusing("grpc.server"))
        mp.setattr(grpc, "insecure_channel", refusing("grpc.insecure_channel"))
        mp.setattr(grpc, "secure_channel", refusing("grpc.secure_channel"))
        mp.setattr(grpc.aio, "server", refusing("grpc.aio.server"))
        mp.setattr(grpc.aio, "insecure_channel", refusing("grpc.aio.insecure_channel"))
        mp.setattr(grpc.aio, "secure_channel", refusing("grpc.aio.secure_channel"))
        yield


@pytest.fixture(autouse=True, scope="session")
def _fonts_known() -> None:
    """matplotlib asks ``fc-list`` (a process) for the system fonts the first time it is imported without a font
    cache; that is set-up of the test machine, not the test's doing, so it happens before the guard."""
    import matplotlib.font_manager  # noqa: F401


@pytest.fixture(autouse=True, scope="module")
def _unit_tier_guard() -> Iterator[None]:
    """Every unit test module runs under :func:`no_sockets_or_processes` (its module fixtures included)."""
    with no_sockets_or_processes():
        yield


@pytest.fixture
def allocations(monkeypatch) -> list[int]:
    """Every decode buffer the codec allocates (its size)."""
    sizes: list[int] = []
    real = codec._allocate

    def record(size: int):
        sizes.append(size)
        return real(size)

    monkeypatch.setattr(codec, "_allocate", record)
    return sizes
