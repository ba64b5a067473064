"""``fedhop server | edge | client | clients``: one role of the networked engine per process.

Each command reads its options into typed values here (the roles take no argparse namespace) and, for the
children (edge, client, clients), leaves without interpreter teardown once done (:func:`console.exit_now`).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fedhop.cli.console import (
    HttpArgs,
    add_run_options,
    check_device,
    exit_now,
    load_resume,
    load_spec,
    log_to_stderr,
    print_summary,
    run_folder,
    start_web,
)
from fedhop.cli.errors import RunPlace, run_command, run_failures
from fedhop.cli.security import SecurityArgs, add_security_args, security_for

if TYPE_CHECKING:
    from fedhop.transport.credentials import Security
    from fedhop.transport.node_config import NodeConfig

log = logging.getLogger("fedhop.cli")


def cmd_server(a: argparse.Namespace) -> int:
    from fedhop.cli.netcheck import check_listen
    from fedhop.common.engine.preflight import check_user_code
    from fedhop.common.topology import build_topology
    from fedhop.lifecycle import exit_zero_on_sigterm_once_written
    from fedhop.server.main import run_server

    started = time.perf_counter()
    log_to_stderr(a.log_level)
    resume = load_resume(a.resume, a.spec, a.set)
    spec = resume.spec if resume is not None else load_spec(a.spec, a.set)
    check_user_code(spec, clients=False, source=a.spec or "<default spec>")  # clients check their own at join
    check_listen(a.listen)
    security = security_for(SecurityArgs.of(a), build_topology(spec.topology, spec.seed).server, a.listen)
    check_device(a.device or spec.device)
    out = Path(a.resume) if resume is not None else run_folder(a.out, a.force, spec.name, "server")
    exit_zero_on_sigterm_once_written(out)
    page = start_web(HttpArgs.of(a), out, "network")
    try:
        with run_failures(RunPlace(spec.rounds, out)):
            result = run_server(spec, a.listen, out=out, device=a.device, resume=resume, events=page.events,
                                security=security)
    finally:
        page.close()
    print_summary(result, out, time.perf_counter() - started)
    # Leave at once: an interpreter teardown under gRPC's threads can take seconds, and during it Python
    # restores the default SIGTERM action, so an orchestrator's SIGTERM then would turn a finished run into 143.
    return exit_now(0)


def _role(name: str, body: Callable[[], int]) -> int:
    """Run one child role and leave with its code; a failure (errors.py: a Fatal, a missing device, Ctrl-C ...)
    ends in one line."""
    return exit_now(run_command(f"fedhop {name}", body))


def node_config(a: argparse.Namespace, node_id: str, security: Security, *, listen: str | None = None,
                advertise: str | None = None, data_path: str | None = None) -> NodeConfig:
    """The child role's :class:`~fedhop.transport.node_config.NodeConfig` from its options (made once, here); an
    invalid one is a usage error."""
    from fedhop.common.exit_codes import ExitCode, Fatal
    from fedhop.transport.node_config import NodeConfig, NodeConfigError

    try:
        return NodeConfig(node_id, a.connect, listen=listen, advertise=advertise, device=a.device,
                          data_path=data_path, state_dir=Path(a.state_dir) if a.state_dir else None,
                          connect_timeout_s=a.connect_timeout, linger_until=a.linger_until,
                          linger_timeout_s=a.linger_timeout, security=security)
    except NodeConfigError as e:
        raise Fatal(ExitCode.USAGE, str(e)) from None


def cmd_edge(a: argparse.Namespace) -> int:
    from fedhop.cli.netcheck import check_listen, wait_for_parent
    from fedhop.edge.node import run_edge
    from fedhop.lifecycle import linger

    log_to_stderr(a.log_level)
    sec_args = SecurityArgs.of(a)

    def body() -> int:
        check_listen(a.listen)
        cfg = node_config(a, a.id, security_for(sec_args, a.id, a.listen), listen=a.listen, advertise=a.advertise)
        wait_for_parent(cfg.connect, cfg.connect_timeout_s, log.warning, cfg.security)
        rc = run_edge(cfg)
        return linger(cfg.node_id, rc, cfg.linger_until, cfg.linger_timeout_s, cfg.security)

    return _role("edge", body)


def cmd_client(a: argparse.Namespace) -> int:
    from fedhop.cli.netcheck import wait_for_parent
    from fedhop.client.main import run_client
    from fedhop.lifecycle import linger

    log_to_stderr(a.log_level)
    sec_args = SecurityArgs.of(a)

    def body() -> int:
        if a.listen is not None:
            from fedhop.cli.netcheck import check_listen

            check_listen(a.listen)
        cfg = node_config(a, a.id, security_for(sec_args, a.id, a.listen), data_path=a.data_path, listen=a.listen,
                          advertise=a.advertise)
        health = None
        if a.health:
            from fedhop.transport.health import serve_health

            health = serve_health(a.health)
        wait_for_parent(cfg.connect, cfg.connect_timeout_s, log.warning, cfg.security)
        rc = run_client(cfg)
        rc = linger(cfg.node_id, rc, cfg.linger_until, cfg.linger_timeout_s, cfg.security)
        if health is not None:
            health.stop()
        return rc

    return _role("client", body)


def cmd_clients(a: argparse.Namespace) -> int:
    from fedhop.cli.netcheck import wait_for_parent
    from fedhop.client.host import ClientPrefix, run_clients
    from fedhop.client_ids import IdListError, parse_ids
    from fedhop.common.exit_codes import ExitCode, Fatal
    from fedhop.lifecycle import linger

    try:  # before logging is set up or anything starts: a bad list is a usage error
        ids = parse_ids(a.ids)
    except IdListError as e:
        raise Fatal(ExitCode.USAGE, f"--ids: {e}") from None
    log_to_stderr(a.log_level, fmt="%(asctime)s %(levelname)s [%(client)s] %(name)s: %(message)s")
    for h in logging.getLogger().handlers:
        h.addFilter(ClientPrefix(ids))
    sec_args = SecurityArgs.of(a)

    def body() -> int:
        from fedhop.transport.credentials import SecurityByNode

        # every id's material, up front
        security = SecurityByNode({node: security_for(sec_args, node, None) for node in ids})
        cfg = node_config(a, f"{len(ids)} clients", security.of(ids[0]), data_path=a.data_path)
        health = None
        if a.health:
            from fedhop.transport.health import serve_health

            health = serve_health(a.health)
        wait_for_parent(cfg.connect, cfg.connect_timeout_s, log.warning, cfg.security)
        rc = run_clients(ids, cfg, security)
        rc = linger(cfg.node_id, rc, cfg.linger_until, cfg.linger_timeout_s)
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


def add_commands(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    from fedhop.server.web.cli import add_http_args

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
    s.add_argument("--listen", help="HOST:PORT where this client serves its peers, for a run whose clients hand "
                   "models to each other (topology.peer_graph: wrwgd, dpsgd); other runs need none")
    s.add_argument("--advertise", help="HOST:PORT its peers dial (default: the listen address)")
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
