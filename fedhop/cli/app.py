"""The ``fedhop`` command line: the parser of every command and :func:`main`.

Each command group is its own module (``run``: simulate, launch; ``reproduce``: reproduce, compare; ``spec``:
spec, algorithms; ``deploy``: testbed, compose, compose-run, stack-run, health; ``roles``: server, edge,
client, clients; ``identity``: certs, tokens; ``new``: new protocol); their handlers import what they run
when called, so building the parser imports no torch. How a failure ends (exit code, one line on stderr): ``errors.py``.

Exit codes: common/exit_codes.py (and the README).
"""

from __future__ import annotations

import argparse

from fedhop.cli import browse, check, deploy, identity, new, reproduce, roles, run, spec
from fedhop.cli.console import HelpFormatter
from fedhop.cli.errors import run_command


def build_parser() -> argparse.ArgumentParser:
    from fedhop import __version__

    p = argparse.ArgumentParser(prog="fedhop", description="The ``fedhop`` command line: launch, simulate, one "
                                "role per process, reproduce, compare.\n\nExit codes: common/exit_codes.py (and "
                                "the README).", formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"fedhop {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    run.add_simulate(sub)
    reproduce.add_commands(sub)
    spec.add_commands(sub)
    deploy.add_testbed(sub)
    run.add_launch(sub)
    roles.add_commands(sub, HelpFormatter)
    deploy.add_commands(sub)
    identity.add_commands(sub)
    check.add_commands(sub)
    new.add_commands(sub, HelpFormatter)
    browse.add_commands(sub, HelpFormatter)  # ls, show, ui
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one ``fedhop`` command; its exit code (errors.py maps every failure to one)."""
    args = build_parser().parse_args(argv)
    return run_command(f"fedhop {getattr(args, 'title', args.cmd)}", lambda: args.fn(args))
