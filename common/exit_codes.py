"""The exit codes of every ``fedhop`` command and role process, in one place (the README lists them).

0 means the run finished and the PS said so; every other code says why not. A runtime failure ends in one
line on stderr (``fedhop <command>: <what went wrong>``) and one of these codes, never a traceback.
:class:`Fatal` carries both from wherever the failure is found to :func:`fedhop.cli.main`.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # the run started but ended abnormally (a driver error, too few participants, a lost node)
    ERROR = 1  # alias: an unexpected failure (its traceback is in the log)
    USAGE = 2  # bad command line, spec or --set value; a run folder that exists (without --force)
    STARTUP = 3  # the federation could not start: a node died before round 1, or the parent refused a node
    JOIN_FAILED = 3  # alias
    DATA = 4  # a node cannot load its data or build its model
    NODE_SETUP = 4  # alias
    ADDRESS_IN_USE = 5  # cannot listen on the given HOST:PORT (in use, or not an address of this machine)
    UNREACHABLE = 6  # the parent cannot be reached within --connect-timeout
    JOIN_TIMEOUT = 7  # the PS waited transport.join_timeout_s and no node joined
    NO_DEVICE = 8  # the requested device (cuda, cuda:N) is not there
    NOT_FEDHOP = 9  # something listens at the parent's address, but it is not a fedhop parent
    RUN_FOLDER = 10  # the run folder (--out) cannot be written
    PARENT_LOST = 11  # the parent died or stalled and did not come back within transport.reconnect_s
    RUN_NOT_FINISHED = 12  # the parent ended the session, but the run did not finish (e.g. the PS was lost)
    LATE_JOIN_REFUSED = 13  # the run had started and its transport.late_join is "refuse"
    RUN_MISMATCH = 14  # the parent came back running another run (another run_id), or a resume found another run
    USER_CODE = 15  # this node's user code (the modules the spec names) differs from the parameter server's
    ALREADY_FINISHED = 16  # --resume of a run that finished: nothing to do (its results are in its folder)
    INTERRUPTED = 130  # Ctrl-C (SIGINT); the PS first writes what it has (results of the rounds done)
    BROKEN_PIPE = 141  # standard output was closed early (`fedhop algorithms | head -1`): 128 + SIGPIPE, as a shell


DESCRIPTIONS: dict[ExitCode, str] = {
    ExitCode.OK: "the run finished (the PS said so)",
    ExitCode.FAILED: "the run started but ended abnormally (a driver error, too few participants after the "
                     "round's retries, a node lost mid-run); the log says which",
    ExitCode.USAGE: "bad command line, spec or --set value; an existing run folder without --force; a run folder "
                    "another process runs (the message names it)",
    ExitCode.STARTUP: "the federation could not start: a node died before round 1, or its parent refused it",
    ExitCode.DATA: "a node cannot load its data or build its model",
    ExitCode.ADDRESS_IN_USE: "cannot listen on HOST:PORT (already in use, or not an address of this machine)",
    ExitCode.UNREACHABLE: "the parent stayed unreachable for --connect-timeout (retries are logged)",
    ExitCode.JOIN_TIMEOUT: "the PS waited transport.join_timeout_s and no node joined",
    ExitCode.NO_DEVICE: "the requested CUDA device is not there",
    ExitCode.NOT_FEDHOP: "something answers at the parent's address, but it is not a fedhop parent",
    ExitCode.RUN_FOLDER: "the run folder (--out) cannot be written (checked before any port opens)",
    ExitCode.PARENT_LOST: "the parent died or stalled and did not come back within transport.reconnect_s",
    ExitCode.RUN_NOT_FINISHED: "the parent ended the session but the run did not finish (e.g. the PS died)",
    ExitCode.LATE_JOIN_REFUSED: "the run had started and transport.late_join is \"refuse\"",
    ExitCode.RUN_MISMATCH: "the parent runs another run (another run_id), or --state-dir holds another run's state",
    ExitCode.USER_CODE: "this node runs another version of the user code the spec names (algorithm.name, "
                        "model.name, model.loss, data.source, metrics) than the PS: its code digest differs",
    ExitCode.ALREADY_FINISHED: "--resume of a run that finished: all its rounds are done and its results are "
                               "written; nothing was started",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C); the PS writes the results of the rounds done first",
    ExitCode.BROKEN_PIPE: "standard output was closed early (piped into head, say): the command stops quietly, as "
                          "one killed by SIGPIPE would (128 + 13); nothing else went wrong",
}


class Fatal(Exception):
    """A failure that ends the command with ``code`` and the one-line ``message``."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def describe(code: int) -> str:
    """One line for a code, e.g. for the launcher's report of a child that exited."""
    try:
        return ExitCode(code).name.lower().replace("_", " ")
    except ValueError:
        return f"exit code {code}"


def markdown_table() -> str:
    """The README's table of exit codes."""
    rows = [f"| {int(c)} | `{c.name}` | {DESCRIPTIONS[c]} |" for c in ExitCode]
    return "\n".join(["| code | name | meaning |", "|---|---|---|", *rows])
