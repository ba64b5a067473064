"""The ``fedhop`` command line: the parser of every command and :func:`main`.

Each command group is its own module (``run``: simulate, launch; ``reproduce``: reproduce, compare; ``spec``:
spec, algorithms; ``deploy``: testbed, compose, compose-run, stack-run, health; ``roles``: server, edge,
client, clients; ``identity``: certs, tokens; ``new``: new protocol); their handlers import what they run
when called, so building the parser imports no torch. How a failure ends (exit code, one line on stderr): ``errors.py``;
a mistake on the command line is one line with a did-you-mean (``errors.UsageParser``, ``suggest.py``), exit 2.
Every command takes ``--log-level`` (``errors.UsageParser`` adds it, so a command registered below gets it too).

Exit codes: common/exit_codes.py (and the README).
"""

from __future__ import annotations

import argparse

from fedhop.cli import browse, check, deploy, identity, new, plan, reproduce, roles, run, spec
from fedhop.cli.console import HelpFormatter
from fedhop.cli.errors import run_command


def build_parser() -> argparse.ArgumentParser:
    from fedhop import __version__
    from fedhop.cli.errors import UsageParser

    p = UsageParser(prog="fedhop", description="The ``fedhop`` command line: launch, simulate, one "
                    "role per process, reproduce, compare.\n\nExit codes: common/exit_codes.py (and "
                    "the README).", formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"fedhop {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=UsageParser)
    run.add_simulate(sub)
    reproduce.add_commands(sub)
    spec.add_commands(sub)
    deploy.add_testbed(sub)
    run.add_launch(sub)
    run.add_rerun(sub)
    plan.add_commands(sub)
    roles.add_commands(sub, HelpFormatter)
    deploy.add_commands(sub)
    identity.add_commands(sub)
    check.add_commands(sub)
    new.add_commands(sub, HelpFormatter)
    browse.add_commands(sub, HelpFormatter)  # ls, show, ui
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one ``fedhop`` command; its exit code (errors.py maps every failure to one). A mistake on the command
    line exits here (SystemExit 2, one line on stderr), as do ``--help`` and ``--version`` (0)."""
    import sys

    from fedhop.cli.console import set_log_level
    from fedhop.cli.errors import broken_pipe

    try:
        args = build_parser().parse_args(argv)
        set_log_level(args.log_level)
        if argv is None:  # this process's own command line (python -m fedhop, the console script)
            from fedhop.common import heap

            heap.claim()
        rc = run_command(f"fedhop {getattr(args, 'title', args.cmd)}", lambda: _own_process() or args.fn(args))
        sys.stdout.flush()  # here, not at exit: a reader that went away is a broken pipe, handled below
        return rc
    except BrokenPipeError as e:  # `fedhop algorithms | head -1`
        return broken_pipe(e)


def _own_process() -> None:
    """A process fedhop owns (its command line, a forked role process: ``heap.claim()``) settles its heap once its
    federation joined (common/heap.py); a caller that runs a command in its own process (``main([...])``, as the
    tests do) keeps its garbage collector as it was. A bad ``FEDHOP_GC_FREEZE`` ends the command (usage)."""
    from fedhop.common import heap
    from fedhop.common.exit_codes import ExitCode, Fatal

    if heap.SETTLER.claimed:
        try:
            heap.own_process()
        except ValueError as e:
            raise Fatal(ExitCode.USAGE, str(e)) from None

