"""A pip-installed (non-editable) fedhop holds everything a run needs: the wheel carries the default spec,
the compose spec, the Dockerfile, the proto and the web page's static files, and an installed copy runs its default
job's spec."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NEEDED = ["fedhop/default_spec.toml", "fedhop/deploy/Dockerfile", "fedhop/deploy/compose_spec.toml",
          "fedhop/deploy/base_image.sh", "fedhop/deploy/compose.py", "fedhop/transport/health.py",
          "fedhop/v1/fedhop.proto", "fedhop/v1/fedhop_pb2.py"]


def build_wheel(tmp: Path) -> Path:
    # from a clean copy: an in-tree build/ left by an earlier build would hand stale files to the wheel
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "runs", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", ".ruff_cache"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    wheels = list((tmp / "dist").glob("fedhop-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_carries_what_a_run_needs_and_installed_copy_runs_default_spec(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [n for n in NEEDED if n not in names] == []

    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # run from elsewhere with the installed copy first on the path: the repository must not be what answers
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = "import fedhop, sys; print(fedhop.__file__); from fedhop.cli import main; sys.exit(main(['spec']))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    first, _, spec = proc.stdout.partition("\n")
    assert first.startswith(str(target)), f"fedhop was imported from {first}, not the installed wheel"
    assert 'name = "default-digits-fedavg"' in spec


def test_the_wheel_ships_the_page(tmp_path: Path) -> None:
    """A normal (non-editable) wheel holds the page's static files beside the web package."""
    repo = REPO
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=repo, check=True, capture_output=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (repo / rel).is_symlink():  # fedhop/common -> ../common, ... (setup.py)
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).symlink_to(os.readlink(repo / rel))
        elif rel and (repo / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, src / rel)
    for rel in ("server/web/static/index.html", "server/web/static/app.js", "server/web/static/style.css"):
        assert (src / rel).is_file(), f"{rel} is not tracked by git"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("fedhop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    static = {f"fedhop/server/web/static/{p.name}" for p in (repo / "server/web/static").iterdir()}
    assert static <= names, sorted(static - names)
    assert "fedhop/server/web/app.py" in names
