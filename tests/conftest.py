"""Test tiers: every test gets the marker of its folder, so ``pytest -m unit`` is the inner loop.

=================  ==========  =====================================================================
folder             marker      what the tests may do
=================  ==========  =====================================================================
tests/unit         unit        no sockets, no processes (enforced: tests/unit/conftest.py); seconds
tests/net          net         loopback sockets, in-process hubs and gRPC servers, uvicorn
tests/integration  processes   real role subprocesses (PS / edge / client), the CLI as a process
tests/testbed      testbed     root and Docker (``make test-testbed``)
tests/gpu          gpu         a CUDA device (``make test-gpu``; each test skips, saying why, without one)
=================  ==========  =====================================================================

The markers are registered in pyproject.toml ([tool.pytest.ini_options] markers).

``make test`` runs the tests in two pytest-xdist workers (``-n 2 --dist loadfile``: a file's tests, and so its
module fixtures, stay in one worker). A test that measures time against the same job's time elsewhere in the
test (``@pytest.mark.serial``) runs while the other worker runs no test: see :func:`pytest_runtest_protocol`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

TIER_OF_FOLDER: dict[str, str] = {
    "unit": "unit",
    "net": "net",
    "integration": "processes",
    "testbed": "testbed",
    "gpu": "gpu",
}

_TESTS = Path(__file__).resolve().parent


def tier_of(path: Path) -> str | None:
    """The tier marker of a test file: the one of its top folder under tests/, or None outside the tiers."""
    try:
        parts = Path(path).resolve().relative_to(_TESTS).parts
    except ValueError:
        return None
    return TIER_OF_FOLDER.get(parts[0]) if len(parts) > 1 else None


# the reduced reproductions: a minute or more of CPU each, in one test; collected first, so that under xdist they
# run beside the many shorter tests instead of alone at the end
LONG_FIRST = "test_reproduce_"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=lambda item: not item.path.name.startswith(LONG_FIRST))  # stable: the rest keeps its order


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: under pytest-xdist, runs while no other test runs (timings)")


@contextlib.contextmanager
def _alone_or_shared(item: pytest.Item) -> Iterator[None]:
    """Under pytest-xdist: a ``serial`` test holds the run's lock file exclusively, every other test shares it
    (fcntl.flock; the lock is the run's, named by xdist's PYTEST_XDIST_TESTRUNUID). Outside xdist: nothing."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    mode = fcntl.LOCK_EX if item.get_closest_marker("serial") is not None else fcntl.LOCK_SH
    with open(Path(tempfile.gettempdir()) / f"fedhop-tests-{run}.lock", "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The whole protocol of a test (set-up of its module fixtures, call, teardown) under :func:`_alone_or_shared`."""
    with _alone_or_shared(item):
        yield
