"""``fedhop simulate`` (the in-process engine) and ``fedhop launch`` (the networked engine on this machine: the
PS here, every edge and client host a local process; :mod:`fedhop.launch`)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fedhop.cli.console import (
    LOG_FORMAT,
    HelpFormatter,
    HttpArgs,
    Progress,
    add_run_options,
    check_device,
    load_resume,
    print_summary,
    run_folder,
    start_web,
)
from fedhop.cli.errors import RunPlace, run_failures
from fedhop.cli.security import SecurityArgs, add_security_args
from fedhop.cli.spec import add_algorithm_arg, load_run_spec
from fedhop.common import run_lock
from fedhop.common.exit_codes import ExitCode, Fatal

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec
    from fedhop.transport.credentials import Security


def cmd_simulate(a: argparse.Namespace) -> int:
    from fedhop.browse import LiveMarker
    from fedhop.common.engine.events import round_records
    from fedhop.common.engine.preflight import check_user_code
    from fedhop.common.engine.results import write_run_folder
    from fedhop.server.web.live import simulate

    started = time.perf_counter()
    a.spec = spec_path(a)
    replay = load_replay(a.replay, a.spec, a.set, a.algorithm) if a.replay else None
    spec = replay.spec if replay is not None else load_run_spec(a.spec, a.set, a.algorithm)
    check_user_code(spec, source=a.spec or "<default spec>")
    check_device(a.device or spec.device)
    out = run_folder(a.out, a.force, spec.name, "replay" if replay is not None else "simulate")
    page = start_web(HttpArgs.of(a))  # the run's events; with --http, the live page / API / metrics serving them
    bar = Progress(spec.rounds, f"simulate {spec.algorithm.name}", a.quiet)
    page.events.subscribe(LiveMarker(out, url=page.url, engine="inprocess"))  # live.json: fedhop ls / ui read it
    page.events.subscribe(round_records(bar.on_round))
    with run_lock.hold(out):  # one process runs a run folder (common/run_lock.py)
        try:
            result = simulate(spec, page.events, device=a.device, journal=out / "rounds.jsonl",
                              replay=replay.rounds if replay is not None else None)
        finally:
            bar.close()
            page.close()
        write_run_folder(result, out)
    print_summary(result, out, time.perf_counter() - started)
    if replay is not None:
        return replay.verdict(result.final)
    return 0


@dataclasses.dataclass(frozen=True)
class Replay:
    """A recorded run to replay: its spec, its rounds (their ``arrivals``), its model."""

    folder: Path
    spec: RunSpec
    rounds: list[dict]

    def verdict(self, final: dict) -> int:
        """Print whether the replay's model equals the recorded one, bit for bit; exit code 0 only if it does."""
        import torch

        path = self.folder / "model.pt"
        if not path.is_file():
            print(f"replay: {path} is missing: nothing to compare the model with", file=sys.stderr)
            return ExitCode.FAILED
        recorded = torch.load(path, map_location="cpu", weights_only=True)
        same = list(recorded) == list(final) and all(torch.equal(recorded[k], final[k].cpu()) for k in recorded)
        print(f"replay of {self.folder}: the model is {'bit-identical to' if same else 'DIFFERENT from'} the "
              "recorded one")
        return ExitCode.OK if same else ExitCode.FAILED


def load_replay(folder: str, spec_arg: str | None, sets: list[str] | None, algorithm: str | None) -> Replay:
    """The run folder ``folder`` as a :class:`Replay` (its spec and rounds as recorded; nothing may override them)."""
    import json

    from fedhop.common.spec import RunSpec, SpecError

    if spec_arg or sets or algorithm:
        raise Fatal(ExitCode.USAGE, "--replay runs the recorded spec: give no SPEC, --set or --algorithm with it")
    run = Path(folder)
    results = run / "results.json"
    if not results.is_file():
        raise Fatal(ExitCode.USAGE, f"--replay {folder}: no results.json there (a finished run folder is needed)")
    try:
        data = json.loads(results.read_text())
        spec = RunSpec.model_validate(data["spec"])
    except (ValueError, KeyError, SpecError) as e:
        raise Fatal(ExitCode.USAGE, f"--replay {folder}: results.json is not a readable run record ({e})") from None
    return Replay(run, spec, list(data.get("rounds", [])))


def cmd_launch(a: argparse.Namespace) -> int:
    from fedhop.client_ids import resolve_per_process
    from fedhop.common.engine.events import readiness, round_records
    from fedhop.common.engine.preflight import check_user_code
    from fedhop.common.topology import build_topology
    from fedhop.launch import client_groups, launch
    from fedhop.server.main import RunFolderError, check_run_folder

    started = time.perf_counter()
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)
    a.spec = spec_path(a)
    resume = load_resume(a.resume, a.spec or a.algorithm, a.set)
    spec = resume.spec if resume is not None else load_run_spec(a.spec, a.set, a.algorithm, a.data_path)
    check_user_code(spec, data_path=a.data_path, source=a.spec or "<default spec>")
    check_device(a.device or spec.device)
    out = Path(a.resume) if resume is not None else run_folder(a.out, a.force, spec.name, "launch")
    try:
        check_run_folder(out)
    except RunFolderError as e:
        raise Fatal(ExitCode.RUN_FOLDER, str(e)) from None
    logs = out / "logs"
    per_process = resolve_per_process(a.clients_per_process, spec.topology.clients)
    if not a.quiet:
        hosts = len(client_groups(build_topology(spec.topology, spec.seed), per_process))
        print(f"fedhop launch: starting {spec.topology.edges + hosts} processes ({spec.topology.edges} edges, "
              f"{spec.topology.clients} clients in {hosts} client processes) beside the PS; logs in {logs}",
              file=sys.stderr)
    security, child_security = launch_security(SecurityArgs.of(a), spec, out)
    page = start_web(HttpArgs.of(a), out, "network")
    bar = Progress(spec.rounds, f"launch {spec.algorithm.name}", a.quiet, clients=spec.topology.clients)
    page.events.subscribe(readiness(bar.on_join))
    page.events.subscribe(round_records(bar.on_round))
    try:
        with run_failures(RunPlace(spec.rounds, out, logs)):
            result = launch(spec, out, device=a.device, data_path=a.data_path, resume=resume, events=page.events,
                            security=security, child_args=(*child_security, *child_log_level(a)),
                            clients_per_process=per_process,
                            fork_children=not a.exec_children)
    finally:
        bar.close()
        page.close()
    print_summary(result, out, time.perf_counter() - started)
    return 0


def child_log_level(a: argparse.Namespace) -> tuple[str, ...]:
    """``launch --log-level LEVEL``: every child process logs at that level too (into its log under RUN/logs)."""
    level = getattr(a, "log_level", None)
    return ("--log-level", level) if level else ()


def spec_path(a: argparse.Namespace) -> str | None:
    """The spec file a run command runs: the positional SPEC, or ``--spec-from RUN_DIR``'s ``spec.toml`` (the
    folder's resolved spec); not both."""
    from fedhop.run_folders import run_spec_file

    if not a.spec_from:
        return a.spec
    if a.spec:
        raise Fatal(ExitCode.USAGE, f"give a spec file or --spec-from {a.spec_from}, not both")
    return str(run_spec_file(a.spec_from))


def cmd_rerun(a: argparse.Namespace) -> int:
    """``fedhop rerun RUN_DIR``: the folder's run again, with its resolved spec and (unless ``--engine``) its
    engine, into a new run folder."""
    from fedhop.run_folders import run_engine, run_spec_file

    run_spec_file(a.run_dir)  # a usage error now if it is not a run folder
    engine = a.engine or run_engine(a.run_dir)
    argv = [engine, "--spec-from", a.run_dir, *(["--out", a.out] if a.out else []), *(["--force"] if a.force else []),
            *(x for s in a.set for x in ("--set", s)), *(["--device", a.device] if a.device else []),
            *(["--quiet"] if a.quiet else [])]
    if engine == "launch":
        argv += ["--http", "off"]
    parser = argparse.ArgumentParser(prog="fedhop")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_simulate(sub)
    add_launch(sub)
    if not a.quiet:
        print(f"fedhop rerun: fedhop {' '.join(argv)}", file=sys.stderr)
    args = parser.parse_args(argv)
    return int(args.fn(args))


def add_spec_from(s: argparse.ArgumentParser) -> None:
    s.add_argument("--spec-from", metavar="RUN_DIR", help="run the spec of an earlier run folder (its spec.toml, "
                   "every default filled in) instead of a spec file; --set still applies")


def add_rerun(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("rerun", help="run a run folder's run again, exactly (its resolved spec, its engine)",
                       formatter_class=HelpFormatter)
    s.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (spec.toml, results.json)")
    s.add_argument("--engine", choices=("simulate", "launch"),
                   help="default: the folder's own (results.json's engine: inprocess -> simulate, network -> launch)")
    add_run_options(s, "<engine>")
    s.add_argument("--device", help="override the spec's device: auto | cpu | cuda | cuda:N")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_rerun)


def launch_security(args: SecurityArgs, spec: RunSpec, out: Path) -> tuple[Security, list[str]]:
    """The PS's Security and the options that give every child process the same (``--tls auto``: a
    throw-away CA under the run folder)."""
    from fedhop.cli.security import child_args, launch_tls_dir, security_for
    from fedhop.common.topology import build_topology

    topo = build_topology(spec.topology, spec.seed)
    if args.tls == "auto" and args.token:
        raise Fatal(ExitCode.USAGE, "--token needs the folder its CA is in: give --tls DIR (from `fedhop certs "
                                    "init`), not --tls auto")
    tls_dir = launch_tls_dir(args.tls, out, topo.all_nodes())
    args = dataclasses.replace(args, tls=str(tls_dir) if tls_dir is not None else None)
    sec = security_for(args, topo.server, "127.0.0.1:0")
    for node in topo.all_nodes():  # every child's material too, before any process starts
        security_for(args, node, None)
    return sec, child_args(tls_dir, Path(args.token) if args.token else None)


def add_simulate(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("simulate", help="run a spec with the in-process engine (no sockets)",
                       formatter_class=HelpFormatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    add_algorithm_arg(s)
    add_spec_from(s)
    add_run_options(s, "simulate")
    s.add_argument("--device", help="override the spec's device: auto | cpu | cuda | cuda:N")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--replay", metavar="RUN_DIR", help="rerun RUN_DIR's recorded spec in-process, its asynchronous "
                   "collects taking replies in the order the recorded run took them and its quorum scatters using the "
                   "replies it used (rounds.csv, arrivals), and say "
                   "whether the model is bit-identical to RUN_DIR/model.pt (exit 0 only if it is)")
    from fedhop.server.web.cli import add_http_args

    add_http_args(s)  # the live page, JSON API and /metrics of the in-process run (default off)
    s.set_defaults(fn=cmd_simulate)


def add_launch(sub: argparse._SubParsersAction) -> None:
    from fedhop.client_ids import AUTO, MIN_AUTO_PER_PROCESS, per_process_arg
    from fedhop.server.web.cli import add_http_args

    s = sub.add_parser("launch", help="run a spec as real local processes: PS, edges and clients over gRPC",
                       formatter_class=HelpFormatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    add_algorithm_arg(s)
    add_spec_from(s)
    add_run_options(s, "launch")
    s.add_argument("--device", help="override the spec's device: auto | cpu | cuda | cuda:N (auto spreads the "
                   "processes over the visible GPUs round-robin, CPU when there are none)")
    s.add_argument("--data-path", help="data path every node uses, in place of the spec's data.path (which it "
                   "satisfies, e.g. for mnist)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint "
                   "(every process is started again and restores its state)")
    s.add_argument("--clients-per-process", type=per_process_arg, default=AUTO, metavar="K",
                   help="clients per client process (`fedhop clients` host): each parent's clients are split into "
                        "hosts of at most K ids, each id with its own session, state and byte counts; 1: one "
                        "`fedhop client` process per client; auto: ceil(clients / CPU cores), at least "
                        f"{MIN_AUTO_PER_PROCESS} (about one host per core; small runs: one host per parent)")
    s.add_argument("--exec-children", action="store_true",
                   help="start every edge and client process as a new interpreter (`python -m fedhop ...`, each "
                        "importing torch) instead of forking them from one process that imported it once")
    add_http_args(s, default="127.0.0.1:0")
    add_security_args(s, launch=True)
    s.set_defaults(fn=cmd_launch)
