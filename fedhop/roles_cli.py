"""``fedhop launch | server | edge | client``: the networked engine's commands (DESIGN.md section 5)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedhop.common.exit_codes import ExitCode, Fatal

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("fedhop.cli")


def _logging(verbose: bool = True) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)


def _exit_now(rc: int) -> int:
    """Leave without interpreter teardown once a role is done: gRPC's C-core threads can still be winding
    down then, and tearing the interpreter down under them aborts the process ("terminate called without an
    active exception", exit -6) although the run itself ended cleanly. Everything is written by now."""
    from fedhop.common import timing

    timing.flush()  # os._exit skips atexit: the round-breakdown timers (when on) are written here
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def cmd_launch(a: argparse.Namespace) -> int:
    from fedhop.cli import Progress, check_device, load_spec, print_summary, run_folder
    from fedhop.client_ids import resolve_per_process
    from fedhop.common.engine.events import readiness, round_records
    from fedhop.common.engine.loop import RoundFailed
    from fedhop.common.engine.preflight import check_user_code
    from fedhop.common.engine.topology import build_topology
    from fedhop.launch import client_groups, launch
    from fedhop.server.main import (
        Interrupted,
        JoinTimeout,
        ResultsNotWritten,
        RunFolderError,
        StartupFailed,
        check_run_folder,
    )

    started = time.perf_counter()
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)
    resume = _resume(a)
    spec = resume.spec if resume is not None else load_spec(a.spec, a.set)
    check_user_code(spec, data_path=a.data_path, source=a.spec or "<default spec>")
    if a.device != "auto":
        check_device(a.device)
    out = Path(a.resume) if resume is not None else run_folder(a, spec.name, "launch")
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
    security, child_security = _launch_security(a, spec, out)
    events, http = _web(a)
    bar = Progress(spec.rounds, f"launch {spec.algorithm.name}", a.quiet, clients=spec.topology.clients)
    events.subscribe(readiness(bar.on_join))
    events.subscribe(round_records(bar.on_round))
    try:
        result = launch(spec, out, device=a.device, data_path=a.data_path, resume=resume, events=events,
                        security=security,
                        child_args=child_security, clients_per_process=per_process,
                        fork_children=not a.exec_children)
    except Interrupted as e:
        raise Fatal(ExitCode.INTERRUPTED, f"interrupted after {len(e.result.rounds)} of {spec.rounds} rounds; "
                    f"every process was stopped; the rounds done are in {out} (logs in {logs})") from None
    except KeyboardInterrupt:
        raise Fatal(ExitCode.INTERRUPTED, f"interrupted before round 1; every process was stopped (logs in "
                    f"{logs})") from None
    except StartupFailed as e:
        raise Fatal(ExitCode.STARTUP, f"{e}\n(every process was stopped; logs in {logs})") from None
    except JoinTimeout as e:
        raise Fatal(ExitCode.JOIN_TIMEOUT, f"{e}; every process was stopped (logs in {logs})") from None
    except RoundFailed as e:
        raise Fatal(ExitCode.FAILED, f"{e}; the rounds done are in {out} (logs in {logs})") from None
    except ResultsNotWritten as e:
        raise Fatal(ExitCode.RUN_FOLDER, str(e)) from None
    finally:
        bar.close()
        if http is not None:
            http.stop()
    print_summary(result, out, time.perf_counter() - started)
    return 0


def _launch_security(a: argparse.Namespace, spec: Any, out: Path) -> tuple[Any, list[str]]:
    """The PS's Security and the options that give every child process the same (``--tls auto``: a
    throw-away CA under the run folder)."""
    from fedhop.common.engine.topology import build_topology
    from fedhop.secure_args import child_args, launch_tls_dir, security_from_args

    topo = build_topology(spec.topology, spec.seed)
    if a.tls == "auto" and a.token:
        raise Fatal(ExitCode.USAGE, "--token needs the folder its CA is in: give --tls DIR (from `fedhop certs "
                                    "init`), not --tls auto")
    tls_dir = launch_tls_dir(a.tls, out, topo.all_nodes())
    a.tls = str(tls_dir) if tls_dir is not None else None
    sec = security_from_args(a, topo.server, "127.0.0.1:0")
    for node in topo.all_nodes():  # every child's material too, before any process starts
        security_from_args(a, node, None)
    return sec, child_args(tls_dir, Path(a.token) if a.token else None)


def cmd_server(a: argparse.Namespace) -> int:
    from fedhop.cli import check_device, load_spec, print_summary, run_folder
    from fedhop.common.engine.loop import RoundFailed
    from fedhop.common.engine.preflight import check_user_code
    from fedhop.lifecycle import exit_zero_on_sigterm_once_written
    from fedhop.netcheck import check_listen
    from fedhop.server.main import Interrupted, JoinTimeout, ResultsNotWritten, RunFolderError, run_server

    started = time.perf_counter()
    _logging()
    resume = _resume(a)
    spec = resume.spec if resume is not None else load_spec(a.spec, a.set)
    check_user_code(spec, clients=False, source=a.spec or "<default spec>")  # clients check their own at join
    check_listen(a.listen)
    security = _server_security(a, spec)
    check_device(a.device or spec.device)
    out = Path(a.resume) if resume is not None else run_folder(a, spec.name, "server")
    exit_zero_on_sigterm_once_written(out)
    events, http = _web(a)
    try:
        result = run_server(spec, a.listen, out=out, device=a.device, resume=resume, events=events,
                            security=security)
    except Interrupted as e:
        raise Fatal(ExitCode.INTERRUPTED, f"interrupted after {len(e.result.rounds)} of {spec.rounds} rounds; "
                    f"the rounds done are in {out}") from None
    except KeyboardInterrupt:
        raise Fatal(ExitCode.INTERRUPTED, "interrupted before round 1; nothing written") from None
    except JoinTimeout as e:
        raise Fatal(ExitCode.JOIN_TIMEOUT, str(e)) from None
    except (RunFolderError, ResultsNotWritten) as e:
        raise Fatal(ExitCode.RUN_FOLDER, str(e)) from None
    except RoundFailed as e:
        raise Fatal(ExitCode.FAILED, f"{e}; the rounds done are in {out}") from None
    finally:
        if http is not None:
            http.stop()
    print_summary(result, out, time.perf_counter() - started)
    # Leave at once: an interpreter teardown under gRPC's threads can take seconds, and during it Python
    # restores the default SIGTERM action, so an orchestrator's SIGTERM then would turn a finished run into 143.
    return _exit_now(0)


def _server_security(a: argparse.Namespace, spec: Any) -> Any:
    from fedhop.common.engine.topology import build_topology
    from fedhop.secure_args import security_from_args

    return security_from_args(a, build_topology(spec.topology, spec.seed).server, a.listen)


def _web(a: argparse.Namespace) -> tuple[Any, Any]:
    """The run's events and, with --http, the live page / JSON API / metrics fed by them."""
    from fedhop.server.web.cli import page_from_args

    page = page_from_args(a)
    return page.events, page.http


def _resume(a: argparse.Namespace) -> Any:
    """``--resume RUN_DIR``: the run's spec and newest readable PS checkpoint (a spec file or --set may not
    be given with it: the run's own spec is the truth)."""
    if not getattr(a, "resume", None):
        return None
    from fedhop.common.engine.checkpoint import CheckpointError
    from fedhop.server.main import load_resume

    if a.spec or a.set:
        raise Fatal(ExitCode.USAGE, "--resume continues a run with its own spec; give no spec file or --set")
    try:
        r = load_resume(Path(a.resume))
    except CheckpointError as e:
        raise Fatal(ExitCode.USAGE, f"cannot resume {a.resume}: {e}") from None
    for why in r.skipped:
        print(f"warning: {why}; resuming from the previous checkpoint", file=sys.stderr)
    print(f"resuming run {r.run_id} at round {r.next_round + 1} of {r.spec.rounds} from {r.path}", file=sys.stderr)
    return r


def _role(name: str, body: Callable[[], int]) -> int:
    """Run one child role and leave with its code; a Fatal, a missing device or Ctrl-C end in one line."""
    from fedhop.common.engine.workspace import DeviceError

    try:
        rc = body()
    except Fatal as e:
        print(f"fedhop {name}: {e.message}", file=sys.stderr)
        rc = e.code
    except DeviceError as e:
        print(f"fedhop {name}: {e}", file=sys.stderr)
        rc = ExitCode.NO_DEVICE
    except KeyboardInterrupt:
        print(f"fedhop {name}: interrupted", file=sys.stderr)
        rc = ExitCode.INTERRUPTED
    return _exit_now(int(rc))


def cmd_edge(a: argparse.Namespace) -> int:
    from fedhop.edge.node import run_edge
    from fedhop.lifecycle import linger
    from fedhop.netcheck import check_listen, wait_for_parent

    _logging()

    def body() -> int:
        from fedhop.secure_args import security_from_args

        check_listen(a.listen)
        security = security_from_args(a, a.id, a.listen)
        wait_for_parent(a.connect, a.connect_timeout, log.warning, security)
        rc = run_edge(a.id, a.connect, a.listen, device=a.device, advertise=a.advertise,
                      connect_timeout_s=a.connect_timeout, state_dir=Path(a.state_dir) if a.state_dir else None,
                      security=security)
        return linger(a.id, rc, a.linger_until, a.linger_timeout, security)

    return _role("edge", body)


def cmd_client(a: argparse.Namespace) -> int:
    from fedhop.client.main import run_client
    from fedhop.lifecycle import linger
    from fedhop.netcheck import wait_for_parent

    _logging()

    def body() -> int:
        from fedhop.secure_args import security_from_args

        security = security_from_args(a, a.id, None)
        health = None
        if a.health:
            from fedhop.transport.health import serve_health

            health = serve_health(a.health)
        wait_for_parent(a.connect, a.connect_timeout, log.warning, security)
        rc = run_client(a.id, a.connect, data_path=a.data_path, device=a.device,
                        connect_timeout_s=a.connect_timeout, state_dir=Path(a.state_dir) if a.state_dir else None,
                        security=security)
        rc = linger(a.id, rc, a.linger_until, a.linger_timeout, security)
        if health is not None:
            health.stop()
        return rc

    return _role("client", body)


def cmd_clients(a: argparse.Namespace) -> int:
    from fedhop.client.host import ClientPrefix, run_clients
    from fedhop.client_ids import IdListError, parse_ids
    from fedhop.lifecycle import linger
    from fedhop.netcheck import wait_for_parent

    try:  # before logging is set up or anything starts: a bad list is a usage error
        ids = parse_ids(a.ids)
    except IdListError as e:
        raise Fatal(ExitCode.USAGE, f"--ids: {e}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [%(client)s] %(name)s: %(message)s",
                        stream=sys.stderr)
    for h in logging.getLogger().handlers:
        h.addFilter(ClientPrefix(ids))

    def body() -> int:
        from fedhop.secure_args import security_from_args

        security = {node: security_from_args(a, node, None) for node in ids}  # every id's material, up front
        health = None
        if a.health:
            from fedhop.transport.health import serve_health

            health = serve_health(a.health)
        wait_for_parent(a.connect, a.connect_timeout, log.warning, security[ids[0]])
        rc = run_clients(ids, a.connect, data_path=a.data_path, device=a.device,
                         connect_timeout_s=a.connect_timeout, state_dir=Path(a.state_dir) if a.state_dir else None,
                         security=security)
        rc = linger(f"{len(ids)} clients", rc, a.linger_until, a.linger_timeout)
        if health is not None:
            health.stop()
        return rc

    return _role("clients", body)


def _add_linger(s: argparse.ArgumentParser) -> None:
    s.add_argument("--linger-until", metavar="ADDR",
                   help="after a clean end, stay up until the gRPC health service at ADDR (the PS) stops serving: "
                        "`docker compose up --exit-code-from ps` stops everything when the first container exits, "
                        "so children must not exit before the PS has written its results")
    s.add_argument("--linger-timeout", type=float, default=300.0, help="seconds --linger-until waits at most")


def add_commands(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter],
                 add_run_options: Callable[[argparse.ArgumentParser, str], None]) -> None:
    from fedhop.client_ids import AUTO, MIN_AUTO_PER_PROCESS, per_process_arg
    from fedhop.secure_args import add_security_args
    from fedhop.server.web.cli import add_http_args

    s = sub.add_parser("launch", help="run a spec as real local processes: PS, edges and clients over gRPC",
                       formatter_class=formatter)
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

    s = sub.add_parser("server", help="the parameter server: owns the spec, waits for every node, runs it",
                       formatter_class=formatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    s.add_argument("--listen", default="127.0.0.1:50051",
                   help="HOST:PORT to serve on (beyond loopback: give --tls/--token, or --insecure)")
    add_run_options(s, "server")
    s.add_argument("--device", help="override the spec's device for this process")
    s.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from the PS's last checkpoint; "
                   "nodes still up re-join it and roll back to it, restarted ones restore from their --state-dir")
    add_http_args(s)
    add_security_args(s)
    s.set_defaults(fn=cmd_server)

    s = sub.add_parser("edge", help="an edge server: dials the PS, serves its clients and neighbour edges",
                       formatter_class=formatter)
    s.add_argument("--id", required=True, help="this edge's id, e.g. edge-0")
    s.add_argument("--connect", required=True, help="the PS's HOST:PORT")
    s.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT for clients and neighbour edges (port 0: "
                   "any; beyond loopback: give --tls/--token, or --insecure)")
    s.add_argument("--advertise", help="HOST:PORT neighbour edges dial (default: the listen address)")
    s.add_argument("--device", help="override the spec's device for this process")
    s.add_argument("--connect-timeout", type=float, default=60.0,
                   help="seconds to keep retrying the PS (each retry is logged)")
    s.add_argument("--state-dir", help="save this node's state here after every task; restart with the same "
                   "--id and --state-dir to restore it (default: kept in memory only)")
    _add_linger(s)
    add_security_args(s)
    s.set_defaults(fn=cmd_edge)

    s = sub.add_parser("client", help="a client: dials its parent (edge or PS) and serves its tasks",
                       formatter_class=formatter)
    s.add_argument("--id", required=True, help="this client's id, e.g. client-3")
    s.add_argument("--connect", required=True, help="the parent's HOST:PORT")
    s.add_argument("--data-path", help="where this client's data lives (default: the spec's data.path)")
    s.add_argument("--device", help="override the spec's device for this process")
    s.add_argument("--connect-timeout", type=float, default=60.0,
                   help="seconds to keep retrying the parent (each retry is logged)")
    s.add_argument("--state-dir", help="save this client's state here after every task; restart with the same "
                   "--id and --state-dir to restore it (default: kept in memory only)")
    s.add_argument("--health", metavar="HOST:PORT",
                   help="serve grpc.health.v1 on this address (clients listen on nothing else), for healthchecks")
    _add_linger(s)
    add_security_args(s)
    s.set_defaults(fn=cmd_client)

    s = sub.add_parser("clients", help="a client host: many client ids of one parent in one process, each with "
                       "its own session, state and byte counts", formatter_class=formatter)
    s.add_argument("--ids", required=True, metavar="LIST",
                   help="the client ids to serve: ids and inclusive ranges, comma-separated, e.g. "
                        "client-0..client-499 or client-0..client-9,client-12")
    s.add_argument("--connect", required=True, help="the parent's HOST:PORT (every id has this parent)")
    s.add_argument("--data-path", help="where the clients' data lives (default: the spec's data.path)")
    s.add_argument("--device", help="override the spec's device for this process")
    s.add_argument("--connect-timeout", type=float, default=60.0,
                   help="seconds to keep retrying the parent (each retry is logged)")
    s.add_argument("--state-dir", help="save each client's state under DIR/<id> after every task; restart with "
                   "the same --ids and --state-dir to restore them (default: kept in memory only)")
    s.add_argument("--health", metavar="HOST:PORT", help="serve grpc.health.v1 on this address, for healthchecks")
    _add_linger(s)
    add_security_args(s)
    s.set_defaults(fn=cmd_clients)
