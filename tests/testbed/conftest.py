"""Testbed tests need root and a Docker engine (installed and started here if missing); they run only through
``make test-testbed``. Without root they fail with the reason rather than skip: a skipped testbed would hide
a testbed that does not work."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

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
    if removed := docker_env.remove_leftovers():
        print(f"\n[testbed] removed what a killed earlier run left: {', '.join(removed)}")
    image = docker_env.build_image()
    print(f"\n[testbed] docker {engine}; image {image} ready in {time.monotonic() - t0:.0f}s")
    return image


def _swarm_state() -> str:
    from tests.testbed.docker_env import sh

    return sh("docker", "info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()


@pytest.fixture
def single_node_swarm(docker_image: str) -> Iterator[str]:
    """A swarm of this machine with the placement labels (left as found afterwards); yields the node id."""
    from tests.testbed.docker_env import sh

    created = _swarm_state() != "active"
    if created:
        sh("docker", "swarm", "init", "--advertise-addr", "127.0.0.1")
    node = sh("docker", "info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
    sh("docker", "node", "update", "--label-add", "fedhop.ps=true", "--label-add", "fedhop.edges=true",
       "--label-add", "fedhop.clients=true", node)
    try:
        yield node
    finally:
        subprocess.run(["docker", "node", "update", "--label-rm", "fedhop.ps", "--label-rm", "fedhop.edges",
                        "--label-rm", "fedhop.clients", node], capture_output=True)
        if created:
            sh("docker", "swarm", "leave", "--force")
            subprocess.run(["docker", "network", "rm", "docker_gwbridge"], capture_output=True)  # swarm init's


@pytest.fixture(scope="session")
def compose_v2(docker_image) -> list[str]:
    from tests.testbed import docker_env

    print(f"[testbed] compose v2 {docker_env.ensure_compose_v2()}")
    return ["docker", "compose"]


CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1800"]


def ensure_chromium() -> tuple[str, str]:
    """Paths of chromium and chromedriver, installed from Debian's packages when missing."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser and driver:
        return browser, driver
    if os.geteuid() != 0:
        pytest.fail("chromium and chromium-driver are missing and installing them needs root: "
                    "apt-get install -y chromium chromium-driver")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"], check=True, env=env)
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert browser and driver, "apt-get installed chromium but chromium/chromedriver are not on PATH"
    return browser, driver


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (selenium's webdriver.Chrome), closed and its profile removed after the test."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = ensure_chromium()
    profile = tempfile.mkdtemp(prefix="fedhop-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for f in [*CHROME_FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(f)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(options=opts, service=Service(executable_path=driver_path))
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)
