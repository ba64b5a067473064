"""What makes a run folder self-describing: the resolved spec and the run's provenance.

* :func:`resolved_spec`: the spec with every default filled in, the algorithm's options included (what
  ``fedhop spec`` prints); a run folder's ``spec.toml`` holds it, so ``fedhop rerun RUN_DIR`` runs the same
  run whatever the defaults of a later fedhop are.
* :func:`collect`: ``results.json``'s ``provenance``: fedhop's version, its git commit (when it runs from a
  checkout) and a digest of its own source files, Python / torch / gRPC / protobuf versions, the CUDA devices,
  the host, the command line and its working directory, the start and end times (UTC) and the digest of the
  user code the spec names (:func:`fedhop.common.user_code.code_digest`, the one every node checks at join).

Torch-free at import and starts no process (it reads ``.git`` itself instead of running git): the unit tier
writes run folders too.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import socket
import sys
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from fedhop.common.spec import RunSpec
from fedhop.common.user_code import UserCodeError, code_digest

log = logging.getLogger("fedhop.provenance")

PACKAGES = {"torch": "torch", "grpcio": "grpc", "protobuf": "protobuf", "numpy": "numpy"}


def resolved_spec(spec: RunSpec) -> RunSpec:
    """``spec`` with its algorithm's options filled in with their defaults (the rest of a RunSpec already holds
    every default). A user algorithm whose options model cannot be built here keeps the options as given."""
    try:
        options = spec.options().model_dump(mode="json", exclude_none=True)
    except (ValueError, UserCodeError) as e:
        log.warning("the options of %s could not be resolved (%s); written as given", spec.algorithm.name, e)
        return spec
    return spec.model_copy(update={"algorithm": spec.algorithm.model_copy(update={"options": options})})


def utc(ts: float | None) -> str | None:
    """An epoch time as ISO 8601 UTC (seconds), e.g. ``2026-11-26T02:24:40Z``."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def collect(spec: RunSpec, *, started_at: float | None, ended_at: float | None,
            resumed_at: int = 0) -> dict[str, Any]:
    """The provenance of a run of ``spec``: started and ended at these epoch times (this process's part of it;
    ``resumed_at``: the 0-based round a resumed run continued at, 0 for a fresh run)."""
    try:
        user_code = code_digest(spec)
    except UserCodeError as e:  # the run imported it, so this is unexpected; the folder is still written
        user_code = f"unavailable: {e}"
    return {
        "fedhop": _version("fedhop") or "unknown (not installed)",
        "git_commit": git_commit(Path(__file__).resolve().parents[1]),  # a source tree: the checkout's root
        "source_digest": source_digest(),
        "user_code_digest": user_code,
        "python": platform.python_version(),
        "packages": {mod: _version(dist) for dist, mod in PACKAGES.items()},
        "cuda_devices": cuda_devices(),
        "host": socket.gethostname(),
        "platform": _system(),
        "command": list(sys.argv),
        "cwd": os.getcwd(),  # where the spec's relative paths and user modules were found
        "started": utc(started_at),
        "ended": utc(ended_at),
        "resumed_at_round": resumed_at + 1 if resumed_at else None,
    }


def _system() -> str:
    """The OS, its release and the machine (os.uname: platform.platform() may start a process)."""
    u = os.uname()
    return f"{u.sysname} {u.release} {u.machine}"


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def cuda_devices() -> list[str]:
    """The names of the visible CUDA devices (none when torch is not imported or sees no GPU)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def _package() -> Path:
    """The ``fedhop`` package folder as imported (in a source tree its ``common``, ``server``, ... are links)."""
    return Path(__file__).parent.parent


def git_commit(root: Path) -> str | None:
    """The commit checked out in the git work tree ``root`` (read from ``root/.git``: a folder, or a worktree's
    file ``gitdir: ...``); None when ``root`` is not a checkout (an installed fedhop) or it cannot be read."""
    dot = root / ".git"
    if not dot.exists():
        return None
    try:
        return _head_commit(dot)
    except (OSError, ValueError):
        return None


def _head_commit(dot: Path) -> str | None:
    gitdir = dot
    if dot.is_file():  # a worktree or submodule: "gitdir: PATH"
        text = dot.read_text().strip()
        if not text.startswith("gitdir:"):
            return None
        gitdir = (dot.parent / text.split(":", 1)[1].strip()).resolve()
    head = (gitdir / "HEAD").read_text().strip()
    if not head.startswith("ref:"):
        return head or None  # detached
    ref = head.split(":", 1)[1].strip()
    common = gitdir
    if (gitdir / "commondir").is_file():  # a worktree's refs live in the main repository
        common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    for base in (gitdir, common):
        if (base / ref).is_file():
            return (base / ref).read_text().strip()
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    return None


@functools.cache
def source_digest() -> str:
    """SHA-256 over fedhop's own Python source files (their paths and bytes, in path order): equal digests,
    same fedhop code, whether or not it is a git checkout or has uncommitted changes."""
    root = _package()
    files: list[str] = []
    for folder, dirs, names in os.walk(root, followlinks=True):  # a source tree's links lead to the subpackages
        dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
        files += [os.path.relpath(os.path.join(folder, n), root) for n in names if n.endswith(".py")]
    h = hashlib.sha256()
    for rel in sorted(files):
        try:
            data = (root / rel).read_bytes()
        except OSError:
            continue
        h.update(rel.encode() + b"\0" + data + b"\0")
    return h.hexdigest()
