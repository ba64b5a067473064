"""Run folders as a collection (issue 18): what ``fedhop ls``, ``fedhop show`` and ``fedhop ui`` read.

A run folder is the database, as a TensorBoard log folder is: nothing but its files is read, so a folder copied
from another machine reads the same. The files (``common/engine/results.py`` writes the first ones):

    results.json   the end of a run: spec, engine, wall_s, interrupted, rounds (with cumulative bytes), links
                   (meter rows, 1-based rounds, 0 = set-up and tear-down), missing, totals
    rounds.jsonl   the journal: one line per round as it ends (a run in progress, or one that died, has only this)
    timeline.csv   where each round's time went (common/timeline.py)
    live.json      the process running it (:class:`LiveMarker`, written by ``fedhop simulate`` / ``launch`` /
                   ``server``): pid, host, the live page's URL, run id, spec, bytes so far, and how it ended

A folder is a run when it holds ``results.json``, ``rounds.jsonl`` or ``live.json``; :func:`find_runs` looks
for them below a folder of runs (``runs/`` by default), not inside a run folder.

The status of a run (:func:`run_status`; ``ls`` prints the reason with ``--json``):

1. ``results.json`` is there: ``interrupted`` when it says so (Ctrl-C: the rounds done, no final model);
   ``failed`` when ``live.json`` says the run ended with an error, or (without ``live.json``) its rounds stop
   before the spec's last one; else ``finished``. Unless ``live.json``'s process is alive and started after
   ``results.json`` was written: ``launch --resume`` goes on with the run, ``running``, read from its journal.
2. No ``results.json``, and a process holds the folder's lock (``.fedhop.lock``, an exclusive flock, where
   the command takes one): ``running``. Else, with a ``live.json`` written on this host: ``running`` while
   its process is alive (the pid exists and started when the marker says: a reused pid is not taken for the
   run); once the process is gone, ``failed`` (killed, crashed, or its results could not be written).
3. Neither (a folder from an older fedhop, or a PS on another machine writing a shared folder): ``running`` if
   its journal, checkpoints or logs changed within :data:`STALE_S` seconds (or three times its slowest round
   so far, if longer); else ``failed``.

Torch-free and web-free: the command line (``fedhop ls`` / ``show``) and the web face (``server/web/browse.py``)
both read through it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("fedhop.browse")

MARKER = "live.json"
LOCK_FILE = ".fedhop.lock"  # the run folder's lock, where the command running it takes one (an exclusive flock)
RESULTS = "results.json"
JOURNAL = "rounds.jsonl"
TIMELINE = "timeline.csv"
RUN_FILES = (RESULTS, JOURNAL, MARKER)  # any of them makes a folder a run
STALE_S = 120.0  # rule 3: a folder without a live.json is running if it changed this recently
MARKER_EVERY_S = 2.0  # live.json's bytes so far are rewritten at most this often
SKIP_DIRS = {"checkpoints", "logs", "state", "tls", "__pycache__"}
STATUSES = ("finished", "running", "failed", "interrupted")
_STAMP = re.compile(r"^(\d{8}-\d{6})-")


class RunNotFound(LookupError):
    """A name or path that is no run folder (the message says where it looked and what is there)."""


# -- the process marker (live.json) ---------------------------------------------------------------------------

def _proc_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None off Linux or if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def lock_holder(folder: Path) -> int | None:
    """The pid holding an exclusive flock on ``folder``'s :data:`LOCK_FILE` (Linux: read from /proc/locks, so
    looking never takes the lock itself: a run starting now is not refused because of us); None when there is no
    lock file, nobody holds it, or this cannot be told."""
    try:
        st = (folder / LOCK_FILE).stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in table.splitlines():
        parts = line.split()  # "4: FLOCK  ADVISORY  WRITE 32674 fe:00:1549645 0 EOF"; waiters have a "->"
        if len(parts) < 6 or parts[1] != "FLOCK" or parts[3] != "WRITE" or "->" in parts:
            continue
        dev = parts[5].split(":")
        try:
            if len(dev) == 3 and int(dev[2]) == st.st_ino and \
                    os.makedev(int(dev[0], 16), int(dev[1], 16)) == st.st_dev:
                return int(parts[4])
        except ValueError:
            continue
    return None


def process_alive(pid: int, started: int | None) -> bool:
    """Whether process ``pid`` runs, and is the one that started at ``started`` (see :func:`_proc_start`)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    now = _proc_start(pid)
    return started is None or now is None or now == started


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


class LiveMarker:
    """A run's event listener that keeps ``live.json`` in its folder: the process (pid, its start, host), the
    live page's URL (None without ``--http``; never the token), and from the events the run id, spec, the
    bytes so far and how it ended. Written when made, at ``run_started``, at most every
    :data:`MARKER_EVERY_S` on ``links`` and at ``run_finished``; a write that fails is logged once and the run
    goes on."""

    def __init__(self, folder: Path, *, url: str | None = None, engine: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(folder) / MARKER
        self._clock = clock
        pid = os.getpid()
        self.data: dict[str, Any] = {"pid": pid, "proc_start": _proc_start(pid), "host": socket.gethostname(),
                                     "url": url, "engine": engine, "started": clock(), "run_id": None,
                                     "spec": None, "totals": None, "ended": None, "ok": None, "error": None}
        self._links: Mapping[str, Any] | None = None  # the last links event's data
        self._written = 0.0
        self._broken = False
        self.write()

    def write(self) -> None:
        if self._broken:
            return
        if self._links is not None:  # the Run's totals (the meter's running sums), else summed from the rows
            given = self._links.get("totals")
            self.data["totals"] = {k: int(given[k]) if given is not None else
                                   sum(int(r.get(k) or 0) for r in self._links["rows"])
                                   for k in ("messages", "payload_bytes", "message_bytes")}
        try:
            _write_json(self.path, self.data)
        except OSError as e:
            self._broken = True
            log.info("cannot write %s (%s); fedhop ls will infer this run's status", self.path,
                        e.strerror or e)
        self._written = self._clock()

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "run_started":
            self.data.update(run_id=data.get("run_id"), spec=data.get("spec"))
            self.write()
        elif kind == "links":
            self._links = data
            if self._clock() - self._written >= MARKER_EVERY_S:
                self.write()
        elif kind == "run_finished":
            self.data.update(ended=self._clock(), ok=bool(data.get("ok", True)), error=data.get("error"))
            self.write()


def read_marker(folder: Path) -> dict[str, Any] | None:
    """``live.json``'s content, or None (absent or unreadable)."""
    try:
        out = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


# -- reading a folder -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunInfo:
    """One line of ``fedhop ls``: what a run folder says about its run."""

    name: str  # the folder, relative to the folder of runs
    path: str
    status: str  # one of STATUSES
    why: str  # how the status was decided (the rule of the module docstring)
    algorithm: str | None
    engine: str | None
    spec_name: str | None
    rounds_done: int
    rounds_total: int | None
    accuracy: float | None  # the last evaluated round's
    loss: float | None
    payload_bytes: int | None
    message_bytes: int | None
    duration_s: float | None  # the driver's wall-clock (results.json's wall_s); so far, for a running run
    started: float | None  # epoch seconds
    run_id: str | None
    url: str | None  # the PS's live page while the run is running (live.json), else None
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunFolder:
    """Everything a run folder holds that ``show`` and the web face present."""

    info: RunInfo
    spec: dict[str, Any] | None
    rounds: list[dict[str, Any]]  # round records (1-based "round"), with cum_* bytes when the run ended
    links: list[dict[str, Any]]  # meter rows, the files' 1-based rounds (0 = set-up / tear-down); [] while running
    missing: list[dict[str, Any]]
    timeline: list[dict[str, Any]] = field(default_factory=list)  # timeline.csv's rows (1-based rounds)
    marker: dict[str, Any] | None = None


def is_run_folder(folder: Path) -> bool:
    return any((folder / f).is_file() for f in RUN_FILES)


def files_signature(folder: Path) -> tuple[Any, ...]:
    """(mtime, size) of the files a run's view is read from: changes when the run writes any of them."""
    out = []
    for name in (RESULTS, JOURNAL, MARKER, TIMELINE):
        try:
            st = (folder / name).stat()
            out.append((name, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((name, None, None))
    return tuple(out)


def find_runs(root: Path, max_depth: int = 4) -> list[Path]:
    """The run folders below ``root`` (``root`` itself when it is one), by name; a run folder is not searched
    further, nor are checkpoints/, logs/ and state/ folders."""
    root = Path(root)
    if is_run_folder(root):
        return [root]
    out: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        try:
            subs = sorted(p for p in d.iterdir() if p.is_dir() and p.name not in SKIP_DIRS
                          and not p.name.startswith("."))
        except OSError:
            return
        for p in subs:
            if is_run_folder(p):
                out.append(p)
            elif depth < max_depth:
                walk(p, depth + 1)

    walk(root, 1)
    return out


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("cannot read %s: %s", path, e)
        return None


def read_journal(path: Path) -> list[dict[str, Any]]:
    """``rounds.jsonl``'s records; a last line cut short by a crash (or being written) is skipped."""
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and "round" in rec:
                out.append(rec)
    return out


def _last(rounds: Iterable[Mapping[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rounds if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return float(vals[-1]) if vals else None


def _started(folder: Path, marker: Mapping[str, Any] | None, results: Mapping[str, Any] | None) -> float | None:
    if marker and isinstance(marker.get("started"), (int, float)):
        return float(marker["started"])
    prov = (results or {}).get("provenance")
    if isinstance(prov, dict) and isinstance(prov.get("started"), (int, float)):
        return float(prov["started"])
    m = _STAMP.match(folder.name)
    if m:
        with contextlib.suppress(ValueError):
            return time.mktime(time.strptime(m.group(1), "%Y%m%d-%H%M%S"))
    return None


def _newest_change(folder: Path) -> float | None:
    """The newest mtime among the journal, the marker, checkpoints/ and logs/ (and their files)."""
    paths = [folder / JOURNAL, folder / MARKER, folder]
    for sub in ("checkpoints", "logs"):
        d = folder / sub
        if d.is_dir():
            paths.append(d)
            with contextlib.suppress(OSError):
                paths.extend(p for p in d.rglob("*") if p.is_file())
    times = []
    for p in paths:
        with contextlib.suppress(OSError):
            times.append(p.stat().st_mtime)
    return max(times) if times else None


def _resumed(folder: Path, marker: Mapping[str, Any] | None, host: str) -> bool:
    """A live process on this host started after results.json was written: ``launch --resume`` goes on with an
    interrupted run (its old results.json stays until the run writes the new one)."""
    if marker is None or marker.get("host") != host or not isinstance(marker.get("pid"), int):
        return False
    try:
        written = (folder / RESULTS).stat().st_mtime
    except OSError:
        return False
    started = marker.get("started")
    return (isinstance(started, (int, float)) and started > written and marker.get("ended") is None
            and process_alive(marker["pid"], marker.get("proc_start")))


def run_status(folder: Path, results: Mapping[str, Any] | None, marker: Mapping[str, Any] | None,
               rounds: list[dict[str, Any]], rounds_total: int | None, *, now: float | None = None,
               host: str | None = None) -> tuple[str, str]:
    """(status, why): the rule of this module's docstring."""
    now = time.time() if now is None else now
    host = socket.gethostname() if host is None else host
    done = max((int(r["round"]) for r in rounds), default=0)
    holder = lock_holder(folder)
    if holder is not None and (results is None or _resumed(folder, marker, host)):
        return "running", f"process {holder} holds its lock ({LOCK_FILE})"
    if results is not None and _resumed(folder, marker, host):
        pid = (marker or {}).get("pid")
        return "running", f"its process (pid {pid}) is alive and started after results.json was written (resumed)"
    if results is not None:
        if results.get("interrupted"):
            return "interrupted", "results.json says interrupted (stopped before the last round)"
        if marker is not None and marker.get("ok") is False:
            return "failed", f"live.json: the run ended with an error: {marker.get('error') or 'unknown'}"
        if marker is None and rounds_total is not None and done < rounds_total:
            return "failed", f"results.json has rounds up to {done} of {rounds_total}"
        return "finished", "results.json written"
    if marker is not None and marker.get("host") == host and isinstance(marker.get("pid"), int):
        if process_alive(marker["pid"], marker.get("proc_start")):
            return "running", f"no results.json yet; its process (pid {marker['pid']}) is alive"
        if marker.get("ended") is not None and marker.get("ok") is False:
            return "failed", f"the run ended with an error: {marker.get('error') or 'unknown'}; no results.json"
        return "failed", f"no results.json and its process (pid {marker['pid']}) is gone"
    changed = _newest_change(folder)
    slowest = max((float(r.get("round_s") or 0.0) for r in rounds), default=0.0)
    window = max(STALE_S, 3 * slowest)
    if changed is not None and now - changed <= window:
        return "running", f"no results.json; its files changed {now - changed:.0f}s ago (within {window:.0f}s)"
    return "failed", "no results.json and its files have not changed for " + (
        f"{now - changed:.0f}s" if changed is not None else "long")


def read_folder(folder: Path, root: Path | None = None, *, now: float | None = None) -> RunFolder:
    """Read one run folder (``root``: the folder of runs its name is relative to)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunNotFound(f"{folder} is not a folder")
    if not is_run_folder(folder):
        raise RunNotFound(f"{folder} is not a run folder (none of {', '.join(RUN_FILES)} in it)")
    results = _read_json(folder / RESULTS)
    results = results if isinstance(results, dict) else None
    marker = read_marker(folder)
    spec = (results or {}).get("spec") or (marker or {}).get("spec")
    spec = spec if isinstance(spec, dict) else None
    if results is not None and isinstance(results.get("rounds"), list):
        rounds = [r for r in results["rounds"] if isinstance(r, dict)]
    else:
        rounds = read_journal(folder / JOURNAL)
    rounds_total = int(spec["rounds"]) if spec and isinstance(spec.get("rounds"), int) else None
    status, why = run_status(folder, results, marker, rounds, rounds_total, now=now)
    if status == "running" and results is not None:  # resumed: the old results.json is not this run's
        results = None
        rounds = read_journal(folder / JOURNAL)
    links = list((results or {}).get("links") or [])
    missing = list((results or {}).get("missing") or [])
    totals = (results or {}).get("totals") or (marker or {}).get("totals") or None
    if totals is None and links:
        totals = {k: sum(int(r.get(k) or 0) for r in links) for k in ("payload_bytes", "message_bytes")}
    done = max((int(r["round"]) for r in rounds), default=0)
    if status == "finished" and rounds_total is not None:
        done = rounds_total  # a round that reported nothing is no line of the journal
    duration: float | None = None
    if results is not None and isinstance(results.get("wall_s"), (int, float)):
        duration = float(results["wall_s"])
    elif status == "running" and marker is not None and isinstance(marker.get("started"), (int, float)):
        duration = (time.time() if now is None else now) - float(marker["started"])
    elif rounds:
        duration = float(rounds[-1].get("elapsed_s") or 0.0) or None
    alg = spec.get("algorithm") if spec else None
    name = folder.name
    if root is not None:
        with contextlib.suppress(ValueError):
            name = folder.resolve().relative_to(Path(root).resolve()).as_posix() or folder.name
        if name == ".":
            name = folder.name
    info = RunInfo(
        name=name, path=str(folder), status=status, why=why,
        algorithm=alg.get("name") if isinstance(alg, dict) else None,
        engine=(results or {}).get("engine") or (marker or {}).get("engine"),
        spec_name=spec.get("name") if spec else None,
        rounds_done=done, rounds_total=rounds_total,
        accuracy=_last(rounds, "accuracy"), loss=_last(rounds, "loss"),
        payload_bytes=int(totals["payload_bytes"]) if totals and "payload_bytes" in totals else None,
        message_bytes=int(totals["message_bytes"]) if totals and "message_bytes" in totals else None,
        duration_s=duration, started=_started(folder, marker, results),
        run_id=(marker or {}).get("run_id"),
        url=(marker or {}).get("url") if status == "running" else None,
        error=(marker or {}).get("error"),
    )
    timeline: list[dict[str, Any]] = []
    if (folder / TIMELINE).is_file():
        from fedhop.common.timeline import read_csv

        try:
            timeline = read_csv(folder / TIMELINE)
        except (OSError, ValueError, KeyError) as e:
            log.warning("cannot read %s: %s", folder / TIMELINE, e)
    return RunFolder(info=info, spec=spec, rounds=rounds, links=links, missing=missing, timeline=timeline,
                     marker=marker)


def list_runs(root: Path, *, now: float | None = None) -> list[RunInfo]:
    """Every run below ``root``, oldest first (by start time, then name). Raises :class:`RunNotFound` when
    ``root`` is not a folder."""
    root = Path(root)
    if not root.is_dir():
        raise RunNotFound(f"{root} is not a folder of runs (runs are written to runs/ unless --out says "
                          "otherwise)")
    infos = []
    for f in find_runs(root):
        try:
            infos.append(read_folder(f, root, now=now).info)
        except RunNotFound:  # removed while we looked
            continue
    return sorted(infos, key=lambda i: (i.started if i.started is not None else math.inf, i.name))


def resolve_run(text: str, root: Path) -> Path:
    """The run folder ``text`` names: a path to one, or a name (or a unique part of one) under ``root``."""
    p = Path(text)
    if p.is_dir() and is_run_folder(p):
        return p
    if p.is_dir():
        raise RunNotFound(f"{p} is not a run folder (none of {', '.join(RUN_FILES)} in it)")
    if Path(root).is_dir():
        runs = find_runs(Path(root))
        names = {f.relative_to(root).as_posix() if f != Path(root) else f.name: f for f in runs}
        if text in names:
            return names[text]
        hits = [n for n in names if text in n]
        if len(hits) == 1:
            return names[hits[0]]
        if len(hits) > 1:
            shown = ", ".join(hits[:5]) + (f" and {len(hits) - 5} more" if len(hits) > 5 else "")
            raise RunNotFound(f"{text!r} matches {len(hits)} runs under {root}: {shown}")
    raise RunNotFound(f"no run folder {text!r} (neither a path nor a run under {root}; `fedhop ls {root}` lists "
                      "them)")


# -- formatting -------------------------------------------------------------------------------------------------

def fmt_bytes(n: float | None) -> str:
    """Bytes with a decimal unit, as the live page shows them: 950 B, 1.23 kB, 45.6 MB."""
    if n is None:
        return "–"
    units = ("B", "kB", "MB", "GB", "TB", "PB")
    i, x = 0, float(n)
    while abs(x) >= 1000 and i < len(units) - 1:
        x /= 1000
        i += 1
    return f"{int(x)} B" if i == 0 else f"{x:.3g} {units[i]}" if x < 100 else f"{x:.0f} {units[i]}"


def fmt_duration(s: float | None) -> str:
    """12.3s, 4m 05s, 2h 03m."""
    if s is None or not math.isfinite(s):
        return "–"
    if s < 60:
        return f"{s:.1f}s"
    s = int(round(s))
    h, m, sec = s // 3600, (s % 3600) // 60, s % 60
    return f"{h}h {m:02d}m" if h else f"{m}m {sec:02d}s"
