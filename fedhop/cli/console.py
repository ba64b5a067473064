"""What the ``fedhop`` commands share: the help format, the spec and run folder options, the progress bars, the
run's summary, the live page, and a role process's logging and exit.

Importing this module imports no torch (nor the spec): each helper imports what it needs when called, so
``fedhop --help`` and ``fedhop health`` stay light.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhop.common.exit_codes import ExitCode, Fatal

if TYPE_CHECKING:
    from fedhop.common.engine.results import RunResult
    from fedhop.common.spec import RunSpec
    from fedhop.server.main import Resume
    from fedhop.server.web.live import LivePage

DEFAULT_SPEC = Path(__file__).resolve().parent.parent / "default_spec.toml"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` where there is a default to show (not for None or flags that are off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            return action.help or ""
        return super()._get_help_string(action) or ""


def add_run_options(s: argparse.ArgumentParser, engine: str) -> None:
    """Options every command that runs a spec shares: --out, --force, --set."""
    s.add_argument("--out", help=f"run folder (default: runs/<time>-<name>-{engine})")
    s.add_argument("--force", action="store_true",
                   help="let --out name a folder that holds files (its run files are replaced)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one spec field, e.g. --set rounds=5 --set algorithm.options.lr=0.1 "
                   "(repeatable; values are TOML: 5, 0.1, true, [32, 32], or a bare string)")


def load_spec(path: str | None, sets: list[str] | None = None) -> RunSpec:
    """The RunSpec of ``path`` (the built-in default run when None), with ``--set key=value`` applied."""
    from fedhop.cli.spec_fields import apply_sets, read_raw
    from fedhop.common.spec import RunSpec

    source = str(path or DEFAULT_SPEC)
    raw = read_raw(Path(source))
    if sets:
        raw = apply_sets(raw, sets)
        source += " with " + " ".join(f"--set {s}" for s in sets)
    return RunSpec.parse(raw, source)


def run_folder(out: str | None, force: bool, spec_name: str, engine: str) -> Path:
    """``--out`` (or the default), checked: an existing non-empty folder is refused without ``--force``."""
    from fedhop.common.engine.results import RunFolderExists, prepare_run_folder
    from fedhop.run_folders import default_out

    folder = Path(out) if out else default_out(spec_name, engine)
    try:
        return prepare_run_folder(folder, force=force)
    except RunFolderExists:
        raise  # USAGE (errors.EXIT_CODES)
    except OSError as e:  # cannot even be created (read-only place, a file in the way, /proc ...)
        raise Fatal(ExitCode.RUN_FOLDER, f"the run folder {folder} cannot be written ({e.strerror or e}); "
                                         "choose another --out") from None


def check_device(device: str) -> None:
    """Fail now, with NO_DEVICE (a DeviceError, errors.EXIT_CODES), when ``device`` names a CUDA device that is
    not there."""
    from fedhop.common.engine.workspace import resolve_device

    resolve_device(device)


def load_resume(resume: str | None, spec: str | None, sets: list[str]) -> Resume | None:
    """``--resume RUN_DIR``: the run's spec and newest readable PS checkpoint (a spec file or --set may not
    be given with it: the run's own spec is the truth)."""
    if not resume:
        return None
    from fedhop.common.engine.checkpoint import CheckpointError
    from fedhop.server.main import load_resume as load

    if spec or sets:
        raise Fatal(ExitCode.USAGE, "--resume continues a run with its own spec; give no spec file or --set")
    try:
        r = load(Path(resume))
    except CheckpointError as e:
        raise Fatal(ExitCode.USAGE, f"cannot resume {resume}: {e}") from None
    for why in r.skipped:
        print(f"warning: {why}; resuming from the previous checkpoint", file=sys.stderr)
    print(f"resuming run {r.run_id} at round {r.next_round + 1} of {r.spec.rounds} from {r.path}", file=sys.stderr)
    return r


@dataclass(frozen=True)
class HttpArgs:
    """``--http HOST:PORT|off`` and ``--http-token`` (fedhop.server.web.cli adds them)."""

    http: str = "off"
    http_token: str | None = None

    @classmethod
    def of(cls, a: argparse.Namespace) -> HttpArgs:
        return cls(http=a.http, http_token=a.http_token)


def start_web(http: HttpArgs, folder: Path | None = None, engine: str | None = None) -> LivePage:
    """The run's events and, with --http, the live page / JSON API / metrics fed by them (``page.close()`` at
    the end). A bad setting is a Fatal (USAGE; a taken address: ADDRESS_IN_USE). ``folder``: the run folder,
    which gets ``live.json`` (this process, the page's URL, how the run ends: ``fedhop ls`` / ``ui`` read it)."""
    from fedhop.server.web.cli import page_from_args

    page = page_from_args(http.http, http.http_token)
    if folder is not None:
        from fedhop.browse import LiveMarker

        page.events.subscribe(LiveMarker(folder, url=page.url, engine=engine))
    return page


class Progress:
    """A tqdm bar: clients joining (n of N) before round 1, then rounds with the latest metrics.

    The bar switches to rounds (and its clock restarts, so the ETA counts training only, not the joining)
    once every client is ready, or at the first round when some never joined."""

    JOIN_FORMAT = "{desc}: {n}/{total} clients ready [{elapsed}]"

    def __init__(self, rounds: int, label: str, quiet: bool = False, clients: int | None = None) -> None:
        from tqdm import tqdm

        self.rounds, self.label, self.clients = rounds, label, clients
        self.joined: dict[str, int] = {}
        self.started = False
        if clients:
            self.bar = tqdm(total=clients, desc=f"{label}: joining", file=sys.stderr, disable=quiet,
                            bar_format=self.JOIN_FORMAT)
        else:
            self.bar = tqdm(total=rounds, desc=label, unit="round", file=sys.stderr, disable=quiet)
            self.started = True

    def on_join(self, child: str, data_sizes: dict[str, int]) -> None:
        """A child of the PS said Ready (an edge: with its clients' data sizes)."""
        if self.started:
            return
        self.joined[child] = len(data_sizes)
        self.bar.n = sum(self.joined.values())
        self.bar.refresh()
        if self.bar.n >= (self.clients or 0):
            self._start_rounds()

    def _start_rounds(self) -> None:
        self.started = True
        self.bar.bar_format = None
        self.bar.unit = "round"
        self.bar.set_description(self.label, refresh=False)
        self.bar.reset(total=self.rounds)

    def on_round(self, rec: dict[str, Any]) -> None:
        if not self.started:
            self._start_rounds()
        self.bar.n = rec["round"]
        shown = {k: rec[k] for k in ("accuracy", "loss") if k in rec}
        self.bar.set_postfix({k: f"{v:.4f}" for k, v in shown.items()})
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class ReproduceProgress:
    """``fedhop reproduce``'s bar: the runs of an experiment made in this process, and the current run's round
    (runs in a worker pool, as in the full FedCluster E1, show when they return)."""

    def __init__(self, name: str, quiet: bool) -> None:
        from tqdm import tqdm

        self.name = name
        self.runs = 0
        self.run_name, self.rounds, self.training = "", 0, False
        self.ready: dict[str, int] = {}  # child of the PS -> its clients ready
        self.bar = tqdm(total=None, desc=name, unit="round", file=sys.stderr, disable=quiet)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        """A listener of the runs' events: a run's clients getting ready (--network: its processes are
        starting), then its rounds."""
        if kind == "run_started":
            self.runs += 1
            spec = data["spec"]
            self.run_name, self.rounds, self.ready, self.training = spec["name"], spec["rounds"], {}, False
            self.bar.reset(total=spec["topology"]["clients"])
            self.bar.set_description(f"{self.name}: run {self.runs} ({self.run_name}): clients ready")
        elif kind == "node_ready" and not self.training:
            self.ready[data["node"]] = len(data["data_sizes"])
            self.bar.n = sum(self.ready.values())
            self.bar.refresh()
        elif kind == "round_started" and not self.training:
            self.training = True
            self.bar.reset(total=self.rounds)
            self.bar.set_description(f"{self.name}: run {self.runs} ({self.run_name})")
        elif kind == "round_ended" and data["round"] >= 0:
            self.bar.n = data["round"] + 1
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def print_summary(result: RunResult, out: Path, total_s: float | None = None, details: bool = True) -> None:
    """The run's one summary line (training time beside the whole command's wall-clock), the slowest link and
    node (timeline.csv), then the per-link table, largest links first, and the model's route for edge-walk
    algorithms."""
    from fedhop.common.engine.results import totals
    from fedhop.report import link_table, route, slowest_line

    last = result.rounds[-1] if result.rounds else {}
    t = totals(result.links)
    acc = f"accuracy {last['accuracy']:.4f}, " if "accuracy" in last else ""
    loss = last.get("loss", float("nan"))
    whole = f" of {total_s:.1f}s in all (start-up and writing included)" if total_s is not None else ""
    print(f"{result.spec.algorithm.name}: {len(result.rounds)} rounds reported, {acc}loss {loss:.4f}; "
          f"payload {t['payload_bytes']:,} B, messages {t['message_bytes']:,} B; "
          f"training wall-clock {result.wall_s:.1f}s{whole}")
    if result.missing:
        print(f"missing: {len(result.missing)} calls, e.g. {result.missing[0]}")
    slow = slowest_line(result.timeline)
    if slow:
        print(slow)
    if details and result.links:
        print("\nbytes per link (all kinds, phases and rounds; links.csv has each):")
        print(link_table(result.links))
        r = route(result.rounds)
        if r:
            print("\n" + r)
    print(f"results in {out}")


def log_to_stderr(verbose: bool = True) -> None:
    """A role process's log: every line on stderr (INFO, or WARNING when not ``verbose``)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)


def exit_now(rc: int) -> int:
    """Leave without interpreter teardown once a role is done: gRPC's C-core threads can still be winding
    down then, and tearing the interpreter down under them aborts the process ("terminate called without an
    active exception", exit -6) although the run itself ended cleanly. Everything is written by now."""
    from fedhop.common import timing

    timing.flush()  # os._exit skips atexit: the round-breakdown timers (when on) are written here
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
