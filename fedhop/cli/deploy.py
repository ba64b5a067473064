"""The testbeds' commands: ``fedhop testbed up|clean`` (network namespaces), ``fedhop compose`` (a compose file
for a spec), ``fedhop compose-run`` and ``fedhop stack-run`` (Docker Compose / Swarm with kernel byte counts), and
``fedhop health`` (probe a node's grpc.health.v1 service)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedhop.cli.console import load_spec
from fedhop.common.exit_codes import ExitCode, Fatal

if TYPE_CHECKING:
    from fedhop.deploy.testbed import Testbed


def cmd_testbed_up(a: argparse.Namespace) -> int:
    """``fedhop testbed up``: 0 on a finished run, the PS's code when it failed; a bad spec or host: USAGE (2), a
    testbed that could not be built: STARTUP (3), SIGINT/SIGTERM: INTERRUPTED (130) (errors.py)."""
    from fedhop.cli.errors import testbed_failures
    from fedhop.deploy.link_table import format_table
    from fedhop.deploy.testbed import open_testbed
    from fedhop.server.web.cli import token_of

    bed = open_testbed(Path(a.spec), Path(a.out) if a.out else None, device=a.device, timeout_s=a.timeout,
                       tls=a.tls, http=None if a.http == "off" else a.http, http_token=token_of(a.http_token))
    with testbed_failures(bed.out / "logs"):
        res = bed.run(None if a.quiet else _say_started)
    if res.levels:
        print(format_table(res.levels))
    for n in res.notes:
        print(f"note: {n}")
    if res.rc != 0:
        print(f"fedhop testbed: the PS exited with code {res.rc} (logs in {res.out / 'logs'})", file=sys.stderr)
    print(f"results in {res.out}")
    return res.rc


def _say_started(bed: Testbed) -> None:
    for line in bed.started_lines():
        print(f"fedhop testbed: {line}", file=sys.stderr, flush=True)


def cmd_testbed_clean(a: argparse.Namespace) -> int:
    """``fedhop testbed clean``: remove what testbeds whose owner died left behind."""
    from fedhop.deploy.testbed import clean

    removed = clean()
    print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
    return 0


def cmd_health(a: argparse.Namespace) -> int:
    from fedhop.transport.health import probe

    if a.timeout <= 0:
        raise Fatal(ExitCode.USAGE, f"--timeout must be positive, got {a.timeout:g}")
    from fedhop.transport.credentials import PLAINTEXT, Security

    security = PLAINTEXT
    if a.tls or a.token:
        if not a.id:
            raise Fatal(ExitCode.USAGE, "--tls/--token need --id NODE: the node whose certificate or token the "
                                        "probe presents (e.g. the probed node's own id)")
        security = Security.load(a.id, a.tls, a.token)  # a CredentialsError: USAGE (errors.EXIT_CODES)
    result = probe(a.address, a.timeout, a.service, security)
    print(f"{result.outcome.name}: {result.detail}", file=sys.stdout if result.outcome == 0 else sys.stderr)
    return int(result.outcome)


def cmd_compose(a: argparse.Namespace) -> int:
    from fedhop.deploy.compose import OVERRIDE_HEADER, ComposeOptions, compose_files, dump, write_compose

    spec = load_spec(a.spec)
    if a.tls:
        from fedhop.common.topology import build_topology
        from fedhop.transport.certs import CA_CERT, node_files

        # the folder as the compose file will see it: relative to --out-dir (or here, for stdout)
        folder = Path(a.out_dir or ".") / a.tls
        nodes = build_topology(spec.topology, spec.seed).all_nodes()
        missing = [str(p) for p in [folder / CA_CERT, *(f for n in nodes for f in (node_files(folder, n).cert,
                                                                                    node_files(folder, n).key))]
                   if not p.is_file()]
        if missing:
            raise Fatal(ExitCode.USAGE, f"--tls {a.tls}: missing {', '.join(missing[:4])}"
                        f"{' ...' if len(missing) > 4 else ''} (make them with `fedhop certs init {a.spec} --out "
                        f"{folder}`; service names are node ids, which every certificate names)")
    kw = dict(image=a.image, gpu_image=a.gpu_image, runs=a.runs, device=a.device, tls=a.tls)
    if a.out_dir:
        base, override = write_compose(spec, a.spec_path or a.spec, Path(a.out_dir), **kw)
        print(f"wrote {base} and {override}", file=sys.stderr)
        return 0
    docs = compose_files(spec, ComposeOptions(spec_path=a.spec_path or a.spec, **kw))
    print(dump(docs[1] if a.override else docs[0], OVERRIDE_HEADER if a.override else ""), end="")
    return 0


COMPOSE_CMDS = {"v2": ["docker", "compose"], "v1": ["docker-compose"]}


def cmd_compose_run(a: argparse.Namespace) -> int:
    import os
    import subprocess
    import time

    from fedhop.deploy.compose_run import format_table, run_compose

    folder = Path(a.dir)
    if not (folder / "docker-compose.yml").is_file():
        raise Fatal(ExitCode.USAGE, f"no docker-compose.yml in {folder} (write one with `fedhop compose`)")
    if os.geteuid() != 0:
        raise Fatal(ExitCode.USAGE, "needs root (nftables counters on the compose network)")
    compose = COMPOSE_CMDS[a.compose]
    name = a.name or time.strftime("%Y%m%d-%H%M%S")
    try:
        run = run_compose(compose, a.project, folder, Path(a.runs), name, timeout_s=a.timeout)
    finally:
        if not a.keep:
            subprocess.run([*compose, "-p", a.project, "down", "-v", "--remove-orphans"], cwd=folder,
                           capture_output=True, check=False)
    if run.links:
        print(format_table(run.links))
        print(f"wire bytes per link in {run.run_dir / 'wire.csv'}")
    print(f"compose up exited {run.rc}; run folder {run.run_dir}; compose log {Path(a.runs) / (name + '.compose.log')}")
    return run.rc


def cmd_stack_run(a: argparse.Namespace) -> int:
    import os
    import subprocess
    import time

    from fedhop.deploy.compose_run import format_table
    from fedhop.deploy.swarm_run import COMPOSE_FILE, check_stack, remove_stack, run_stack

    if a.timeout <= 0 or a.settle < 0:
        raise Fatal(ExitCode.USAGE, "--timeout must be positive and --settle not negative")
    folder = Path(a.dir)
    if not (folder / COMPOSE_FILE).is_file():
        raise Fatal(ExitCode.USAGE, f"no {COMPOSE_FILE} in {folder} (write one with `fedhop compose SPEC --out-dir "
                                    f"{folder}`)")
    if os.geteuid() != 0:
        raise Fatal(ExitCode.USAGE, "needs root (nftables counters in the overlay network's namespace)")
    check_stack(a.stack, folder / COMPOSE_FILE)  # a SwarmError: USAGE (errors.EXIT_CODES)
    name = a.name or time.strftime("%Y%m%d-%H%M%S")
    try:
        run = run_stack(a.stack, folder, Path(a.runs), name, timeout_s=a.timeout, settle_s=a.settle)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        detail = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
        raise Fatal(ExitCode.FAILED, detail) from None
    finally:
        if not a.keep:
            remove_stack(a.stack)
    if run.links:
        print(format_table(run.links))
        print(f"wire bytes per link in {run.run_dir / 'wire.csv'}")
        if not any(r.wire for r in run.links):
            print("fedhop stack-run: the wire counters on this machine saw no packet of the run (wire bytes are "
                  "missing, not zero); see the end of the service log", file=sys.stderr)
            return run.rc or 1
    print(f"PS exited {run.rc}; run folder {run.run_dir}; service logs {Path(a.runs) / (name + '.stack.log')}"
          f"{'' if a.keep else f'; stack {a.stack} removed'}")
    return run.rc


def add_testbed(sub: argparse._SubParsersAction) -> None:
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


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("health", help="probe a node's gRPC health service (exit 0 serving, 1 not serving, "
                                      "2 unreachable)")
    s.add_argument("address", help="HOST:PORT of a PS, an edge, or a client started with --health")
    s.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer (default 3)")
    s.add_argument("--service", default="", help="service name to ask about (default: the server as a whole)")
    s.add_argument("--tls", metavar="DIR", help="the node serves TLS: a folder from `fedhop certs init` (mutual TLS: "
                                               "the probe presents --id's certificate)")
    s.add_argument("--token", metavar="FILE", help="token mode: the probe sends --id's token from FILE (with --tls "
                                                   "DIR for the CA)")
    s.add_argument("--id", metavar="NODE", help="with --tls/--token: the node whose certificate or token the probe "
                                                "presents (e.g. the probed node's own id)")
    s.set_defaults(fn=cmd_health)

    s = sub.add_parser("compose", help="write a Docker Compose file for a spec, one service per node "
                                       "(stdout, or docker-compose.yml + docker-compose.override.yml with --out-dir)")
    s.add_argument("spec", help="RunSpec TOML file")
    s.add_argument("--spec-path", help="the spec's path as the compose file should refer to it, relative to the "
                                       "compose file's folder (default: SPEC as given)")
    s.add_argument("--out-dir", help="write both files into this folder instead of printing the base file")
    s.add_argument("--override", action="store_true",
                   help="print the override file (start order by health, gpu profile) instead of the base file")
    s.add_argument("--image", default="fedhop:latest", help="image of every role (default fedhop:latest)")
    s.add_argument("--gpu-image", default="fedhop:gpu", help="image of the gpu profile (default fedhop:gpu)")
    s.add_argument("--runs", default="./runs", help="host folder for run folders (default ./runs; "
                                                   "FEDHOP_RUNS overrides it when the file is used)")
    s.add_argument("--device", help="--device of every role (default: none, so each role takes the spec's "
                   "device; the CPU image has no CUDA, so a spec saying cuda fails there with NO_DEVICE)")
    s.add_argument("--tls", metavar="DIR", help="mutual TLS on every link: a `fedhop certs init SPEC` folder, "
                   "relative to the compose file's folder; each container mounts ca.crt and its own certificate "
                   "and key (default: plaintext with --insecure)")
    s.set_defaults(fn=cmd_compose)

    s = sub.add_parser("compose-run", help="docker compose up --exit-code-from ps with wire bytes per link from "
                                           "the kernel (root): wire.csv in the run folder and a printed table")
    s.add_argument("dir", nargs="?", default=".", help="folder holding docker-compose.yml (default: .)")
    s.add_argument("--project", default="fedhop", help="compose project name (default fedhop)")
    s.add_argument("--compose", choices=sorted(COMPOSE_CMDS), default="v2",
                   help="v2: `docker compose` (default); v1: `docker-compose` 1.29")
    s.add_argument("--runs", default="runs", help="host folder of run folders (bind-mounted at /runs; default runs)")
    s.add_argument("--name", help="run folder name (default: the time)")
    s.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is abandoned")
    s.add_argument("--keep", action="store_true", help="leave containers and network in place (no `down`)")
    s.set_defaults(fn=cmd_compose_run)

    s = sub.add_parser("stack-run", help="docker stack deploy on a Docker Swarm (run on a manager, root) with wire "
                                         "bytes per link from the kernel: waits for the PS, writes wire.csv into "
                                         "the run folder, prints the table, removes the stack",
                       description="Deploys DIR/docker-compose.yml (from `fedhop compose`) as a stack, counts bytes "
                                   "per address pair on the overlay network's bridge on this machine, waits until "
                                   "the PS's task ends (its exit code is the command's), collects the service logs "
                                   "and removes the stack. Every node label the placement constraints name "
                                   "(fedhop.ps, fedhop.edges, fedhop.clients) must be on some node: "
                                   "`docker node update --label-add fedhop.ps=true NODE`. On several machines only "
                                   "links with an end on this machine show wire bytes.")
    s.add_argument("dir", nargs="?", default=".", help="folder holding docker-compose.yml (default: .)")
    s.add_argument("--stack", default="fedhop", help="stack name (default fedhop); services are STACK_<node id>")
    s.add_argument("--runs", default="runs", help="folder of run folders on the PS's machine (bind-mounted at /runs "
                                                  "as an absolute path; default runs)")
    s.add_argument("--name", help="run folder name (default: the time)")
    s.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the PS's task (default 3600)")
    s.add_argument("--settle", type=float, default=120.0,
                   help="seconds to wait, after the PS ended, for the other tasks to end before the counters are "
                        "read (default 120)")
    s.add_argument("--keep", action="store_true", help="leave the stack in place (no `docker stack rm`)")
    s.set_defaults(fn=cmd_stack_run)
