"""Run results: per-round metrics with cumulative bytes, per-link byte table, who was missing.

``links.csv`` has the three byte levels: ``payload_bytes`` and ``message_bytes`` per message kind, and the wire
level in rows of kind ``wire`` (``wire_bytes``, ``wire_segments``, ``wire_retrans``; networked engine only).

Rounds are numbered from 1 in every file of a run folder (``rounds.*``, ``links.csv``, ``missing.csv``,
``results.json``); in ``links.csv`` round 0 holds the messages of set-up and tear-down (e.g. collecting the
final model). In memory, :attr:`RunResult.links` keeps the byte meter's driver rounds (0-based, -1 for set-up);
:func:`file_links` converts. Per-round wall-clock columns (``elapsed_s``: seconds since the driver started,
``round_s``: that round's own duration) are metadata, read beside the math, never in it.
"""

from __future__ import annotations

import csv
import errno
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

from fedhop.common import atomic_files, provenance, run_lock
from fedhop.common import timeline as timelines
from fedhop.common.engine.spill import spill_bytes, spill_state
from fedhop.common.spec import RunSpec
from fedhop.common.wire.bundle import Bundle


@dataclass
class RoundRecorder:
    """The driver's ``ctx.report``: keeps each round's metrics (bytes are attached when the run ends).

    With ``journal``, every round is also appended to that JSON-lines file as it is reported, so a run that
    dies keeps the metrics of the rounds it finished. Progress displays do not watch the recorder: they
    subscribe to the run's events (``round_ended`` carries the round's record; ``common/engine/run.py``).
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    journal: Path | None = None
    started: float = field(default_factory=time.perf_counter)  # the driver's start (perf_counter seconds)

    def __post_init__(self) -> None:
        if self.journal is not None:  # a resumed run starts its journal over from the rounds it restored
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            atomic_files.write_text(self.journal, "".join(json.dumps(r) + "\n" for r in self.records))
        if self.records:  # resumed: the clock goes on from the last restored round
            self.started -= float(self.records[-1].get("elapsed_s", 0.0))
        self._last = self.started

    def __call__(self, round_idx: int, metrics: Mapping[str, Any]) -> None:
        now = time.perf_counter()
        rec = {"round": round_idx + 1, **{k: _plain(v) for k, v in metrics.items()},
               "elapsed_s": round(now - self.started, 6), "round_s": round(now - self._last, 6)}
        self._last = now
        self.records.append(rec)
        if self.journal is not None:
            try:
                with self.journal.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
            except OSError as e:  # a full or read-only disk must not stop training; say so once
                logging.getLogger("fedhop.results").error(
                    "round %d could not be added to %s (%s); the journal stops here, the run goes on",
                    rec["round"], self.journal, e.strerror or e)
                self.journal = None


    def discard(self, round_idx: int) -> None:
        """Forget what a round that is being redone reported (the engine retries a round with too few usable
        replies from its starting state): only the attempt that stands is a round of the run. The journal is
        rewritten without it, and the next record's ``round_s`` counts from the last kept round."""
        kept = [r for r in self.records if r["round"] != round_idx + 1]
        if len(kept) == len(self.records):
            return
        self.records[:] = kept
        self._last = self.started + float(kept[-1].get("elapsed_s", 0.0)) if kept else self.started
        if self.journal is not None:
            try:
                atomic_files.write_text(self.journal, "".join(json.dumps(r) + "\n" for r in self.records))
            except OSError:
                self.journal = None  # the next append reports the problem (as in __call__)


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    return v


@dataclass
class RunResult:
    spec: RunSpec
    engine: str
    rounds: list[dict[str, Any]]
    links: list[dict[str, Any]]
    missing: list[dict[str, Any]]
    final: Bundle
    wall_s: float  # the driver's time: from round 1's start to the final model
    interrupted: bool = False  # stopped (Ctrl-C) before the last round: the rounds done, no final model
    timeline: list[dict[str, Any]] = field(default_factory=list)  # timeline.csv's rows (common/timeline.py)
    started_at: float | None = None  # when this process started the run (epoch seconds; provenance)
    resumed_at: int = 0  # the 0-based round a resumed run continued at (0: a fresh run)

    def payload_by_link(self, kinds: set[str] | None = None) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for r in self.links:
            if kinds is None or r["kind"] in kinds:
                out[(r["src"], r["dst"])] = out.get((r["src"], r["dst"]), 0) + r["payload_bytes"]
        return out

    def to_json(self) -> dict[str, Any]:
        """results.json's content (:func:`write_json` writes it without this copy of every row)."""
        return {**self._head(), "links": file_links(self.links), **self._tail()}

    def _head(self) -> dict[str, Any]:
        return {"spec": self.spec.model_dump(mode="json"), "engine": self.engine, "wall_s": self.wall_s,
                "interrupted": self.interrupted, "rounds": self.rounds}

    def _tail(self) -> dict[str, Any]:
        return {"missing": self.missing, "totals": totals(self.links)}

    def write_json(self, path: Path, **extra: Any) -> None:
        """results.json (:meth:`to_json` and ``extra``) into ``path``, the link rows one per line as they are
        converted: no copy of every row and no whole text in memory (a run with many clients and rounds has
        hundreds of thousands of rows; the PS's peak at its end, issue 19)."""
        def entry(k: str, v: Any) -> str:  # one top-level entry as json.dumps(indent=1) of the whole writes it
            return f" {json.dumps(k)}: {json.dumps(v, indent=1).replace(chr(10), chr(10) + ' ')},\n"

        with path.open("w") as f:
            f.write("{\n" + "".join(entry(k, v) for k, v in self._head().items()) + ' "links": [')
            row_sep = "\n  "
            for r in self.links:
                f.write(row_sep + json.dumps(file_link(r)))
                row_sep = ",\n  "
            tail = "".join(entry(k, v) for k, v in {**self._tail(), **extra}.items())
            f.write(("\n ]" if self.links else "]") + ",\n" + tail.removesuffix(",\n") + "\n}")


def totals(links: list[dict[str, Any]]) -> dict[str, int]:
    """Messages, payload and message bytes of every row; ``wire_bytes`` too where there is a wire level (the
    networked engine's wire rows; as the live page's ``/api`` totals do)."""
    out = {k: sum(r[k] for r in links) for k in ("messages", "payload_bytes", "message_bytes")}
    if any("wire_bytes" in r for r in links):
        out["wire_bytes"] = sum(r.get("wire_bytes", 0) for r in links)
    return out


def file_link(row: dict[str, Any]) -> dict[str, Any]:
    """A meter row with the files' round number: 1-based like ``rounds.csv``; 0 = set-up and tear-down."""
    return {**row, "round": row["round"] + 1}


def file_links(links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Meter rows with the files' round numbers (:func:`file_link`)."""
    return [file_link(r) for r in links]


def attach_cumulative_bytes(records: list[dict[str, Any]], links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each round record gets ``cum_payload_bytes`` / ``cum_message_bytes``: the bytes of every message sent up
    to and including that round (set-up included). One pass over the rows, summed per round first: a pass per
    record was rounds x rows at the end of a long run (issue 19: ~5 rows per client and round)."""
    per_round: dict[int, list[int]] = {}
    for r in links:
        acc = per_round.setdefault(r["round"], [0, 0])
        acc[0] += r["payload_bytes"]
        acc[1] += r["message_bytes"]
    out = []
    for rec in records:
        upto = rec["round"] - 1
        sums = [v for t, v in per_round.items() if t <= upto]
        out.append({**rec, "cum_payload_bytes": sum(v[0] for v in sums), "cum_message_bytes": sum(v[1] for v in sums)})
    return out


# links.csv: one row per (src, dst, kind, phase, round). The wire columns are filled on the networked engine's
# wire rows only (kind "wire", phase "tcp": the kernel's TCP counters of the link in that round, WIRE_KIND in
# common/wire/meter.py); every other row leaves them empty, as does the in-process engine, which has no wire.
LINKS_HEADER = ["src", "dst", "kind", "phase", "round", "messages", "payload_bytes", "message_bytes",
                "wire_bytes", "wire_segments", "wire_retrans"]

RUN_FILES = ("spec.toml", "results.json", "rounds.csv", "rounds.jsonl", "links.csv", "missing.csv", "model.pt",
             "plots.png")


class RunFolderExists(FileExistsError):
    """``--out`` names a folder that already holds files (and ``--force`` was not given)."""


def prepare_run_folder(folder: Path, force: bool = False) -> Path:
    """Check that ``folder`` may receive a run: refuse a non-empty one unless ``force``, which removes the
    files and checkpoints a run writes there, never anything else (logs of processes already running in it,
    e.g. those ``fedhop testbed up`` started, are kept)."""
    if folder.exists() and not folder.is_dir():
        raise RunFolderExists(f"--out {folder} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        run_lock.check_free(folder)  # a run another process is running: say whose (and never remove its files)
        if not force:
            raise RunFolderExists(f"run folder {folder} already exists and is not empty; choose another --out, "
                                  "add --force to overwrite its run files, or continue a run in it with --resume")
        for name in RUN_FILES:
            (folder / name).unlink(missing_ok=True)
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class RunFolderNotWritten(OSError):
    """Files of the run folder could not be written (a full or read-only disk). Those written stay; the rest
    (the model first among them) went to a folder of their own under ``$TMPDIR`` where it had room.
    ``saved`` says what is where, as the exit message lists it; ``spilled``: that folder; ``lost``: what could be
    written nowhere. ``strerror``: the file system's word for the first failure."""

    def __init__(self, message: str, *, cause: OSError | None = None, spilled: Path | None = None,
                 saved: tuple[str, ...] = (), lost: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        if cause is not None:
            self.errno, self.strerror = cause.errno, cause.strerror or str(cause)
        self.spilled = spilled
        self.saved = saved
        self.lost = lost

    def __str__(self) -> str:
        return str(self.args[0])

    @classmethod
    def of(cls, folder: Path, cause: OSError, spilled: Path | None, moved: list[str],
           lost: list[str]) -> RunFolderNotWritten:
        saved = [f"{', '.join(moved)} in {spilled}"] if spilled is not None and moved else []
        if lost:
            saved.append(f"NOT saved anywhere: {', '.join(lost)}")
        message = (f"the results could not be written to {folder} ({cause.strerror or cause}); saved: "
                   f"{'; '.join(saved) or 'nothing'}")
        return cls(message, cause=cause, spilled=spilled, saved=tuple(saved), lost=tuple(lost))


def write_run_folder(result: RunResult, folder: Path) -> Path:
    """model.pt (not for an interrupted run), spec.toml (the resolved spec: every default filled in),
    rounds.csv, links.csv, missing.csv, timeline.csv, results.json (with the run's ``provenance``,
    common/provenance.py) and plots.png, in that order (the model first: it is what a run is for;
    results.json and plots.png last: together they say the run is on disk, ``fedhop/lifecycle.py``).

    Every file is written whole or not at all (``common/atomic_files.py``): a full disk never truncates one.
    When a file cannot be written, it and every file after it go to a new folder under ``$TMPDIR``
    (``fedhop-<run folder's name>-...``) instead, so that the model and the byte rows are kept and the run
    folder is never taken for a finished one; then :class:`RunFolderNotWritten` says what is where."""
    folder.mkdir(parents=True, exist_ok=True)
    prov = provenance.collect(result.spec, started_at=result.started_at, ended_at=time.time(),
                              resumed_at=result.resumed_at)
    title = f"{result.spec.name}: {result.spec.algorithm.name}"
    writers: list[tuple[str, Callable[[Path], None]]] = []
    if not result.interrupted:
        spill = spill_bytes(result.spec.transport, result.engine)
        writers.append(("model.pt", lambda p: _save_model(result.final, p, spill)))
    writers += [
        ("spec.toml", lambda p: p.write_text(provenance.resolved_spec(result.spec).to_toml())),
        ("rounds.csv", lambda p: _csv(p, result.rounds)),
        ("links.csv", lambda p: _csv(p, map(file_link, result.links), LINKS_HEADER)),
        ("missing.csv", lambda p: _csv(p, result.missing, ["round", "by", "node", "task", "reason"])),
        ("timeline.csv", lambda p: timelines.write_csv(p, result.timeline)),
        ("results.json", lambda p: result.write_json(p, provenance=prov)),
        ("plots.png", lambda p: plot_rounds(result.rounds, p, title=title)),
    ]
    for i, (name, write) in enumerate(writers):
        try:
            with atomic_files.replacing(folder / name) as tmp:
                write(tmp)
        except OSError as e:
            _spill(folder, writers[i:], e)
    return folder


def _save_model(final: Mapping[str, torch.Tensor], path: Path, min_bytes: int = 0) -> None:
    """``torch.save`` straight into the file: no serialized copy in memory (two models of the PS's peak at the
    end of a run, issue 19). torch reports a failed write (a full disk) as a RuntimeError: it becomes the OSError
    the run folder's writing handles (the model then goes to $TMPDIR).

    Once written, a model of at least ``min_bytes`` (``transport.spill_model_bytes``; 0: never) is moved into a
    file mapping whose pages leave memory (``spill.py``): the files after it (plots.png imports matplotlib, ~30
    MiB) are not written beside a resident model, which would make the run's end the PS's peak (issue 19). The
    tensors stay the result's, their bytes read back from the page cache when used."""
    try:
        torch.save({k: v.cpu() for k, v in final.items()}, path)
    except RuntimeError as e:
        raise OSError(errno.EIO, f"torch.save failed: {e}") from e
    spilled = spill_state(dict(final), min_bytes)
    if spilled is not None:
        spilled.drop()


def _spill(folder: Path, writers: list[tuple[str, Callable[[Path], None]]], cause: OSError) -> NoReturn:
    """Write what the run folder could not take into a new folder under $TMPDIR; raise RunFolderNotWritten."""
    log = logging.getLogger("fedhop.results")
    log.error("%s could not be written to %s (%s); it and the files after it go to $TMPDIR", writers[0][0],
              folder, cause.strerror or cause)
    spill: Path | None
    try:
        spill = Path(tempfile.mkdtemp(prefix=f"fedhop-{folder.resolve().name}-"))
    except OSError as e:
        log.error("no folder could be made under %s either (%s)", tempfile.gettempdir(), e.strerror or e)
        spill = None
    moved, lost = [], []
    for name, write in writers:
        if spill is not None:
            try:
                with atomic_files.replacing(spill / name) as tmp:
                    write(tmp)
                moved.append(name)
                continue
            except OSError as e:
                log.error("%s could not be written to %s either (%s)", name, spill, e.strerror or e)
        lost.append(name)
    raise RunFolderNotWritten.of(folder, cause, spill, moved, lost)


def _csv(path: Path, rows: Iterable[dict[str, Any]], header: list[str] | None = None) -> None:
    """``rows`` as CSV; without ``header`` every key of every row (then ``rows`` is read twice: a list)."""
    if header is None:
        rows = list(rows)
    keys = header or list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in keys})


def plot_rounds(rounds: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Accuracy and loss vs round and vs cumulative payload bytes (2x2 grid)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for row, metric in enumerate(("accuracy", "loss")):
        pts = [r for r in rounds if metric in r]
        xs_r = [r["round"] for r in pts]
        xs_b = [r.get("cum_payload_bytes", 0) / 1e6 for r in pts]
        ys = [r[metric] for r in pts]
        axes[row][0].plot(xs_r, ys, marker=".")
        axes[row][0].set_xlabel("round")
        axes[row][1].plot(xs_b, ys, marker=".")
        axes[row][1].set_xlabel("cumulative payload (MB)")
        for ax in axes[row]:
            ax.set_ylabel(f"test {metric}")
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
