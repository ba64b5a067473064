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
    load_spec,
    print_summary,
    run_folder,
    start_web,
)
from fedhop.cli.errors import RunPlace, run_failures
from fedhop.cli.security import SecurityArgs, add_security_args
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
    spec = load_spec(a.spec, a.set)
    check_user_code(spec, source=a.spec or "<default spec>")
    check_device(a.device or spec.device)
    out = run_folder(a.out, a.force, spec.name, "simulate")
    page = start_web(HttpArgs.of(a))  # the run's events; with --http, the live page / API / metrics serving them
    bar = Progress(spec.rounds, f"simulate {spec.algorithm.name}", a.quiet)
    page.events.subscribe(LiveMarker(out, url=page.url, engine="inprocess"))  # live.json: fedhop ls / ui read it
    page.events.subscribe(round_records(bar.on_round))
    try:
        result = simulate(spec, page.events, device=a.device, journal=out / "rounds.jsonl")
    finally:
        bar.close()
        page.close()
    write_run_folder(result, out)
    print_summary(result, out, time.perf_counter() - started)
    return 0


def cmd_launch(a: argparse.Namespace) -> int:
    from fedhop.client_ids import resolve_per_process
    from fedhop.common.engine.events import readiness, round_records
    from fedhop.common.engine.preflight import check_user_code
    from fedhop.common.topology import build_topology
    from fedhop.launch import client_groups, launch
    from fedhop.server.main import RunFolderError, check_run_folder

    started = time.perf_counter()
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)
    resume = load_resume(a.resume, a.spec, a.set)
    spec = resume.spec if resume is not None else load_spec(a.spec, a.set)
    check_user_code(spec, data_path=a.data_path, source=a.spec or "<default spec>")
    if a.device != "auto":
        check_device(a.device)
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
                            security=security, child_args=child_security, clients_per_process=per_process,
                            fork_children=not a.exec_children)
    finally:
        bar.close()
        page.close()
    print_summary(result, out, time.perf_counter() - started)
    return 0


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
    add_run_options(s, "simulate")
    s.add_argument("--device", help="override the spec's device: auto | cpu | cuda | cuda:N")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    from fedhop.server.web.cli import add_http_args

    add_http_args(s)  # the live page, JSON API and /metrics of the in-process run (default off)
    s.set_defaults(fn=cmd_simulate)


def add_launch(sub: argparse._SubParsersAction) -> None:
    from fedhop.client_ids import AUTO, MIN_AUTO_PER_PROCESS, per_process_arg
    from fedhop.server.web.cli import add_http_args

    s = sub.add_parser("launch", help="run a spec as real local processes: PS, edges and clients over gRPC",
                       formatter_class=HelpFormatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    add_run_options(s, "launch")
    s.add_argument("--device", default="auto", help="auto | cpu | cuda:N (auto spreads over visible GPUs)")
    s.add_argument("--data-path", help="data path every client uses (default: the spec's)")
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
