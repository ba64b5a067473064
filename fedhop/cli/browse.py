"""``fedhop ls`` (the runs in a folder of runs), ``fedhop show`` (one run) and ``fedhop ui`` (the web face over
a folder of runs). The folders are read by :mod:`fedhop.browse`; the web face is ``server/web/browse.py``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhop.common.exit_codes import ExitCode, Fatal

if TYPE_CHECKING:
    from fedhop.browse import RunFolder, RunInfo

DEFAULT_ROOT = "runs"
LS_COLUMNS = ("run", "algorithm", "status", "rounds", "accuracy", "payload", "duration")


def _fatal(e: Exception) -> Fatal:
    return Fatal(ExitCode.USAGE, str(e))


def ls_rows(infos: list[RunInfo]) -> list[tuple[str, ...]]:
    from fedhop.browse import fmt_bytes, fmt_duration

    rows = []
    for i in infos:
        total = i.rounds_total if i.rounds_total is not None else "?"
        rows.append((i.name, i.algorithm or "?", i.status, f"{i.rounds_done}/{total}",
                     f"{i.accuracy:.4f}" if i.accuracy is not None else "–", fmt_bytes(i.payload_bytes),
                     fmt_duration(i.duration_s)))
    return rows


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]], right: set[int] | None = None) -> str:
    """Columns as wide as their widest cell, two spaces apart; ``right``: the indexes aligned right."""
    right = right or set()
    widths = [max(len(str(r[c])) for r in [header, *rows]) for c in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [str(v).rjust(w) if c in right else str(v).ljust(w) for c, (v, w) in enumerate(zip(r, widths,
                                                                                                  strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def cmd_ls(a: argparse.Namespace) -> int:
    from fedhop.browse import RunNotFound, list_runs

    try:
        infos = list_runs(Path(a.runs_dir))
    except RunNotFound as e:
        raise _fatal(e) from None
    if a.json:
        print(json.dumps([i.to_json() for i in infos], indent=1))
        return 0
    if not infos:
        print(f"no runs under {a.runs_dir}", file=sys.stderr)
        return 0
    print(format_table(tuple(c.upper() for c in LS_COLUMNS), ls_rows(infos), right={3, 4, 5, 6}))
    return 0


def show_json(run: RunFolder) -> dict[str, Any]:
    """``fedhop show --json``: the ``ls`` line, the spec, the rounds, bytes per link and per link class, the
    route and the missing log."""
    from fedhop.report import bytes_by_class, per_link

    return {
        **run.info.to_json(),
        "spec": run.spec,
        "rounds": run.rounds,
        "links": [{"src": x.src, "dst": x.dst, "messages": x.messages, "payload_bytes": x.payload,
                   "message_bytes": x.message, "wire_bytes": x.wire} for x in per_link(run.links)],
        "bytes_by_class": bytes_by_class(run.links) if run.links else None,
        "route": route_steps(run.rounds),
        "missing": run.missing,
    }


def route_steps(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's route per round (Fed-CHS's edge, FedCluster's order, a random walk's client)."""
    from fedhop.report import ROUTE_KEYS

    out = []
    for r in rounds:
        key = next((k for k in ROUTE_KEYS if k in r), None)
        if key is not None:
            nodes = str(r[key]).split(",") if key == "order" else [str(r[key])]
            out.append({"round": int(r["round"]), "nodes": [n for n in nodes if n]})
    return out


def show_text(run: RunFolder, top: int = 20) -> str:
    """``fedhop show``: summary, bytes per link class and per link, route, missing participants."""
    from fedhop.browse import fmt_bytes, fmt_duration
    from fedhop.report import CLASS_TITLES, bytes_by_class, link_table, route

    i = run.info
    total = i.rounds_total if i.rounds_total is not None else "?"
    lines = [f"run       {i.name}  ({i.path})",
             f"status    {i.status}: {i.why}",
             f"algorithm {i.algorithm or '?'}   engine {i.engine or '?'}   spec name {i.spec_name or '?'}",
             f"rounds    {i.rounds_done}/{total}"]
    if i.started is not None:
        lines.append(f"started   {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(i.started))}"
                     f"   duration {fmt_duration(i.duration_s)}")
    if i.run_id:
        lines.append(f"run id    {i.run_id}")
    if i.url:
        lines.append(f"live page {i.url}")
    if i.error:
        lines.append(f"error     {i.error}")
    if run.spec:
        topo = run.spec.get("topology") or {}
        lines.append(f"topology  {topo.get('clients', '?')} clients, {topo.get('edges', '?')} edges"
                     + (f" ({topo.get('edge_graph')} edge graph)" if topo.get("edges") else ""))
    metrics = [f"{k} {v:.4f}" for k, v in (("accuracy", i.accuracy), ("loss", i.loss)) if v is not None]
    if metrics:
        lines.append("final     " + ", ".join(metrics))
    if i.payload_bytes is not None:
        lines.append(f"bytes     payload {fmt_bytes(i.payload_bytes)} ({i.payload_bytes:,} B), message "
                     f"{fmt_bytes(i.message_bytes)}")
    if run.links:
        by_class = bytes_by_class(run.links)
        lines.append("by class  " + ", ".join(f"{CLASS_TITLES[c]} {fmt_bytes(v)}" for c, v in by_class.items() if v))
        lines += ["", "bytes per link (payload: tensor bytes; message: serialized frames; wire: TCP stream):",
                  link_table(run.links, top=top)]
    elif i.status == "running":
        lines += ["", "bytes per link: written when the run ends" + (f" (live: {i.url})" if i.url else "")]
    steps = route(run.rounds)
    if steps:
        lines += ["", steps]
    lines += ["", missing_text(run.missing, top)]
    return "\n".join(lines)


def missing_text(missing: list[dict[str, Any]], top: int = 20) -> str:
    if not missing:
        return "missing participants: none"
    by_node: dict[str, list[int]] = {}
    for m in missing:
        by_node.setdefault(str(m.get("node")), []).append(int(m.get("round", 0)))
    head = f"missing participants: {len(missing)} entries, {len(by_node)} nodes"
    per_node = [f"  {n}: rounds {', '.join(map(str, sorted(set(r))))}" for n, r in sorted(by_node.items())]
    rows = [(str(m.get("round", "")), str(m.get("by", "")), str(m.get("node", "")), str(m.get("task", "")),
             str(m.get("reason", ""))) for m in missing[:top]]
    table = format_table(("ROUND", "BY", "NODE", "TASK", "REASON"), rows, right={0})
    more = f"\n  ... {len(missing) - top} more (missing.csv)" if len(missing) > top else ""
    return "\n".join([head, *per_node, "", table]) + more


def cmd_show(a: argparse.Namespace) -> int:
    from fedhop.browse import RunNotFound, read_folder, resolve_run

    try:
        folder = resolve_run(a.run, Path(a.runs_dir))
        run = read_folder(folder, Path(a.runs_dir) if Path(a.runs_dir).is_dir() else None)
    except RunNotFound as e:
        raise _fatal(e) from None
    print(json.dumps(show_json(run), indent=1) if a.json else show_text(run, a.top))
    return 0


def cmd_ui(a: argparse.Namespace) -> int:
    from fedhop.server.web.browse import serve_forever
    from fedhop.server.web.cli import TOKEN_ENV
    from fedhop.server.web.serve import HttpConfigError

    root = Path(a.runs_dir)
    if not root.is_dir():
        raise Fatal(ExitCode.USAGE, f"{root} is not a folder of runs")
    token = a.http_token or os.environ.get(TOKEN_ENV) or None
    try:
        serve_forever(root, a.http, token=token,
                      announce=lambda line: print(f"fedhop ui: {line}", file=sys.stderr, flush=True))
    except HttpConfigError as e:
        raise _fatal(e) from None
    except OSError as e:
        raise Fatal(ExitCode.ADDRESS_IN_USE, f"--http {a.http}: {e}") from None
    return 0


def add_commands(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    from fedhop.server.web.cli import TOKEN_ENV

    s = sub.add_parser("ls", help="list the runs in a folder of runs: name, algorithm, status, rounds, accuracy, "
                       "bytes, duration", formatter_class=formatter)
    s.add_argument("runs_dir", nargs="?", default=DEFAULT_ROOT, metavar="RUNS_DIR",
                   help="folder of run folders (searched a few levels deep)")
    s.add_argument("--json", action="store_true", help="one JSON object per run (with the status's reason)")
    s.set_defaults(fn=cmd_ls)

    s = sub.add_parser("show", help="one run: summary, bytes per link class and per link, route, missing "
                       "participants", formatter_class=formatter)
    s.add_argument("run", metavar="RUN", help="a run folder, or a run's name (or a unique part of it) in RUNS_DIR")
    s.add_argument("--runs-dir", default=DEFAULT_ROOT, help="where RUN is looked up when it is not a path")
    s.add_argument("--json", action="store_true", help="everything as one JSON object")
    s.add_argument("--top", type=int, default=20, help="rows of the per-link and missing tables")
    s.set_defaults(fn=cmd_show)

    s = sub.add_parser("ui", help="serve the runs of a folder in the browser: the run list, each run's page "
                       "(live while it runs), several runs overlaid", formatter_class=formatter)
    s.add_argument("runs_dir", nargs="?", default=DEFAULT_ROOT, metavar="RUNS_DIR", help="folder of run folders")
    s.add_argument("--http", metavar="HOST:PORT", default="127.0.0.1:8090",
                   help="address to serve on (port 0 = a free port); a host beyond loopback needs --http-token")
    s.add_argument("--http-token", metavar="TOKEN", default=None,  # the environment's is read when run (not in --help)
                   help=f"bearer token every request must carry (default: ${TOKEN_ENV}); required beyond loopback")
    s.set_defaults(fn=cmd_ui)
