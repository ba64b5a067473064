"""The namespace testbed's --http binding listens on loopback, or beyond it only with a bearer token (the
other checks of the testbeds' access are in tests/unit/test_testbed_access.py)."""

from __future__ import annotations

import socket

import pytest

from fedhop.deploy.netns import TestbedError
from fedhop.deploy.testbed_http import INNER_PORT, bind


def test_testbed_http_binds_here_and_needs_a_token_beyond_loopback() -> None:
    with pytest.raises(TestbedError, match="bearer token is required"):
        bind("0.0.0.0:0", None)
    fwd = bind("127.0.0.1:0", None)
    try:
        assert fwd.port > 0 and fwd.url == f"http://127.0.0.1:{fwd.port}/"
        assert fwd.inner_address("10.231.0.1") == f"127.0.0.1:{INNER_PORT}"
        with pytest.raises(TestbedError, match="cannot listen there"):
            bind(f"127.0.0.1:{fwd.port}", None)
        with socket.create_connection(("127.0.0.1", fwd.port), timeout=5):
            pass  # it listens already: the forwarder only accepts on it
    finally:
        fwd.close()
    guarded = bind("0.0.0.0:0", "x" * 20)
    try:
        assert guarded.inner_address("10.231.0.1") == f"10.231.0.1:{INNER_PORT}"
    finally:
        guarded.close()
