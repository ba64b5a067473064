"""The command line as a process: `fedhop spec` prints the built-in default run (the in-process checks of the
command line are in tests/unit/test_cli.py)."""

from __future__ import annotations

import subprocess
import sys

from fedhop.cli.console import DEFAULT_SPEC
from fedhop.common.spec import RunSpec


def test_the_minimal_spec_is_the_built_in_default_run():
    """The default run sets only its name and topology; a user's minimal spec with that topology is the same
    run, and `fedhop spec` prints it."""
    minimal = RunSpec.parse({"name": "default-digits-fedavg", "topology": {"clients": 6, "edges": 2}})
    assert RunSpec.load(DEFAULT_SPEC) == minimal
    printed = subprocess.run([sys.executable, "-m", "fedhop", "spec"], capture_output=True, text=True, check=True)
    shown = RunSpec.from_toml(printed.stdout)  # `fedhop spec` writes every algorithm option out
    assert shown.options() == minimal.options()
    assert shown.model_dump(exclude={"algorithm"}) == minimal.model_dump(exclude={"algorithm"})
    assert shown.algorithm.name == minimal.algorithm.name
