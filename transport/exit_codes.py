"""Exit codes of the role processes (``fedhop server | edge | client | launch``).

0 means the run finished and the PS said so; every other code says why not. The README documents them.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0                 # the run finished as specified (the PS said Bye with finished = true)
    ERROR = 1              # an unexpected failure (its traceback is in the log)
    USAGE = 2              # bad command line or spec; cannot listen on the given address
    JOIN_FAILED = 3        # could not join: the parent stayed unreachable for --connect-timeout, or refused
    NODE_SETUP = 4         # this node cannot load its data or build its model
    PARENT_LOST = 5        # the parent died or stalled and did not come back within transport.reconnect_s
    RUN_NOT_FINISHED = 6   # the parent ended the session, but the run did not finish (e.g. the PS was lost)
    LATE_JOIN_REFUSED = 7  # the run had started and its transport.late_join is "refuse"
    RUN_MISMATCH = 8       # the parent came back running another run (another run_id)
    NOT_FEDHOP = 9         # something listens at the address, but it is not a fedhop parent
    RUN_FOLDER = 10        # server: the run folder (--out) cannot be written


def describe(code: int) -> str:
    """One line for a code, e.g. for the launcher's report of a child that exited."""
    try:
        return ExitCode(code).name.lower().replace("_", " ")
    except ValueError:
        return f"exit code {code}"
