"""Testbed tests need root and a Docker engine (installed and started here if missing); they run only through
``make test-testbed``. Without root they fail with the reason rather than skip: a skipped testbed would hide
a testbed that does not work."""

from __future__ import annotations

import os
import time

import pytest


@pytest.fixture(scope="session")
def root() -> None:
    assert os.geteuid() == 0, ("tests/testbed needs root (network namespaces, dockerd, nftables): "
                               "run `make test-testbed` as root")


@pytest.fixture(scope="session")
def docker_image(root) -> str:
    """The fedhop image, built from this checkout; prints how long the set-up took."""
    from tests.testbed import docker_env

    t0 = time.monotonic()
    engine = docker_env.ensure_engine()
    image = docker_env.build_image()
    print(f"\n[testbed] docker {engine}; image {image} ready in {time.monotonic() - t0:.0f}s")
    return image


@pytest.fixture(scope="session")
def compose_v2(docker_image) -> list[str]:
    from tests.testbed import docker_env

    print(f"[testbed] compose v2 {docker_env.ensure_compose_v2()}")
    return ["docker", "compose"]
