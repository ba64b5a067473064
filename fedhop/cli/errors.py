"""Every exception a ``fedhop`` command ends on, mapped to its exit code and one line, in one place.

A mistake on the command line is found by the parser, :class:`UsageParser`: one line on stderr
(``fedhop <command>: <what is wrong>; did you mean ...?``, :mod:`fedhop.cli.suggest`) and USAGE (2), never the
usage text. A command fails with :class:`~fedhop.common.exit_codes.Fatal` (code and message chosen where the failure is
found), with Ctrl-C, or with one of the library's own exceptions listed in :data:`EXIT_CODES`;
:func:`run_command` prints ``fedhop <command>: <message>`` on stderr and returns the code. A run's failures
(interrupted, a node that did not start or join, a failed round, results not written) are worded for where the
run's files and logs are: :func:`run_failures`. Anything else is a bug and keeps its traceback.

A closed standard output (``fedhop algorithms | head -1``) ends the command quietly with BROKEN_PIPE (141, what
the shell reports for a command killed by SIGPIPE): :func:`broken_pipe`.

The codes themselves are listed in ``common/exit_codes.py`` (and the README).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedhop.cli import suggest
from fedhop.common.exit_codes import ExitCode, Fatal

# "module:Class" -> the code its instances end a command with (message: the exception's text). A class is looked
# up only when its module is already imported (an exception of a class whose module was never imported cannot
# have been raised), so this table imports nothing: `fedhop health` does not pay for torch.
EXIT_CODES: tuple[tuple[str, ExitCode], ...] = (
    ("fedhop.common.spec:SpecError", ExitCode.USAGE),  # a bad spec file or --set value
    ("fedhop.common.engine.results:RunFolderExists", ExitCode.USAGE),  # --out holds files, no --force
    ("fedhop.common.engine.results:RunFolderNotWritten", ExitCode.RUN_FOLDER),  # a full disk: what is where
    ("fedhop.common.engine.workspace:DeviceError", ExitCode.NO_DEVICE),  # --device names a missing CUDA device
    ("fedhop.transport.credentials:CredentialsError", ExitCode.USAGE),  # --tls/--token material unusable
    ("fedhop.server.web.serve:HttpConfigError", ExitCode.USAGE),  # --http beyond loopback without a token
    ("fedhop.transport.certs:CertError", ExitCode.USAGE),  # certs init/add
    ("fedhop.transport.tokens:TokenError", ExitCode.USAGE),  # tokens init
    ("fedhop.deploy.swarm_run:SwarmError", ExitCode.USAGE),  # stack-run: the stack cannot be deployed as asked
    ("fedhop.deploy.netns:TestbedError", ExitCode.USAGE),  # testbed up|clean: the host, links or certificates
    ("fedhop.reproduce:ExperimentError", ExitCode.USAGE),  # reproduce: options it refuses (--dataset, --only)
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


class UsageParser(argparse.ArgumentParser):
    """The parser of every ``fedhop`` command (subcommands inherit it): a mistake ends in ONE line on stderr,
    ``<prog>: <message> (see `<prog> --help`)``, with a did-you-mean where a known name is close, and exit code
    USAGE (2); unrecognized arguments are named by the command that was given them (``fedhop launch: ...``).
    Options are never abbreviated. Every parser takes ``--log-level`` (the namespace's ``log_level``: None when
    not given)."""

    OWNER = "_fedhop_unrecognized_by"  # namespace attribute: the innermost parser that left arguments over
    _argv: Sequence[str] = ()  # the whole command line being parsed (parse_args sets it on every parser)

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        from fedhop.cli.console import add_log_level

        # no abbreviations: `launch --clients 12` must not quietly mean --clients-per-process 12 (it is the spec's
        # topology.clients, which the error then suggests)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        add_log_level(self)  # on every command and subcommand, wherever the user puts it

    def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
        argv = self._argv
        unknown = [t for t in argv if t.startswith("--") and t.partition("=")[0] not in self._option_string_actions]
        if message.startswith("the following arguments are required") and unknown and not self._subparsers:
            message += "; " + suggest.unrecognized(self, unknown, argv)  # `fedhop edge --idd 0 ...`
        elif message.startswith("the following arguments are required") and unknown:
            message = suggest.unrecognized(self, unknown, argv)  # `fedhop --verison`: no command came after it
        line = " ".join(message.split())  # one line, whatever argparse wrapped
        self.exit(int(ExitCode.USAGE), f"{self.prog}: {line} (see `{self.prog} --help`)\n")

    def exit(self, status: int = 0, message: str | None = None) -> typing.NoReturn:  # type: ignore[override]
        if status == 0:  # --help, --version: their text reaches a closed pipe here (main: BROKEN_PIPE), not at exit
            sys.stdout.flush()
        super().exit(status, message)

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(
                None if isinstance(action, argparse._SubParsersAction) else action,
                suggest.invalid_choice(action, str(value)))

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(ns, self.OWNER):
            setattr(ns, self.OWNER, self)  # a subcommand's parser returns first: it owns what it left over
        return ns, extras

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else args)
        for parser in _parsers(self):  # every command's parser sees the whole command line when it errs
            if isinstance(parser, UsageParser):
                parser._argv = argv
        ns, extras = self.parse_known_args(argv, namespace)
        owner = vars(ns).pop(self.OWNER, self)
        if extras:
            owner.error(suggest.unrecognized(owner, extras, argv))
        if not hasattr(ns, "log_level"):  # given at no level (each level's default is SUPPRESS: see add_log_level)
            ns.log_level = None
        return ns


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser under it."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [parser, *(p for a in subs for c in dict.fromkeys(a.choices.values()) for p in _parsers(c))]


def stdout_closed() -> bool:
    """Whether standard output is a pipe or socket whose reader is gone (what a BrokenPipeError on it means)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))


def broken_pipe(e: BrokenPipeError) -> int:
    """BROKEN_PIPE (141), quietly, for a BrokenPipeError on standard output (``fedhop algorithms | head -1``):
    what is left to print goes to /dev/null, so the interpreter's last flush does not complain either. A
    broken pipe elsewhere (a socket) is no user mistake: it is raised again."""
    if not stdout_closed():
        raise e
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's captured stdout)
        pass
    return int(ExitCode.BROKEN_PIPE)


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
