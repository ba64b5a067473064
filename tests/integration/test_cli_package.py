"""Importing the CLI package (and building its parser, and a light command) imports no torch: each checked in a
fresh interpreter (the CLI package's other contracts are in tests/unit/test_cli_package.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _modules_after(code: str) -> set[str]:
    probe = code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_importing_the_cli_and_building_its_parser_imports_no_torch() -> None:
    loaded = _modules_after("import fedhop.cli\nfedhop.cli.build_parser()")
    assert "fedhop.cli.app" in loaded  # the probe did build the parser
    assert "torch" not in loaded
    assert not {m for m in loaded if m.startswith("fedhop.common.engine")}


def test_a_light_command_and_help_import_no_torch() -> None:
    loaded = _modules_after(
        "from fedhop.cli import main\n"
        "assert main(['health', '127.0.0.1:1', '--timeout', '0']) == 2\n"
        "try:\n    main(['launch', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n")
    assert "torch" not in loaded
