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
"""

from __future__ import annotations

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
