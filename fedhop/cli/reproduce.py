"""``fedhop reproduce`` (the paper reproductions of :mod:`fedhop.reproduce`) and ``fedhop compare`` (run folders
side by side: :mod:`fedhop.compare`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedhop.cli.console import HelpFormatter, ReproduceProgress
from fedhop.cli.suggest import did_you_mean

# fedhop.reproduce's experiments, named here so that a misspelt one is refused before torch is imported (and
# before any progress bar); tests/unit/test_cli_mistakes.py keeps the two equal
REPRODUCTIONS = ("focus-fig4", "fedcluster-e1", "fedchs-digits", "fgdro-toy")


def reproduction(name: str) -> str:
    """``fedhop reproduce NAME``'s argument: a known reproduction or ``all``; else a usage error, with the
    closest name."""
    known = (*REPRODUCTIONS, "all")
    if name not in known:
        raise argparse.ArgumentTypeError(f"unknown reproduction {name!r} (known: {', '.join(known)})"
                                         f"{did_you_mean(name, known)}")
    return name


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


def cmd_compare(a: argparse.Namespace) -> int:
    from fedhop.compare import Metric, compare
    from fedhop.run_folders import default_compare_out

    out = Path(a.out) if a.out else default_compare_out()
    metric = Metric(a.metric, a.goal or "", a.log_y)
    table = compare([Path(r) for r in a.runs], out, a.target_accuracy, metric, timeline=a.timeline)
    print(table)
    print(f"\nfigure{'s' if a.timeline else ''}, table.md and table.csv in {out}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("reproduce", help="run a paper reproduction (results, plots, markdown table)",
                       formatter_class=HelpFormatter)
    s.add_argument("name", type=reproduction, metavar="NAME", help=" | ".join((*REPRODUCTIONS, "all")))
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
    s.add_argument("--timeline", action="store_true",
                   help="also timeline.png: each run's time per round by phase (compute, encode, transfer, wait)")
    s.set_defaults(fn=cmd_compare)
