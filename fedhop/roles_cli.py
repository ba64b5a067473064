"""``fedhop launch | server | edge | client``: the networked engine's commands (DESIGN.md section 5)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _logging(verbose: bool = True) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)


def _exit_now(rc: int) -> int:
    """Leave without interpreter teardown once a role is done: gRPC's C-core threads can still be winding
    down then, and tearing the interpreter down under them aborts the process ("terminate called without an
    active exception", exit -6) although the run itself ended cleanly. Everything is written by now."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def cmd_launch(a: argparse.Namespace) -> int:
    from fedhop.cli import default_out, load_spec, print_summary, progress
    from fedhop.launch import launch
    from fedhop.server.main import JoinTimeout, StartupFailed

    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)
    spec = load_spec(a.spec)
    out = Path(a.out) if a.out else default_out(spec.name, "launch")
    if not a.quiet:
        n = spec.topology.edges + spec.topology.clients
        print(f"fedhop launch: starting {n} processes ({spec.topology.edges} edges, {spec.topology.clients} "
              f"clients) beside the PS; logs in {out / 'logs'}", file=sys.stderr)
    bar, on_round = progress(spec.rounds, f"launch {spec.algorithm.name}", a.quiet)
    try:
        result = launch(spec, out, device=a.device, data_path=a.data_path, on_round=on_round)
    except KeyboardInterrupt:
        bar.close()
        print(f"fedhop launch: interrupted; every process was stopped (logs in {out / 'logs'})", file=sys.stderr)
        return 130
    except (StartupFailed, JoinTimeout) as e:
        bar.close()
        print(f"fedhop launch: {e}\n(every process was stopped; logs in {out / 'logs'})", file=sys.stderr)
        return 3
    bar.close()
    print_summary(result, out)
    return 0


def cmd_server(a: argparse.Namespace) -> int:
    from fedhop.cli import default_out, load_spec, print_summary
    from fedhop.lifecycle import exit_zero_on_sigterm_once_written
    from fedhop.server.main import run_server

    _logging()
    spec = load_spec(a.spec)
    out = Path(a.out) if a.out else default_out(spec.name, "server")
    exit_zero_on_sigterm_once_written(out)
    result = run_server(spec, a.listen, out=out, device=a.device)
    print_summary(result, out)
    # Leave at once: an interpreter teardown under gRPC's threads can take seconds, and during it Python
    # restores the default SIGTERM action, so an orchestrator's SIGTERM then would turn a finished run into 143.
    return _exit_now(0)


def cmd_edge(a: argparse.Namespace) -> int:
    from fedhop.edge.node import run_edge
    from fedhop.lifecycle import linger

    _logging()
    rc = run_edge(a.id, a.connect, a.listen, device=a.device, advertise=a.advertise,
                  connect_timeout_s=a.connect_timeout)
    return _exit_now(linger(a.id, rc, a.linger_until, a.linger_timeout))


def cmd_client(a: argparse.Namespace) -> int:
    from fedhop.client.main import run_client
    from fedhop.lifecycle import linger

    _logging()
    health = None
    if a.health:
        from fedhop.transport.health import serve_health

        health = serve_health(a.health)
    rc = run_client(a.id, a.connect, data_path=a.data_path, device=a.device, connect_timeout_s=a.connect_timeout)
    rc = linger(a.id, rc, a.linger_until, a.linger_timeout)
    if health is not None:
        health.stop()
    return _exit_now(rc)


def _add_linger(s: argparse.ArgumentParser) -> None:
    s.add_argument("--linger-until", metavar="ADDR",
                   help="after a clean end, stay up until the gRPC health service at ADDR (the PS) stops serving: "
                        "`docker compose up --exit-code-from ps` stops everything when the first container exits, "
                        "so children must not exit before the PS has written its results")
    s.add_argument("--linger-timeout", type=float, default=300.0, help="seconds --linger-until waits at most")


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("launch", help="run a spec as real local processes: PS, edges and clients over gRPC")
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    s.add_argument("--out", help="run folder (default: runs/<time>-<name>-launch)")
    s.add_argument("--device", default="auto", help="auto | cpu | cuda:N (auto spreads over visible GPUs)")
    s.add_argument("--data-path", help="data path every client uses (default: the spec's)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_launch)

    s = sub.add_parser("server", help="the parameter server: owns the spec, waits for every node, runs it")
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    s.add_argument("--listen", default="0.0.0.0:50051", help="HOST:PORT to serve on")
    s.add_argument("--out", help="run folder (default: runs/<time>-<name>-server)")
    s.add_argument("--device", help="override the spec's device for this process")
    s.set_defaults(fn=cmd_server)

    s = sub.add_parser("edge", help="an edge server: dials the PS, serves its clients and neighbour edges")
    s.add_argument("--id", required=True, help="this edge's id, e.g. edge-0")
    s.add_argument("--connect", required=True, help="the PS's HOST:PORT")
    s.add_argument("--listen", default="0.0.0.0:0", help="HOST:PORT for clients and neighbour edges")
    s.add_argument("--advertise", help="HOST:PORT neighbour edges dial (default: the listen address)")
    s.add_argument("--device", help="override the spec's device for this process")
    s.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for the PS")
    _add_linger(s)
    s.set_defaults(fn=cmd_edge)

    s = sub.add_parser("client", help="a client: dials its parent (edge or PS) and serves its tasks")
    s.add_argument("--id", required=True, help="this client's id, e.g. client-3")
    s.add_argument("--connect", required=True, help="the parent's HOST:PORT")
    s.add_argument("--data-path", help="where this client's data lives (default: the spec's data.path)")
    s.add_argument("--device", help="override the spec's device for this process")
    s.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for the parent")
    s.add_argument("--health", metavar="HOST:PORT",
                   help="serve grpc.health.v1 on this address (clients listen on nothing else), for healthchecks")
    _add_linger(s)
    s.set_defaults(fn=cmd_client)
