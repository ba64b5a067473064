"""The PS checkpoint's byte-meter rows, one file per round, written when the round's rows change.

A run checkpoint used to carry every meter row in its state tree: at 10,000 clients that is ~5 rows per client
and round, walked node by node at each checkpoint (issue 19: 12 s of a 17 s commit after 2 rounds, and growing
with every round). Now the rows live beside the checkpoints, in ``<store>/meter/``: one JSON file per round, named
by the round and its content's xxh3-64 digest (``rows_<round>_<digest>.json``), written atomically (fsynced,
renamed) and never changed. A checkpoint's meta lists the files that hold its meter (``meter_files``); the rows
of a round not changed since the last checkpoint are the same file, so a checkpoint writes the rounds that
changed (the last one, and an older one a late reply or a rollback's relabelling touched) and nothing else.

Reading a checkpoint back (:func:`fedhop.common.engine.run_checkpoint.load_latest`) reads its files, checks
each against its digest, and gives the rows in the meter's order, as the checkpoint's ``meter``: what resuming
restores is the same. After each save, files that no checkpoint in the store lists any more are removed (a
crash between a file and its checkpoint leaves one such file; the next save removes it). A checkpoint without
``meter_files`` (written before) carries its rows inline and is read as before.
"""

from __future__ import annotations

import json
import re
from typing import Any

import xxhash

from fedhop.common import atomic_files
from fedhop.common.engine.checkpoint import CheckpointError, CheckpointStore, read_meta
from fedhop.common.wire.meter import ByteMeter

FOLDER = "meter"
META_KEY = "meter_files"
_NAME = re.compile(r"^rows_(-?\d+)_([0-9a-f]{16})\.json$")
ROW_ORDER = ("src", "dst", "kind", "phase", "round")


class MeterFiles:
    """Writes one meter's rows for a store's checkpoints: the rounds changed since the last write, each as one
    file; remembers each round's version and file, so an unchanged round costs nothing."""

    def __init__(self, meter: ByteMeter) -> None:
        self.meter = meter
        self._written: dict[int, tuple[int, str]] = {}  # round -> (meter's version of it, its file's name)

    def write(self, store: CheckpointStore) -> list[str]:
        """Write the rounds changed since the last call into ``store``'s meter folder; returns every round's
        file name, in round order (what the checkpoint lists)."""
        folder = store.folder / FOLDER
        changed = self.meter.changed_rounds({r: v for r, (v, _) in self._written.items()})
        if changed:
            folder.mkdir(parents=True, exist_ok=True)
        for r, (version, rows) in sorted(changed.items()):
            if not rows:
                self._written.pop(r, None)
                continue
            body = json.dumps(rows, separators=(",", ":")).encode()
            name = f"rows_{r}_{xxhash.xxh3_64_intdigest(body):016x}.json"
            if not (folder / name).exists():  # content-addressed: an existing file holds these very bytes
                atomic_files.write_bytes(folder / name, body)  # synced, renamed, the folder synced
            self._written[r] = (version, name)  # only once the file is there
        return [name for _, (_, name) in sorted(self._written.items())]


def read_rows(store: CheckpointStore, names: list[str]) -> list[dict[str, Any]]:
    """The rows the files ``names`` hold, in the meter's order; :class:`CheckpointError` naming a file that is
    missing, unreadable or not what its name's digest says."""
    folder = store.folder / FOLDER
    rows: list[dict[str, Any]] = []
    for name in names:
        m = _NAME.match(name)
        if m is None:
            raise CheckpointError(f"meter file name {name!r} is not rows_<round>_<digest>.json")
        path = folder / name
        try:
            body = path.read_bytes()
        except OSError as e:
            raise CheckpointError(f"meter file {path}: {e.strerror or e}") from None
        if f"{xxhash.xxh3_64_intdigest(body):016x}" != m.group(2):
            raise CheckpointError(f"meter file {path} fails its checksum")
        got = json.loads(body)
        if not isinstance(got, list) or not all(isinstance(r, dict) and r.get("round") == int(m.group(1))
                                                for r in got):
            raise CheckpointError(f"meter file {path} does not hold round {m.group(1)}'s rows")
        rows.extend(got)
    rows.sort(key=lambda r: tuple(r[k] for k in ROW_ORDER))
    return rows


def prune(store: CheckpointStore) -> None:
    """Remove the meter files no checkpoint in ``store`` lists (a checkpoint that cannot be read keeps every
    file: it may be read again later, or fall back to one that lists them)."""
    folder = store.folder / FOLDER
    if not folder.is_dir():
        return
    listed: set[str] = set()
    for tag in store.tags():
        try:
            meta = read_meta(store.path(tag))
        except CheckpointError:
            return
        listed.update(meta.get(META_KEY) or [])
    for p in folder.iterdir():
        if _NAME.match(p.name) and p.name not in listed:
            p.unlink(missing_ok=True)
