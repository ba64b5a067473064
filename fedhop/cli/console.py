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
LOG_LEVELS = ("debug", "info", "warning", "error")


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
    spec = RunSpec.parse(raw, source)
    if path is None and sets and not any(s.partition("=")[0].strip() == "name" for s in sets):
        from fedhop.run_folders import derived_name  # the default run, changed: its name says how

        spec = spec.model_copy(update={"name": derived_name(spec, RunSpec.parse(read_raw(DEFAULT_SPEC)))})
    return spec


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
    from fedhop.common.run_lock import check_free

    check_free(Path(resume))  # another PS runs it: refused now (exit 2), before any port or process
    try:
        r = load(Path(resume))
    except CheckpointError as e:
        raise Fatal(ExitCode.USAGE, f"cannot resume {resume}: {e}") from None
    for why in r.skipped:
        print(f"warning: {why}; resuming from the previous checkpoint", file=sys.stderr)
    if r.finished:  # the PS ended after its last checkpoint, before its results were written
        print(f"run {r.run_id}: all {r.spec.rounds} rounds are done ({r.path}); collecting the final model and "
              "writing the results", file=sys.stderr)
    else:
        print(f"resuming run {r.run_id} at round {r.next_round + 1} of {r.spec.rounds} from {r.path}",
              file=sys.stderr)
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


def on_run_clock(bar: Any, record: dict[str, Any]) -> None:
    """Set ``bar``'s clock to the run's: a round's record carries ``elapsed_s``, the driver's seconds since
    round 1 started (rounds.csv's column; the summary's training time is the same clock at the final model).
    tqdm's own clock starts when the bar is made, before the data and model are built (simulate) or when the
    last client is ready (launch), so without this the bar and the summary disagree."""
    if "elapsed_s" in record and hasattr(bar, "start_t"):
        bar.start_t = bar._time() - float(record["elapsed_s"])


class Progress:
    """A tqdm bar: clients joining (n of N) before round 1, then rounds with the latest metrics.

    The bar switches to rounds once every client is ready, or at the first round when some never joined; from
    the first round's end its clock is the run's (:func:`on_run_clock`): the ETA counts training only, and its
    elapsed time is the summary's training time."""

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
        on_run_clock(self.bar, rec)
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
            on_run_clock(self.bar, data.get("record") or {})
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


BYTE_UNITS = ((10**9, "GB"), (10**6, "MB"), (10**3, "kB"))  # decimal (SI): 1 kB = 1,000 B
BYTES_LEGEND = ("payload: the tensors' bytes, what the papers count; message: payload + encoding and framing; "
                "wire: + gRPC, HTTP/2 and TLS, counted by the kernel, over the network only")


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal units (1 kB = 1,000 B, 1 MB = 10^6 B, 1 GB = 10^9 B), three significant digits:
    ``812 B``, ``924 kB``, ``1.23 MB``, ``45.6 GB``."""
    for size, unit in BYTE_UNITS:
        if abs(n) >= size:
            v = n / size
            return f"{v:.{2 if abs(v) < 10 else 1 if abs(v) < 100 else 0}f} {unit}"
    return f"{int(n)} B"


def seconds(s: float) -> str:
    """A duration as the summary and the bar show it: ``0.042s``, ``3.1s``, ``12m05s``."""
    if s < 1:
        return f"{s:.3f}s"
    if s < 60:
        return f"{s:.1f}s"
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def class_table(links: list[dict[str, Any]]) -> str:
    """Bytes per link class (client<->edge, edge<->edge, edge<->PS; client<->PS in flat topologies), both
    directions, every kind, phase and round, in decimal units, then the run's total: the classes the run used."""
    from fedhop.report import CLASS_TITLES, LINK_CLASSES, link_class

    sums: dict[str, list[int]] = {}  # class -> messages, payload, message, wire
    wire_seen: set[str] = set()
    for r in links:
        row = sums.setdefault(link_class(r["src"], r["dst"]), [0, 0, 0, 0])
        row[0] += int(r["messages"])
        row[1] += int(r["payload_bytes"])
        row[2] += int(r["message_bytes"])
        if r.get("wire_bytes") not in (None, ""):
            row[3] += int(r["wire_bytes"])
            wire_seen.add(link_class(r["src"], r["dst"]))
    used = [c for c in LINK_CLASSES if c in sums]
    total = [sum(sums[c][i] for c in used) for i in range(4)]
    wire = bool(wire_seen)
    lines = [f"  {'link class':<16s}{'messages':>10s}{'payload':>12s}{'message':>12s}" + (f"{'wire':>12s}" if wire
                                                                                          else "")]
    for name, row, has_wire in [*((CLASS_TITLES[c], sums[c], c in wire_seen) for c in used),
                                ("all", total, len(wire_seen) == len(used))]:
        cells = f"  {name:<16s}{row[0]:>10,d}{human_bytes(row[1]):>12s}{human_bytes(row[2]):>12s}"
        if wire:
            cells += f"{human_bytes(row[3]) if has_wire else 'n/a':>12s}"
        lines.append(cells)
    return "\n".join(lines)


def print_summary(result: RunResult, out: Path, total_s: float | None = None, details: bool = True) -> None:
    """The run's summary: one line (rounds, final metrics, payload and message bytes, the training time on the
    progress bar's clock beside the whole command's wall-clock), the bytes per link class with the legend
    of the byte levels, the slowest link and node (timeline.csv), then the per-link table in exact bytes,
    largest links first, and the model's route for edge-walk algorithms."""
    from fedhop.common.engine.results import totals
    from fedhop.report import link_table, route, slowest_line

    last = result.rounds[-1] if result.rounds else {}
    t = totals(result.links)
    acc = f"accuracy {last['accuracy']:.4f}, " if "accuracy" in last else ""
    loss = last.get("loss", float("nan"))
    whole = f" of {seconds(total_s)} in all (start-up and writing included)" if total_s is not None else ""
    wire = f", wire {human_bytes(t['wire_bytes'])}" if "wire_bytes" in t else ""
    print(f"{result.spec.algorithm.name}: {len(result.rounds)} rounds reported, {acc}loss {loss:.4f}; "
          f"payload {human_bytes(t['payload_bytes'])}, message {human_bytes(t['message_bytes'])}{wire}; "
          f"training {seconds(result.wall_s)} from round 1's start (the progress bar's clock){whole}")
    if result.links:
        print("bytes by link class, both directions (decimal units: 1 kB = 1,000 B, 1 MB = 10^6 B, 1 GB = 10^9 B):")
        print(class_table(result.links))
        print(f"  ({BYTES_LEGEND})")
    if result.missing:
        print(f"missing: {len(result.missing)} calls, e.g. {result.missing[0]}")
    slow = slowest_line(result.timeline)
    if slow:
        print(slow)
    if details and result.links:
        print("\nbytes per link (exact, in B; all kinds, phases and rounds; links.csv has each):")
        print(link_table(result.links))
        r = route(result.rounds)
        if r:
            print("\n" + r)
    print(f"results in {out}")


def add_log_level(s: argparse.ArgumentParser) -> None:
    """``--log-level``, the one logging option every command takes (errors.UsageParser adds it to each parser:
    ``fedhop``, ``fedhop testbed``, ``fedhop testbed up``). Its default is SUPPRESS, so a level given before a
    subcommand is not overwritten by the subcommand's default (argparse copies a subcommand's namespace over its
    parent's); the namespace gets None when no level was given."""
    s.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, metavar="LEVEL", default=argparse.SUPPRESS,
                   help="what this process logs on stderr: debug | info | warning | error (default: info for the "
                        "roles server/edge/client/clients, warning for the others)")


def set_log_level(level: str | None) -> None:
    """``--log-level`` given: every log line from now on at ``level`` or above on stderr (a command's own
    :func:`log_to_stderr` keeps the level). Not given: the command's own default, nothing changes here."""
    if level is not None:
        logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)


def log_to_stderr(level: str | None = None, default: int = logging.INFO, fmt: str = LOG_FORMAT) -> None:
    """A role process's log: every line on stderr at ``level`` (``--log-level``), by default ``default``
    (INFO), in ``fmt``."""
    logging.basicConfig(level=level.upper() if level else default, format=fmt, stream=sys.stderr,
                        force=level is not None)


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
