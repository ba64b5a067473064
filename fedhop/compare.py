"""``fedhop compare RUN_DIR...``: which run reaches the target accuracy with fewer bytes and less wall-clock.

Reads each run folder's ``results.json`` (rounds with ``cum_payload_bytes`` and ``elapsed_s``; the per-link
meter rows) and writes into ``--out``:

- ``compare.png``: accuracy vs round, vs cumulative payload bytes and vs wall-clock, every run on each panel;
- ``table.md`` and ``table.csv``: per run, the final accuracy; the round, cumulative payload bytes and
  wall-clock at which accuracy first reached the target; total payload bytes per link class (client<->edge,
  edge<->edge, edge<->PS, client<->PS).

``--timeline`` also writes ``timeline.png``: per run, each round's time by phase (compute, encode, transfer,
wait: the seconds of ``timeline.csv`` summed over nodes and links, stacked) beside the PS's round duration.

``--metric NAME`` compares another per-round metric instead of accuracy (``loss``, or one a run reports, e.g.
focus-fig4's ``rel_err``); its target is reached at or below it (``--goal min``, the default for every metric
but accuracy) or at or above it (``--goal max``); ``--log-y`` draws it on a log scale.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhop.common.exit_codes import ExitCode, Fatal
from fedhop.report import CLASS_TITLES, LINK_CLASSES, bytes_by_class


@dataclass(frozen=True)
class Metric:
    """The per-round metric compared: its name, whether higher (``max``) or lower (``min``) is better, and
    whether the figure draws it on a log scale."""

    name: str = "accuracy"
    goal: str = ""  # "" = max for accuracy, min for anything else
    log_y: bool = False

    def __post_init__(self) -> None:
        if self.goal not in ("", "max", "min"):
            raise Fatal(ExitCode.USAGE, f"--goal must be max or min, got {self.goal!r}")
        if not self.goal:
            object.__setattr__(self, "goal", "max" if self.name == "accuracy" else "min")

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.goal == "max" else value <= target


ACCURACY = Metric()


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
    metric: Metric = field(default_factory=Metric)

    @property
    def evaluated(self) -> list[dict[str, Any]]:
        return [r for r in self.rounds if self.metric.name in r]

    @property
    def final(self) -> float | None:
        """The last evaluated value of the metric (accuracy unless another was chosen)."""
        ev = self.evaluated
        return float(ev[-1][self.metric.name]) if ev else None

    def first_reach(self, target: float) -> dict[str, Any] | None:
        """The first evaluated round whose metric reaches ``target`` (>= for max, <= for min)."""
        return next((r for r in self.evaluated if self.metric.reached(float(r[self.metric.name]), target)), None)


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
            f"final_{run.metric.name}": run.final,
            f"target_{run.metric.name}": target,
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
        if v != 0 and abs(v) < 1e-3:
            return f"{v:.3g}"
        return f"{v:.4f}" if v < 10 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown(rows: list[dict[str, Any]], target: float, metric: Metric = ACCURACY) -> str:
    final = f"final_{metric.name}"
    shown = f"{target:.4f}" if abs(target) >= 1e-3 or target == 0 else f"{target:.3g}"
    cols = [("run", "run"), ("algorithm", "algorithm"),
            (final, "final acc." if metric.name == "accuracy" else f"final {metric.name}"),
            ("round_to_target", f"round to {shown}"), ("payload_bytes_to_target", "payload B to target"),
            ("wall_s_to_target", "wall-clock s to target"), ("payload_bytes_total", "payload B total"),
            *[(f"payload_bytes_{c.replace('-', '_')}", f"{CLASS_TITLES[c]} B") for c in LINK_CLASSES]]
    lines = ["| " + " | ".join(t for _, t in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [_fmt(r[k]) if k != final or r[k] is not None else "(no evaluation)" for k, _ in cols]
        lines.append("| " + " | ".join(cells) + " |")
    side = "at or above" if metric.goal == "max" else "at or below"
    notes = [f"Target {metric.name} {shown}: first evaluated round {side} it; payload bytes are cumulative up "
             "to and including that round; wall-clock is the seconds since the run's first round started "
             "(rounds.csv elapsed_s). Link-class columns: payload bytes of the whole run, both directions."]
    cut = [r["run"] for r in rows if r["interrupted"]]
    if cut:
        notes.append(f"Interrupted runs (rounds done only): {', '.join(cut)}.")
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def plot(runs: list[Run], target: float, path: Path, metric: Metric = ACCURACY, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), sharey=True)
    for run in runs:
        ev = run.evaluated
        ys = [float(r[metric.name]) for r in ev]
        if metric.log_y:  # exact zeros (a converged error) at the bottom of the log axis
            ys = [max(y, 1e-300) for y in ys]
        label = f"{run.label} ({run.algorithm})"
        axes[0].plot([r["round"] for r in ev], ys, marker=".", label=label)
        axes[1].plot([r["cum_payload_bytes"] / 1e6 for r in ev], ys, marker=".", label=label)
        axes[2].plot([r["elapsed_s"] for r in ev], ys, marker=".", label=label)
    for ax, xlabel in zip(axes, ("round", "cumulative payload (MB)", "wall-clock since round 1 started (s)"),
                          strict=True):
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if metric.log_y:
            ax.set_yscale("log")
    axes[0].set_ylabel("test accuracy" if metric.name == "accuracy" else metric.name)
    axes[0].legend(fontsize=8)
    fig.suptitle(title or f"fedhop compare: {len(runs)} runs, target {metric.name} {target:.4g} (dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_timeline(folders: list[Path], labels: list[str], path: Path) -> list[str]:
    """``timeline.png``: one panel per run, each round's seconds per phase (summed over nodes and links,
    stacked bars) and the PS's round duration (a line). Returns the labels of runs without ``timeline.csv``
    (written by an older fedhop), whose panels say so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedhop.common.timeline import PHASES, per_round, read_csv

    fig, axes = plt.subplots(1, len(folders), figsize=(5 * len(folders), 4), squeeze=False)
    lacking = []
    for ax, folder, label in zip(axes[0], folders, labels, strict=True):
        ax.set_title(label, fontsize=9)
        f = folder / "timeline.csv"
        if not f.is_file():
            lacking.append(label)
            ax.text(0.5, 0.5, "no timeline.csv", ha="center", va="center", transform=ax.transAxes)
            continue
        rows = read_csv(f)
        by_round = per_round(rows, first=1)
        xs = list(by_round)
        bottom = [0.0] * len(xs)
        for phase in PHASES:
            ys = [by_round[t][phase] for t in xs]
            ax.bar(xs, ys, bottom=bottom, label=phase)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
        dur = {r["round"]: r["seconds"] for r in rows if r["phase"] == "round" and r["round"] >= 1}
        ax.plot(sorted(dur), [dur[t] for t in sorted(dur)], color="black", marker=".", label="round (PS)")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("seconds (summed over nodes and links)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("where each round's time went (timeline.csv)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return lacking


def compare(folders: list[Path], out: Path, target: float | None = None, metric: Metric = ACCURACY,
            labels: list[str] | None = None, title: str = "", timeline: bool = False) -> str:
    """Write compare.png, table.md and table.csv into ``out``; returns the markdown table. ``target``: of
    ``metric`` (default: the worst final value among the runs, so every run reaches it); ``labels``: the runs'
    names in the figure and table (default: the folder names); ``timeline``: also ``timeline.png``
    (:func:`plot_timeline`)."""
    runs = [load_run(f) for f in folders]
    names = labels if labels is not None else _labels(folders)
    if len(names) != len(runs):
        raise ValueError(f"{len(names)} labels for {len(runs)} runs")
    for run, label in zip(runs, names, strict=True):
        run.label, run.metric = label, metric
    finals = [r.final for r in runs if r.final is not None]
    if target is None:
        if not finals:
            raise Fatal(ExitCode.USAGE, f"no run evaluated its {metric.name}; nothing to compare against a target")
        target = min(finals) if metric.goal == "max" else max(finals)
    elif metric.name == "accuracy" and not 0.0 <= target <= 1.0:
        raise Fatal(ExitCode.USAGE, f"--target-accuracy must be in [0, 1], got {target}")
    rows = table_rows(runs, target)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(rows, target, metric)
    (out / "table.md").write_text(md + "\n")
    with (out / "table.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    plot(runs, target, out / "compare.png", metric, title)
    if timeline:
        plot_timeline(list(folders), names, out / "timeline.png")
    return md
