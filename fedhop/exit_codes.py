"""The exit codes of every ``fedhop`` command, in one place (the README lists them).

A runtime failure ends in one line on stderr (``fedhop <command>: <what went wrong>``) and one of these codes,
never a traceback. :class:`Fatal` carries both from wherever the failure is found to :func:`fedhop.cli.main`.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # the run started but ended abnormally (a node lost its parent mid-run, a driver error)
    USAGE = 2  # bad command line, spec or --set value; a run folder that exists (without --force)
    STARTUP = 3  # the federation could not start: a node died before round 1, or the parent refused a node
    DATA = 4  # a node cannot load its data or build its model
    ADDRESS_IN_USE = 5  # cannot listen on the given HOST:PORT (in use, or not an address of this machine)
    UNREACHABLE = 6  # the parent cannot be reached, or what answers there is not a fedhop node
    JOIN_TIMEOUT = 7  # the PS waited transport.join_timeout_s and no node joined
    NO_DEVICE = 8  # the requested device (cuda, cuda:N) is not there
    INTERRUPTED = 130  # Ctrl-C (SIGINT); the PS first writes what it has (results of the rounds done)


DESCRIPTIONS: dict[ExitCode, str] = {
    ExitCode.OK: "the run finished",
    ExitCode.FAILED: "the run started but ended abnormally (e.g. a node lost its parent mid-run)",
    ExitCode.USAGE: "bad command line, spec or --set value; an existing run folder without --force",
    ExitCode.STARTUP: "the federation could not start: a node died before round 1, or its parent refused it",
    ExitCode.DATA: "a node cannot load its data or build its model",
    ExitCode.ADDRESS_IN_USE: "cannot listen on HOST:PORT (already in use, or not an address of this machine)",
    ExitCode.UNREACHABLE: "the parent is unreachable, or what answers there is not a fedhop node",
    ExitCode.JOIN_TIMEOUT: "the PS waited transport.join_timeout_s and no node joined",
    ExitCode.NO_DEVICE: "the requested CUDA device is not there",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C); the PS writes the results of the rounds done first",
}


class Fatal(Exception):
    """A failure that ends the command with ``code`` and the one-line ``message``."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def markdown_table() -> str:
    """The README's table of exit codes."""
    rows = [f"| {int(c)} | `{c.name}` | {DESCRIPTIONS[c]} |" for c in ExitCode]
    return "\n".join(["| code | name | meaning |", "|---|---|---|", *rows])
