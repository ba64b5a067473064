"""The one wait helper of the tests: poll until a predicate holds, with a timeout and a clear failure message.

A test waits for a *state* (a file, a status API, a test gate of common/testhooks.py, a process's exit), never
for a fixed time::

    wait_until((gates / "at-1").exists, "round 1 to end", timeout=120, stop_if=exited(ps, "the PS"),
               details=fed.all_logs)
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05


class WaitTimeout(AssertionError):
    """The state did not come within the timeout, or a ``stop_if`` check said it never will."""


def wait_until(predicate: Callable[[], T], what: str, *, timeout: float = 60.0, poll: float = POLL_S,
               stop_if: Callable[[], str | None] | None = None,
               details: Callable[[], str] | None = None) -> T:
    """Call ``predicate`` every ``poll`` seconds until it returns a true value, and return that value.

    ``what`` names the awaited state ("round 1 to end"). ``stop_if`` is checked after each false answer: a
    string from it (e.g. "the PS exited (1)") ends the wait at once, since the state can no longer come.
    ``details`` adds context (logs) to the failure message. Raises :class:`WaitTimeout` (an AssertionError)
    after ``timeout`` seconds; the predicate is asked once more at the deadline.
    """
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        reason = stop_if() if stop_if is not None else None
        if reason:
            _fail(f"{reason} before {what}", details)
        if time.monotonic() >= end:
            value = predicate()
            if value:
                return value
            _fail(f"timed out after {timeout:g}s waiting for {what}", details)
        time.sleep(poll)


def exited(proc: subprocess.Popen, name: str = "the process") -> Callable[[], str | None]:
    """A ``stop_if`` check: the process has exited (with its code), or None while it runs."""
    def check() -> str | None:
        code = proc.poll()
        return None if code is None else f"{name} exited ({code})"
    return check


def _fail(message: str, details: Callable[[], str] | None) -> None:
    extra = details() if details is not None else ""
    raise WaitTimeout(f"{message}:\n{extra}" if extra else message)
