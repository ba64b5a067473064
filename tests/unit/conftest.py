"""Fixtures shared by the unit tests of the wire and the session (test_fuzz_session.py, test_hostile_session.py)."""

from __future__ import annotations

import pytest

from fedhop.common.wire import codec


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
