"""``fedhop compare RUN_DIR...``: which run reaches the target accuracy with fewer bytes and less wall-clock.

Reads each run folder's ``results.json`` (rounds with ``cum_payload_bytes`` and ``elapsed_s``; the per-link
meter rows) and writes into ``--out``:

- ``compare.png``: accuracy vs round, vs cumulative payload bytes and vs wall-clock, every run on each panel;
- ``table.md`` and ``table.csv``: per run, the final accuracy; the round, cumulative payload bytes and
  wall-clock at which accuracy first reached the target; total payload bytes per link class (client<->edge,
  edge<->edge, edge<->PS, client<->PS).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhop.common.exit_codes import ExitCode, Fatal
from fedhop.report import CLASS_TITLES, LINK_CLASSES, bytes_by_class


@dataclass
class Run:
    """One run folder, as compare reads it."""

    label: str
    folder: Path
    algorithm: str
    engine: str
    rounds: list[dict[str, Any]]
    links: list[dict[str, Any]]
    interrupted: bool

    @property
    def evaluated(self) -> list[dict[str, Any]]:
        return [r for r in self.rounds if "accuracy" in r]

    @property
    def final_accuracy(self) -> float | None:
        ev = self.evaluated
        return float(ev[-1]["accuracy"]) if ev else None

    def first_reach(self, target: float) -> dict[str, Any] | None:
        """The first evaluated round whose accuracy is >= ``target``."""
        return next((r for r in self.evaluated if float(r["accuracy"]) >= target), None)


def load_run(folder: Path) -> Run:
    path = folder / "results.json"
    if not path.is_file():
        raise Fatal(ExitCode.USAGE, f"{folder} is not a run folder: no results.json")
    try:
        res = json.loads(path.read_text())
        spec = res["spec"]
        rounds, links = res["rounds"], res["links"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise Fatal(ExitCode.USAGE, f"{path} is not a fedhop results file ({type(e).__name__}: {e})") from None
    old = [k for k in ("cum_payload_bytes", "elapsed_s") if rounds and k not in rounds[0]]
    if old:
        raise Fatal(ExitCode.USAGE, f"{path} has no {' / '.join(old)} per round (written by an older fedhop; "
                    "run it again)")
    return Run(label=folder.name, folder=folder, algorithm=spec["algorithm"]["name"], engine=res.get("engine", "?"),
               rounds=rounds, links=links, interrupted=bool(res.get("interrupted", False)))


def _labels(folders: list[Path]) -> list[str]:
    """Folder names, made unique with their parents' names where two runs share one."""
    names = [f.name for f in folders]
    return [str(Path(f.parent.name) / f.name) if names.count(f.name) > 1 else f.name for f in folders]


def table_rows(runs: list[Run], target: float) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        hit = run.first_reach(target)
        classes = bytes_by_class(run.links)
        rows.append({
            "run": run.label, "algorithm": run.algorithm, "engine": run.engine,
            "rounds": len(run.rounds), "interrupted": run.interrupted,
            "final_accuracy": run.final_accuracy,
            "target_accuracy": target,
            "round_to_target": hit["round"] if hit else None,
            "payload_bytes_to_target": hit["cum_payload_bytes"] if hit else None,
            "wall_s_to_target": hit["elapsed_s"] if hit else None,
            "payload_bytes_total": sum(int(r["payload_bytes"]) for r in run.links),
            **{f"payload_bytes_{c.replace('-', '_')}": classes[c] for c in LINK_CLASSES},
        })
    return rows


def _fmt(v: Any) -> str:
    if v is None:
        return "not reached"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4f}" if v < 10 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown(rows: list[dict[str, Any]], target: float) -> str:
    cols = [("run", "run"), ("algorithm", "algorithm"), ("final_accuracy", "final acc."),
            ("round_to_target", f"round to {target:.4f}"), ("payload_bytes_to_target", "payload B to target"),
            ("wall_s_to_target", "wall-clock s to target"), ("payload_bytes_total", "payload B total"),
            *[(f"payload_bytes_{c.replace('-', '_')}", f"{CLASS_TITLES[c]} B") for c in LINK_CLASSES]]
    lines = ["| " + " | ".join(t for _, t in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [_fmt(r[k]) if k != "final_accuracy" or r[k] is not None else "(no evaluation)" for k, _ in cols]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"Target accuracy {target:.4f}: first evaluated round at or above it; payload bytes are cumulative up "
             "to and including that round; wall-clock is the seconds since the run's first round started "
             "(rounds.csv elapsed_s). Link-class columns: payload bytes of the whole run, both directions."]
    cut = [r["run"] for r in rows if r["interrupted"]]
    if cut:
        notes.append(f"Interrupted runs (rounds done only): {', '.join(cut)}.")
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def plot(runs: list[Run], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), sharey=True)
    for run in runs:
        ev = run.evaluated
        ys = [float(r["accuracy"]) for r in ev]
        label = f"{run.label} ({run.algorithm})"
        axes[0].plot([r["round"] for r in ev], ys, marker=".", label=label)
        axes[1].plot([r["cum_payload_bytes"] / 1e6 for r in ev], ys, marker=".", label=label)
        axes[2].plot([r["elapsed_s"] for r in ev], ys, marker=".", label=label)
    for ax, xlabel in zip(axes, ("round", "cumulative payload (MB)", "wall-clock since round 1 started (s)"),
                          strict=True):
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"fedhop compare: {len(runs)} runs, target accuracy {target:.4f} (dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def compare(folders: list[Path], out: Path, target: float | None = None) -> str:
    """Write compare.png, table.md and table.csv into ``out``; returns the markdown table."""
    runs = [load_run(f) for f in folders]
    for run, label in zip(runs, _labels(folders), strict=True):
        run.label = label
    finals = [r.final_accuracy for r in runs if r.final_accuracy is not None]
    if target is None:
        if not finals:
            raise Fatal(ExitCode.USAGE, "no run evaluated its accuracy; nothing to compare against a target")
        target = min(finals)
    elif not 0.0 <= target <= 1.0:
        raise Fatal(ExitCode.USAGE, f"--target-accuracy must be in [0, 1], got {target}")
    rows = table_rows(runs, target)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(rows, target)
    (out / "table.md").write_text(md + "\n")
    with (out / "table.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    plot(runs, target, out / "compare.png")
    return md
