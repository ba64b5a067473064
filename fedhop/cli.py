"""The ``fedhop`` command line: launch, simulate, one role per process, reproduce."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_SPEC = Path(__file__).with_name("default_spec.toml")


def load_spec(path: str | None):
    from fedhop.common.spec import RunSpec

    return RunSpec.load(path or DEFAULT_SPEC)


def default_out(spec_name: str, engine: str) -> Path:
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{spec_name}-{engine}"


def progress(total: int, label: str, quiet: bool = False):
    """A tqdm bar advanced by round records, showing the latest metrics (disabled when ``quiet``)."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc=label, unit="round", file=sys.stderr, disable=quiet)

    def on_round(rec: dict) -> None:
        bar.n = rec["round"]
        shown = {k: rec[k] for k in ("accuracy", "loss") if k in rec}
        bar.set_postfix({k: f"{v:.4f}" for k, v in shown.items()})
        bar.refresh()

    return bar, on_round


def cmd_simulate(a: argparse.Namespace) -> int:
    from fedhop.common.engine.inprocess import InProcessEngine
    from fedhop.common.engine.results import write_run_folder

    spec = load_spec(a.spec)
    engine = InProcessEngine(spec, device=a.device)
    bar, on_round = progress(spec.rounds, f"simulate {spec.algorithm.name}", a.quiet)
    out = Path(a.out) if a.out else default_out(spec.name, "simulate")
    result = engine.run(on_round=on_round, journal=out / "rounds.jsonl")
    bar.close()
    write_run_folder(result, out)
    print_summary(result, out)
    return 0


def print_summary(result, out: Path) -> None:
    from fedhop.common.engine.results import totals

    last = result.rounds[-1] if result.rounds else {}
    t = totals(result.links)
    acc = f"accuracy {last['accuracy']:.4f}, " if "accuracy" in last else ""
    loss = last.get("loss", float("nan"))
    print(f"{result.spec.algorithm.name}: {len(result.rounds)} rounds reported, {acc}loss {loss:.4f}; "
          f"payload {t['payload_bytes']:,} B, messages {t['message_bytes']:,} B; "
          f"training wall-clock {result.wall_s:.1f}s")
    if result.missing:
        print(f"missing: {len(result.missing)} calls, e.g. {result.missing[0]}")
    print(f"results in {out}")


def cmd_reproduce(a: argparse.Namespace) -> int:
    from fedhop.reproduce import load_all, run_experiment

    names = sorted(load_all()) if a.name == "all" else [a.name]
    failed = []
    for name in names:
        out = Path(a.out or "runs/reproduce") / (name + ("-quick" if a.quick else ""))
        outcome = run_experiment(name, out, a.quick, dataset=a.dataset, path=a.data_path)
        status = "ok" if outcome.ok else "CLAIM NOT MET"
        print(f"\n== {name}{' (quick)' if a.quick else ''}: {status}; results in {out}\n{outcome.table_md}")
        for claim, held in outcome.checks.items():
            print(f"  [{'x' if held else ' '}] {claim}")
        if not outcome.ok:
            failed.append(name)
    return 1 if failed else 0


def cmd_algorithms(a: argparse.Namespace) -> int:
    from fedhop.common.engine.api import ALGORITHMS, get_algorithm

    get_algorithm("fedavg")
    for name in sorted(ALGORITHMS):
        print(f"{name:24s} {ALGORITHMS[name].summary}")
    return 0


def cmd_spec(a: argparse.Namespace) -> int:
    spec = load_spec(a.spec)
    full = spec.model_copy(update={"algorithm": spec.algorithm.model_copy(
        update={"options": spec.options().model_dump(mode="json", exclude_none=True)})})
    print(full.to_toml(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedhop", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("simulate", help="run a spec with the in-process engine (no sockets)")
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    s.add_argument("--out", help="run folder (default: runs/<time>-<name>-simulate)")
    s.add_argument("--device", help="override the spec's device: auto | cpu | cuda | cuda:N")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_simulate)

    s = sub.add_parser("reproduce", help="run a paper reproduction (results, plots, markdown table)")
    s.add_argument("name", help="focus-fig4 | fedcluster-e1 | fedchs-digits | fgdro-toy | all")
    s.add_argument("--quick", action="store_true", help="the reduced size CI runs")
    s.add_argument("--out", help="parent folder of the results (default: runs/reproduce)")
    s.add_argument("--dataset", help="fedchs-digits only: run on mnist / fashion-mnist / cifar10 / cifar100 files")
    s.add_argument("--data-path", help="fedchs-digits only: the folder holding those files")
    s.set_defaults(fn=cmd_reproduce)

    s = sub.add_parser("algorithms", help="list the algorithms")
    s.set_defaults(fn=cmd_algorithms)

    s = sub.add_parser("spec", help="print a spec, validated and with every default filled in")
    s.add_argument("spec", nargs="?")
    s.set_defaults(fn=cmd_spec)

    from fedhop import deploy_cli, roles_cli

    roles_cli.add_commands(sub)
    deploy_cli.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except Exception as e:
        from fedhop.common.spec import SpecError  # imported here: it imports torch, which `fedhop health` avoids

        if not isinstance(e, SpecError):
            raise
        print(f"fedhop: {e}", file=sys.stderr)
        return 2
