"""The ``fedhop`` command line: launch, simulate, one role per process, reproduce, compare.

Exit codes: common/exit_codes.py (and the README).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from fedhop.common.exit_codes import ExitCode, Fatal

DEFAULT_SPEC = Path(__file__).with_name("default_spec.toml")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` where there is a default to show (not for None or flags that are off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            return action.help or ""
        return super()._get_help_string(action) or ""


def load_spec(path: str | None, sets: list[str] | None = None):
    """The RunSpec of ``path`` (the built-in default run when None), with ``--set key=value`` applied."""
    from fedhop.common.spec import RunSpec
    from fedhop.spec_cli import apply_sets, read_raw

    source = str(path or DEFAULT_SPEC)
    raw = read_raw(Path(source))
    if sets:
        raw = apply_sets(raw, sets)
        source += " with " + " ".join(f"--set {s}" for s in sets)
    return RunSpec.parse(raw, source)


def default_out(spec_name: str, engine: str) -> Path:
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{spec_name}-{engine}"


def run_folder(a: argparse.Namespace, spec_name: str, engine: str) -> Path:
    """``--out`` (or the default), checked: an existing non-empty folder is refused without ``--force``."""
    from fedhop.common.engine.results import RunFolderExists, prepare_run_folder

    out = Path(a.out) if a.out else default_out(spec_name, engine)
    try:
        return prepare_run_folder(out, force=a.force)
    except RunFolderExists as e:
        raise Fatal(ExitCode.USAGE, str(e)) from None
    except OSError as e:  # cannot even be created (read-only place, a file in the way, /proc ...)
        raise Fatal(ExitCode.RUN_FOLDER, f"the run folder {out} cannot be written ({e.strerror or e}); "
                                         "choose another --out") from None


def check_device(device: str) -> None:
    """Fail now, with NO_DEVICE, when ``device`` names a CUDA device that is not there."""
    from fedhop.common.engine.workspace import DeviceError, resolve_device

    try:
        resolve_device(device)
    except DeviceError as e:
        raise Fatal(ExitCode.NO_DEVICE, str(e)) from None


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


def cmd_simulate(a: argparse.Namespace) -> int:
    from fedhop.common.engine.events import round_records
    from fedhop.common.engine.preflight import check_user_code
    from fedhop.common.engine.results import write_run_folder
    from fedhop.server.web.cli import page_from_args
    from fedhop.server.web.live import simulate

    started = time.perf_counter()
    spec = load_spec(a.spec, a.set)
    check_user_code(spec, source=a.spec or "<default spec>")
    check_device(a.device or spec.device)
    out = run_folder(a, spec.name, "simulate")
    page = page_from_args(a)  # the run's events; with --http, the live page / API / metrics serving them
    bar = Progress(spec.rounds, f"simulate {spec.algorithm.name}", a.quiet)
    page.events.subscribe(round_records(bar.on_round))
    try:
        result = simulate(spec, page.events, device=a.device, journal=out / "rounds.jsonl")
    finally:
        bar.close()
        page.close()
    write_run_folder(result, out)
    print_summary(result, out, time.perf_counter() - started)
    return 0


def print_summary(result, out: Path, total_s: float | None = None, details: bool = True) -> None:
    """The run's one summary line (training time beside the whole command's wall-clock), then the per-link
    table, largest links first, and the model's route for edge-walk algorithms."""
    from fedhop.common.engine.results import totals
    from fedhop.report import link_table, route

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
    if details and result.links:
        print("\nbytes per link (all kinds, phases and rounds; links.csv has each):")
        print(link_table(result.links))
        r = route(result.rounds)
        if r:
            print("\n" + r)
    print(f"results in {out}")


def cmd_reproduce(a: argparse.Namespace) -> int:
    from fedhop.common.engine.events import RunEvents
    from fedhop.reproduce import load_all, run_experiment
    from fedhop.reproduce.runner import RunOptions

    names = sorted(load_all()) if a.name == "all" else [a.name]
    failed = []
    for name in names:
        out = Path(a.out or "runs/reproduce") / (name + ("-quick" if a.quick else ""))
        hook = ReproduceProgress(name, a.quiet)
        events = RunEvents()  # every run of the experiment made in this process emits into it
        events.subscribe(hook)
        try:
            outcome = run_experiment(name, out, a.quick, dataset=a.dataset, path=a.data_path,
                                     options=RunOptions(network=a.network, only=tuple(a.only), events=events))
        finally:
            hook.close()
        status = ("CLAIM NOT MET" if not outcome.ok else "ok" if outcome.checks
                  else "no claim checked (--only left out the runs they need)")
        print(f"\n== {name}{' (quick)' if a.quick else ''}: {status}; results in {out}\n{outcome.table_md}")
        for claim, held in outcome.checks.items():
            print(f"  [{'x' if held else ' '}] {claim}")
        for note in outcome.notes:
            if note.startswith("--only"):
                print(f"  {note}")
        if not outcome.ok:
            failed.append(name)
    return 1 if failed else 0


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


def cmd_algorithms(a: argparse.Namespace) -> int:
    from fedhop.common.engine.api import ALGORITHMS, get_algorithm

    get_algorithm("fedavg")
    for name in sorted(ALGORITHMS):
        print(f"{name:24s} {ALGORITHMS[name].summary}")
    return 0


def cmd_spec(a: argparse.Namespace) -> int:
    if a.explain is not None:
        from fedhop.spec_cli import explain

        print(explain(a.explain or load_spec(a.spec, a.set).algorithm.name))
        return 0
    spec = load_spec(a.spec, a.set)
    full = spec.model_copy(update={"algorithm": spec.algorithm.model_copy(
        update={"options": spec.options().model_dump(mode="json", exclude_none=True)})})
    print(full.to_toml(), end="")
    return 0


def cmd_testbed_up(a: argparse.Namespace) -> int:
    from fedhop.deploy.testbed import cmd_up

    return cmd_up(a.spec, a.out, a.device, a.timeout, a.quiet, tls=a.tls,
                  http=None if a.http == "off" else a.http, http_token=a.http_token)


def cmd_testbed_clean(a: argparse.Namespace) -> int:
    from fedhop.deploy.testbed import cmd_clean

    return cmd_clean()


def cmd_compare(a: argparse.Namespace) -> int:
    from fedhop.compare import compare

    out = Path(a.out) if a.out else Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-compare"
    from fedhop.compare import Metric

    metric = Metric(a.metric, a.goal or "", a.log_y)
    table = compare([Path(r) for r in a.runs], out, a.target_accuracy, metric)
    print(table)
    print(f"\nfigure, table.md and table.csv in {out}")
    return 0


def add_run_options(s: argparse.ArgumentParser, engine: str) -> None:
    """Options every command that runs a spec shares: --out, --force, --set."""
    s.add_argument("--out", help=f"run folder (default: runs/<time>-<name>-{engine})")
    s.add_argument("--force", action="store_true",
                   help="let --out name a folder that holds files (its run files are replaced)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one spec field, e.g. --set rounds=5 --set algorithm.options.lr=0.1 "
                   "(repeatable; values are TOML: 5, 0.1, true, [32, 32], or a bare string)")


def build_parser() -> argparse.ArgumentParser:
    from fedhop import __version__

    p = argparse.ArgumentParser(prog="fedhop", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"fedhop {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("simulate", help="run a spec with the in-process engine (no sockets)",
                       formatter_class=HelpFormatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    add_run_options(s, "simulate")
    s.add_argument("--device", help="override the spec's device: auto | cpu | cuda | cuda:N")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    from fedhop.server.web.cli import add_http_args

    add_http_args(s)  # the live page, JSON API and /metrics of the in-process run
    s.set_defaults(fn=cmd_simulate)

    s = sub.add_parser("reproduce", help="run a paper reproduction (results, plots, markdown table)",
                       formatter_class=HelpFormatter)
    s.add_argument("name", help="focus-fig4 | fedcluster-e1 | fedchs-digits | fgdro-toy | all")
    s.add_argument("--quick", action="store_true", help="the reduced size CI runs")
    s.add_argument("--out", default="runs/reproduce", help="parent folder of the results")
    s.add_argument("--dataset", help="fedchs-digits only: run on mnist / fashion-mnist / cifar10 / cifar100 files")
    s.add_argument("--data-path", help="fedchs-digits only: the folder holding those files")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--network", action="store_true",
                   help="run every run over real processes (PS, edges and clients on loopback, as `fedhop launch` "
                   "does) instead of the in-process engine; the results are the same")
    s.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                   help="run only the runs whose key (its run folder's name under runs/) contains SUBSTRING "
                   "(repeatable); the claims that need a run left out are not checked")
    s.set_defaults(fn=cmd_reproduce)

    s = sub.add_parser("compare", help="compare run folders: one figure and a table (accuracy, bytes, time)",
                       formatter_class=HelpFormatter)
    s.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders written by launch, simulate or server")
    s.add_argument("--out", help="folder for compare.png, table.md and table.csv (default: runs/<time>-compare)")
    s.add_argument("--target-accuracy", "--target", type=float, default=None,
                   help="the accuracy (or --metric value) whose first reach is timed and costed (default: the "
                   "worst final value among the runs, so every run reaches it)")
    s.add_argument("--metric", default="accuracy",
                   help="the per-round metric compared: accuracy, loss, or one the runs report (e.g. rel_err)")
    s.add_argument("--goal", choices=("max", "min"),
                   help="reached at or above the target (max) or at or below it (min); default: max for "
                   "accuracy, min for any other metric")
    s.add_argument("--log-y", action="store_true", help="draw the metric on a log scale")
    s.set_defaults(fn=cmd_compare)

    s = sub.add_parser("algorithms", help="list the algorithms", formatter_class=HelpFormatter)
    s.set_defaults(fn=cmd_algorithms)

    s = sub.add_parser("spec", help="print a spec, validated and with every default filled in; or --explain",
                       formatter_class=HelpFormatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one spec field")
    s.add_argument("--explain", nargs="?", const="", metavar="ALGORITHM",
                   help="print every field with its type, default and description (algorithm options: "
                   "ALGORITHM's, default the spec's algorithm)")
    s.set_defaults(fn=cmd_spec)

    s = sub.add_parser("testbed", help="network-namespace testbed (root): shaped links, kernel byte counts")
    tb = s.add_subparsers(dest="testbed_cmd", required=True)
    t = tb.add_parser("up", help="run SPEC with one network namespace per process; print bytes per link")
    t.add_argument("spec", help="RunSpec TOML file; its [testbed] table shapes the links")
    t.add_argument("--out", help="run folder (default: runs/<time>-<name>-testbed)")
    t.add_argument("--device", help="override the spec's device for every process")
    t.add_argument("--timeout", type=float, help="stop everything if the run has not finished after this many s")
    t.add_argument("--quiet", action="store_true", help="no start-up line")
    t.add_argument("--tls", metavar="DIR", help="mutual TLS on every link: `auto` makes a CA and certificates naming "
                   "the testbed's addresses under RUN/tls; or a folder from `fedhop certs init` whose PS and edge "
                   "certificates name them (checked first; the error gives the certs init command)")
    from fedhop.server.web.cli import add_http_args

    add_http_args(t)  # served by the PS inside its namespace, forwarded from HOST:PORT here
    t.set_defaults(fn=cmd_testbed_up)
    t = tb.add_parser("clean", help="remove namespaces left by testbeds whose owner died")
    t.set_defaults(fn=cmd_testbed_clean)

    from fedhop import roles_cli

    roles_cli.add_commands(sub, HelpFormatter, add_run_options)
    from fedhop import deploy_cli

    deploy_cli.add_commands(sub)
    from fedhop import identity_cli

    identity_cli.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    name = f"fedhop {args.cmd}"
    try:
        return int(args.fn(args) or 0)
    except Fatal as e:
        print(f"{name}: {e.message}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as e:
        from fedhop.common.spec import SpecError  # imported here: it imports torch, which `fedhop health` avoids

        if not isinstance(e, SpecError):
            raise
        print(f"{name}: {e}", file=sys.stderr)
        return ExitCode.USAGE
