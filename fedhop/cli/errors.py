"""Every exception a ``fedhop`` command ends on, mapped to its exit code and one line, in one place.

A command fails with :class:`~fedhop.common.exit_codes.Fatal` (code and message chosen where the failure is
found), with Ctrl-C, or with one of the library's own exceptions listed in :data:`EXIT_CODES`;
:func:`run_command` prints ``fedhop <command>: <message>`` on stderr and returns the code. A run's failures
(interrupted, a node that did not start or join, a failed round, results not written) are worded for where the
run's files and logs are: :func:`run_failures`. Anything else is a bug and keeps its traceback.

The codes themselves are listed in ``common/exit_codes.py`` (and the README).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fedhop.common.exit_codes import ExitCode, Fatal

# "module:Class" -> the code its instances end a command with (message: the exception's text). A class is looked
# up only when its module is already imported (an exception of a class whose module was never imported cannot
# have been raised), so this table imports nothing: `fedhop health` does not pay for torch.
EXIT_CODES: tuple[tuple[str, ExitCode], ...] = (
    ("fedhop.common.spec:SpecError", ExitCode.USAGE),  # a bad spec file or --set value
    ("fedhop.common.engine.results:RunFolderExists", ExitCode.USAGE),  # --out holds files, no --force
    ("fedhop.common.engine.workspace:DeviceError", ExitCode.NO_DEVICE),  # --device names a missing CUDA device
    ("fedhop.transport.credentials:CredentialsError", ExitCode.USAGE),  # --tls/--token material unusable
    ("fedhop.server.web.serve:HttpConfigError", ExitCode.USAGE),  # --http beyond loopback without a token
    ("fedhop.transport.certs:CertError", ExitCode.USAGE),  # certs init/add
    ("fedhop.transport.tokens:TokenError", ExitCode.USAGE),  # tokens init
    ("fedhop.deploy.swarm_run:SwarmError", ExitCode.USAGE),  # stack-run: the stack cannot be deployed as asked
    ("fedhop.deploy.netns:TestbedError", ExitCode.USAGE),  # testbed up|clean: the host, links or certificates
    ("fedhop.reproduce:ExperimentError", ExitCode.FAILED),  # reproduce: an unknown experiment, options it refuses
)


def _loaded(ref: str) -> type[BaseException] | None:
    module, _, name = ref.partition(":")
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None


def as_fatal(e: BaseException) -> Fatal | None:
    """The code and line ``e`` ends a command with; None for an unexpected exception (a bug: it keeps its
    traceback)."""
    if isinstance(e, Fatal):
        return e
    if isinstance(e, KeyboardInterrupt):
        return Fatal(ExitCode.INTERRUPTED, "interrupted")
    for ref, code in EXIT_CODES:
        cls = _loaded(ref)
        if cls is not None and isinstance(e, cls):
            return Fatal(code, str(e))
    return None


def run_command(command: str, body: Callable[[], int | None]) -> int:
    """``body()``'s exit code; a failure of :func:`as_fatal` ends in one line on stderr, ``command: message``
    (``command``: e.g. ``fedhop server``), and its code."""
    try:
        return int(body() or 0)
    except (Exception, KeyboardInterrupt) as e:
        fatal = as_fatal(e)
        if fatal is None:
            raise
        print(f"{command}: {fatal.message}", file=sys.stderr)
        return int(fatal.code)


@dataclass(frozen=True)
class RunPlace:
    """Where a failed run's messages point: the run folder and, for ``launch``, the children's logs (the
    launcher stopped every child process before it reports)."""

    rounds: int  # the spec's rounds
    out: Path  # the run folder
    logs: Path | None = None  # launch: the folder of every process's log; None: one PS process (fedhop server)


def run_failure(e: BaseException, place: RunPlace) -> Fatal | None:
    """The code and line a run's own failure ends ``launch`` / ``server`` with; None when ``e`` is not one."""
    from fedhop.common.engine.loop import RoundFailed
    from fedhop.server.main import Interrupted, JoinTimeout, ResultsNotWritten, RunFolderError, StartupFailed

    logs = f" (logs in {place.logs})" if place.logs is not None else ""
    stopped = "; every process was stopped" if place.logs is not None else ""
    if isinstance(e, Interrupted):
        return Fatal(ExitCode.INTERRUPTED, f"interrupted after {len(e.result.rounds)} of {place.rounds} rounds"
                                           f"{stopped}; the rounds done are in {place.out}{logs}")
    if isinstance(e, KeyboardInterrupt):
        return Fatal(ExitCode.INTERRUPTED, f"interrupted before round 1{stopped}{logs}" if place.logs is not None
                     else "interrupted before round 1; nothing written")
    if isinstance(e, StartupFailed):
        return Fatal(ExitCode.STARTUP, f"{e}\n(every process was stopped; logs in {place.logs})"
                     if place.logs is not None else str(e))
    if isinstance(e, JoinTimeout):
        return Fatal(ExitCode.JOIN_TIMEOUT, f"{e}{stopped}{logs}")
    if isinstance(e, RoundFailed):
        return Fatal(ExitCode.FAILED, f"{e}; the rounds done are in {place.out}{logs}")
    if isinstance(e, (RunFolderError, ResultsNotWritten)):
        return Fatal(ExitCode.RUN_FOLDER, str(e))
    return None


@contextlib.contextmanager
def run_failures(place: RunPlace) -> Iterator[None]:
    """Turn a run's own failures inside the block into :class:`Fatal` (see :func:`run_failure`)."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as e:
        fatal = run_failure(e, place)
        if fatal is None:
            raise
        raise fatal from None


@contextlib.contextmanager
def testbed_failures(logs: Path) -> Iterator[None]:
    """A running testbed's failures inside the block as :class:`Fatal`: SIGINT/SIGTERM (the testbed's
    ``Interrupted``) INTERRUPTED, a step that failed (``TestbedError``) STARTUP; both after the testbed removed
    everything it created, pointing to ``logs``. (A ``TestbedError`` before the testbed starts is USAGE:
    :data:`EXIT_CODES`.)"""
    from fedhop.deploy.netns import TestbedError
    from fedhop.deploy.testbed import Interrupted

    try:
        yield
    except Interrupted as e:
        raise Fatal(ExitCode.INTERRUPTED, f"interrupted ({e}); every process, namespace and link was removed "
                                          f"(logs in {logs})") from None
    except TestbedError as e:
        raise Fatal(ExitCode.STARTUP, f"{e}\n(everything it created was removed; logs in {logs})") from None
