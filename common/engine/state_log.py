"""One edge's or client's saved states as an append-only log in its own folder (``--state-dir DIR`` -> ``DIR/<id>/``).

A save appends one record and ``fdatasync`` s the file before it returns (before the node's result is sent, as
:mod:`~fedhop.common.engine.node_store` requires). A checkpoint file per save cost a rename, a folder sync, a
listing and an unlink each time: 0.70 ms a save from a host's 4 task threads against 0.37 ms for an append
(``tests/bench/bench_state_saves.py``, docs/benchmarks.md "A node with nothing to keep writes nothing").

Layout: segments ``state_<seq>.fhlog`` (``seq``: 8 digits, ascending). A record is ``MAGIC``, the kind (``S``: a
state, ``D``: a drop), the tag (signed, 8 bytes), the length of what follows (8 bytes), then for a state the
bytes of a checkpoint file (:func:`~fedhop.common.engine.checkpoint.checkpoint_parts`: its own magic, checksummed
description and checksummed payload), for a drop nothing. Records are read in order (segments by ``seq``, then by
position); for a tag, the newest state record counts; a drop of tag ``T`` cancels every earlier state record whose
tag is ``T`` or later (a rollback, made durable).

Choices (unspecified elsewhere):
- a process never appends to a segment it did not create: it starts a new one at its first save. A crash can
  leave a torn record only at the end of a segment, where reading that segment stops (and says so in the log);
- a segment is closed after :data:`SEGMENT_RECORDS` records or :data:`SEGMENT_BYTES` bytes (a large state gets a
  segment per save, as a checkpoint file per save did). Segments are deleted oldest first, once neither they nor
  any older segment hold a kept state (a newer one may hold a drop that cancels states in an older one);
- the newest ``keep`` tags are kept, plus, with ``keep_before``, the newest one below it and every one from it on
  (what a resume needs): the rule :class:`~fedhop.common.engine.checkpoint.CheckpointStore` applies to files;
- checkpoint files of an older fedhop in the folder (``ckpt_*.fhck``) are read as records older than every
  segment (a run folder from before the log resumes), and deleted like segments once not kept.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhop.common.atomic_files import sync_folder
from fedhop.common.engine.checkpoint import (
    CheckpointError,
    CheckpointStore,
    Loaded,
    checkpoint_parts,
    kept_tags,
    newest_readable,
    part_bytes,
    read_checkpoint,
    read_checkpoint_from,
)

log = logging.getLogger("fedhop.state_log")

MAGIC = b"FHLOG1"
HEAD = len(MAGIC) + 1 + 8 + 8  # magic, kind, tag, length
STATE, DROP = b"S", b"D"
SEGMENT_RECORDS = 64
SEGMENT_BYTES = 16 << 20
SMALL = 1 << 20  # a record below this is written with one system call (joined), a larger one part by part
_SEGMENT = re.compile(r"^state_(\d{8})\.fhlog$")


@dataclass(frozen=True)
class _Record:
    tag: int
    path: Path
    offset: int  # of the checkpoint bytes (0: a whole legacy file)
    length: int
    legacy: bool = False


class StateLog:
    """One node's states in ``folder``: :meth:`save`, :meth:`tags`, :meth:`latest`, :meth:`drop_from` (the
    interface :class:`~fedhop.common.engine.node_store.NodeStore` uses)."""

    def __init__(self, folder: Path, keep: int = 2) -> None:
        self.folder = Path(folder)
        self.keep = max(1, keep)
        self.errors: list[str] = []  # records that could not be read, newest first (for the caller to show)
        self._live: dict[int, _Record] | None = None  # tag -> its newest state record (None: not read yet)
        self._segment: Path | None = None  # the segment this process appends to
        self._records = 0
        self._bytes = 0
        self._legacy: set[Path] = set()  # checkpoint files of an older fedhop still in the folder
        self._oldest_kept: int | None = None  # the oldest segment with a kept state, when segments were last deleted

    # -- reading --------------------------------------------------------------------------------------------------
    def _index(self) -> dict[int, _Record]:
        if self._live is None:
            self._live = self._scan()
        return self._live

    def _segments(self) -> list[tuple[int, Path]]:
        if not self.folder.is_dir():
            return []
        out = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := _SEGMENT.match(p.name))]
        return sorted(out)

    def _scan(self) -> dict[int, _Record]:
        live: dict[int, _Record] = {}
        legacy = CheckpointStore(self.folder)
        for tag in legacy.tags():
            path = legacy.path(tag)
            live[tag] = _Record(tag, path, 0, path.stat().st_size, legacy=True)
            self._legacy.add(path)
        for _, path in self._segments():
            for kind, tag, offset, length in _records(path):
                if kind == DROP:
                    for t in [t for t in live if t >= tag]:
                        del live[t]
                else:
                    live[tag] = _Record(tag, path, offset, length)
        return live

    def tags(self) -> list[int]:
        """Tags with a kept state, ascending."""
        return sorted(self._index())

    def latest(self, below: int | None = None) -> Loaded | None:
        """The newest readable state (with tag < ``below`` when given). Unreadable ones are logged, kept in
        :attr:`errors` and skipped: the previous one is used."""
        live = self._index()

        def read(tag: int) -> Loaded:
            meta, state = _read(live[tag])
            return Loaded(tag, meta, state, live[tag].path)

        return newest_readable(sorted(live), below, read, self.errors)

    # -- writing --------------------------------------------------------------------------------------------------
    def save(self, tag: int, meta: dict[str, Any], state: Any, *, keep_before: int | None = None) -> int:
        """Append tag's state (durable when this returns), then forget what is no longer kept. Returns the bytes
        written."""
        live = self._index()
        parts = checkpoint_parts({**meta, "tag": tag}, state)
        length = sum(part_bytes(p) for p in parts)
        path, offset = self._append(_head(STATE, tag, length), parts, length)
        live[tag] = _Record(tag, path, offset, length)
        self._prune(keep_before)
        return HEAD + length

    def drop_from(self, tag: int) -> None:
        """Forget the states with tag >= ``tag`` (a node rolled back before them), durably."""
        live = self._index()
        if any(t >= tag for t in live):
            self._append(_head(DROP, tag, 0), [], 0)
            for t in [t for t in live if t >= tag]:
                del live[t]
            self._delete_unused()

    def _append(self, head: bytes, parts: list[Any], length: int) -> tuple[Path, int]:
        """Write one record (``head``, then ``parts``: ``length`` bytes) at the end of this process's segment (a new
        one when there is none yet, or when it is full) and sync it; returns the segment and the offset of the
        record's body."""
        new = self._segment is None or self._records >= SEGMENT_RECORDS or self._bytes >= SEGMENT_BYTES
        if new:
            self.folder.mkdir(parents=True, exist_ok=True)
            segs = self._segments()
            self._segment = self.folder / f"state_{(segs[-1][0] + 1) if segs else 0:08d}.fhlog"
            self._records = self._bytes = 0
        assert self._segment is not None
        fd = os.open(self._segment, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if length < SMALL:
                _write_all(fd, b"".join([head, *parts]))  # a small state: one system call
            else:
                for p in (head, *parts):
                    _write_all(fd, p)
            os.fdatasync(fd)
        except BaseException:
            self._segment = None  # a record cut short (a full disk) ends this segment: the next save starts another
            raise
        finally:
            os.close(fd)
        offset = self._bytes + len(head)
        self._records += 1
        self._bytes += len(head) + length
        if new:
            sync_folder(self.folder)  # the new segment's name is durable too
        return self._segment, offset

    def _prune(self, keep_before: int | None) -> None:
        live = self._index()
        tags = sorted(live)
        keep = kept_tags(tags, self.keep, keep_before)
        dropped = [t for t in tags if t not in keep]
        for t in dropped:
            del live[t]
        if dropped:
            self._delete_unused()

    def _delete_unused(self) -> None:
        """Delete the legacy files that hold no kept state, and the segments before the oldest one that does (never
        this process's). Only a prefix of segments goes: a segment may hold a drop that cancels states in the
        segments before it, which must not outlive it. The folder is listed only when that oldest one moved."""
        live = self._index()
        used = {r.path for r in live.values()}
        for path in [p for p in self._legacy if p not in used]:
            path.unlink(missing_ok=True)
            self._legacy.discard(path)
        oldest = min((_seq(r.path) for r in live.values() if not r.legacy), default=None)
        if oldest is not None and oldest == self._oldest_kept:
            return
        self._oldest_kept = oldest
        for seq, path in self._segments():
            if path == self._segment or (oldest is not None and seq >= oldest):
                break
            path.unlink(missing_ok=True)


def _write_all(fd: int, data: Any) -> None:
    """Write all of ``data`` (a short write, e.g. on a full disk, goes on until the system call raises)."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _head(kind: bytes, tag: int, length: int) -> bytes:
    return MAGIC + kind + int(tag).to_bytes(8, "little", signed=True) + int(length).to_bytes(8, "little")


def _seq(path: Path) -> int:
    m = _SEGMENT.match(path.name)
    return int(m.group(1)) if m else -1


def _records(path: Path) -> list[tuple[bytes, int, int, int]]:
    """``(kind, tag, body offset, body length)`` of each whole record of the segment at ``path``, in order; reading
    stops at the first that is not whole (a crash mid-append), and says so."""
    out: list[tuple[bytes, int, int, int]] = []
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            pos = 0
            while pos < size:
                head = f.read(HEAD)
                m = len(MAGIC)
                kind = head[m:m + 1]
                if len(head) < HEAD or head[:m] != MAGIC or kind not in (STATE, DROP):
                    break
                tag = int.from_bytes(head[m + 1:m + 9], "little", signed=True)
                length = int.from_bytes(head[m + 9:], "little")
                if pos + HEAD + length > size:
                    break
                out.append((kind, tag, pos + HEAD, length))
                pos += HEAD + length
                f.seek(pos)
            if pos < size:
                log.warning("state log %s: %d bytes after its last whole record at byte %d are ignored (a save "
                            "cut short)", path, size - pos, pos)
    except OSError as e:
        log.error("state log %s cannot be read: %s", path, e)
    return out


def _read(rec: _Record) -> tuple[dict[str, Any], Any]:
    """A record's state, parsed straight from the segment (no copy of the record in memory: an edge's state can
    be a model); it must end exactly where the record does."""
    if rec.legacy:
        return read_checkpoint(rec.path)
    name = f"{rec.path} (record at byte {rec.offset})"
    try:
        with open(rec.path, "rb") as f:
            f.seek(rec.offset)
            got = read_checkpoint_from(f, name, whole=False)
            end = f.tell()
    except OSError as e:
        raise CheckpointError(f"checkpoint {name}: {type(e).__name__}: {e}") from None
    if end != rec.offset + rec.length:
        raise CheckpointError(f"checkpoint {name}: its checkpoint ends at byte {end}, the record at byte "
                              f"{rec.offset + rec.length}")
    return got
