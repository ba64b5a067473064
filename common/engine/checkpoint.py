"""Checkpoint files: one node's explicit state at a round boundary, written atomically through the codec.

File layout (little-endian): ``MAGIC``, u64 length + JSON (``{"meta": ..., "tree": ...}``, see
``state_io``), u64 xxh3-64 of that JSON, u64 length + ``BundleHeader``, then the raw tensor payload as the
codec lays it out (its header carries names, dtypes, shapes and the payload checksum). No pickle.

Writes go to a temporary file in the same folder, are fsynced, then renamed over the target, and the folder
is fsynced: a crash leaves the old checkpoint or the new one, never a half-written one under the final name.
A truncated or corrupted file is reported by :func:`read_checkpoint` with an error naming it;
:meth:`CheckpointStore.latest` then falls back to the previous one.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from fedhop.common.atomic_files import replacing
from fedhop.common.engine.api import get_algorithm
from fedhop.common.engine.state_io import StateError, from_tree, to_tree
from fedhop.common.wire.codec import BundleDecoder, CodecError, RawChunk, encode_parts
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.checkpoint")

MAGIC = b"FEDHOPCKPT1\n"
CHUNK = 1 << 22
_NAME = re.compile(r"^ckpt_(m?)(\d{8})\.fhck$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read (names the file and the reason)."""


def _u64(n: int) -> bytes:
    return int(n).to_bytes(8, "little")


def checkpoint_parts(meta: dict[str, Any], state: Any) -> list[Any]:
    """The bytes of a checkpoint of ``state`` (see ``state_io``) with ``meta``, in order, as the file holds them
    (bytes, then the payload as flat views of the tensors' memory: the file holds the codec's chunks back to
    back, i.e. the uncut payload)."""
    tensors: dict[str, Any] = {}
    tree = to_tree(state, tensors)
    body = json.dumps({"meta": meta, "tree": tree}, allow_nan=True).encode()
    header, payload = encode_parts(tensors, CHUNK)
    head = header.SerializeToString()
    return [MAGIC, _u64(len(body)), body, _u64(xxhash.xxh3_64_intdigest(body)), _u64(len(head)), head, *payload]


def part_bytes(part: Any) -> int:
    """The size in bytes of one of :func:`checkpoint_parts` (bytes, or a view of a tensor's memory)."""
    return part.nbytes if isinstance(part, memoryview) else len(part)


def write_checkpoint(path: Path, meta: dict[str, Any], state: Any) -> int:
    """Write ``state`` (see ``state_io``) with ``meta`` to ``path`` atomically; returns the bytes written."""
    written = 0
    with replacing(path) as tmp, open(tmp, "wb") as f:  # synced, renamed over path, the folder synced
        for part in checkpoint_parts(meta, state):
            f.write(part)
            written += part_bytes(part)
    return written


def read_checkpoint(path: Path) -> tuple[dict[str, Any], Any]:
    """``(meta, state)`` from ``path``; :class:`CheckpointError` naming the file on any problem."""
    try:
        with open(path, "rb") as f:
            return read_checkpoint_from(f, str(path), whole=True)
    except OSError as e:
        raise CheckpointError(f"checkpoint {path}: {type(e).__name__}: {e}") from None


def read_checkpoint_from(f: Any, name: str, *, whole: bool) -> tuple[dict[str, Any], Any]:
    """``(meta, state)`` from the checkpoint bytes at ``f``'s position (a file, or a record of a state log),
    :class:`CheckpointError` naming ``name`` on any problem; ``whole``: nothing may follow them."""
    try:
        body = _description(f)
        header = pb.BundleHeader.FromString(_exact(f, _read_u64(f), "tensor header"))
        decoder = BundleDecoder(header)
        offset, total = 0, int(header.total_bytes)
        while offset < total:
            n = min(int(header.chunk_bytes), total - offset)
            decoder.feed(RawChunk(offset, _exact(f, n, f"tensor bytes at offset {offset}")))
            offset += n
        tensors = decoder.finish()
        if whole and f.read(1):
            raise CheckpointError("trailing bytes after the tensors")
        doc = json.loads(body)
        _load_spec_algorithm(doc["meta"])
        return doc["meta"], from_tree(doc["tree"], tensors)
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {name}: {e}") from None
    except (OSError, CodecError, StateError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {name}: {type(e).__name__}: {e}") from None


def read_meta(path: Path) -> dict[str, Any]:
    """Only the ``meta`` of the checkpoint at ``path`` (its description is read and checked, its tensors are
    not); :class:`CheckpointError` naming the file on any problem."""
    try:
        with open(path, "rb") as f:
            body = _description(f)
        meta = json.loads(body)["meta"]
        if not isinstance(meta, dict):
            raise CheckpointError("its meta is not a table")
        return meta
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {path}: {e}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path}: {type(e).__name__}: {e}") from None


def _load_spec_algorithm(meta: Any) -> None:
    """A checkpoint whose run names a user algorithm (``algorithm.name = "package.module:NAME"``) holds that
    algorithm's state classes: import the algorithm first (which lets :mod:`state_io` restore them). A checkpoint
    imports no module but the one its run's spec names, which resuming the run imports anyway."""
    spec = meta.get("spec") if isinstance(meta, dict) else None
    algorithm = spec.get("algorithm") if isinstance(spec, dict) else None
    name = algorithm.get("name") if isinstance(algorithm, dict) else None
    if isinstance(name, str) and ":" in name:
        get_algorithm(name)


def _description(f: Any) -> bytes:
    """The JSON description at the start of an open checkpoint file, checked against its magic and checksum."""
    if f.read(len(MAGIC)) != MAGIC:
        raise CheckpointError("not a fedhop checkpoint (bad magic)")
    body = _exact(f, _read_u64(f), "state description")
    if xxhash.xxh3_64_intdigest(body) != _read_u64(f):
        raise CheckpointError("state description fails its checksum")
    return body


def _read_u64(f: Any) -> int:
    return int.from_bytes(_exact(f, 8, "length field"), "little")


def _exact(f: Any, n: int, what: str) -> bytes:
    if n > (1 << 40):
        raise CheckpointError(f"{what} claims {n} bytes")
    data = f.read(n)
    if len(data) != n:
        raise CheckpointError(f"truncated: {what} has {len(data)} of {n} bytes")
    return data


def kept_tags(tags: list[int], keep: int, keep_before: int | None) -> set[int]:
    """Which of a node's saved ``tags`` (ascending) to keep: the newest ``keep`` and, with ``keep_before`` (the PS's
    last committed round), also the newest one below it and every one from it on (what a resume needs)."""
    kept = set(tags[-keep:])
    if keep_before is not None:
        below = [t for t in tags if t < keep_before]
        if below:
            kept.add(below[-1])
        kept.update(t for t in tags if t >= keep_before)
    return kept


def newest_readable(tags: list[int], below: int | None, read: Callable[[int], Loaded],
                    errors: list[str]) -> Loaded | None:
    """``read`` of the newest of ``tags`` (ascending; those < ``below`` when given) that can be read; one that
    cannot is logged, appended to ``errors`` and skipped: the one before it is tried."""
    for tag in reversed(tags):
        if below is not None and tag >= below:
            continue
        try:
            return read(tag)
        except CheckpointError as e:
            errors.append(str(e))
            log.error("%s; falling back to the previous one", e)
    return None


@dataclass(frozen=True)
class Loaded:
    tag: int
    meta: dict[str, Any]
    state: Any
    path: Path


class CheckpointStore:
    """One node's checkpoints in one folder, each under an integer tag (a round index; may be -1)."""

    def __init__(self, folder: Path, keep: int = 2) -> None:
        self.folder = Path(folder)
        self.keep = max(1, keep)
        self.errors: list[str] = []  # checkpoints that could not be read, newest first (for the caller to show)

    @staticmethod
    def _name(tag: int) -> str:
        return f"ckpt_{'m' if tag < 0 else ''}{abs(tag):08d}.fhck"

    def path(self, tag: int) -> Path:
        """Where tag's checkpoint is (or would be)."""
        return self.folder / self._name(tag)

    def tags(self) -> list[int]:
        """Tags present, ascending."""
        if not self.folder.is_dir():
            return []
        out = []
        for p in self.folder.iterdir():
            m = _NAME.match(p.name)
            if m:
                out.append(-int(m.group(2)) if m.group(1) else int(m.group(2)))
        return sorted(out)

    def save(self, tag: int, meta: dict[str, Any], state: Any, *, keep_before: int | None = None) -> int:
        """Write tag's checkpoint and prune: keep the newest ``keep`` and, with ``keep_before``, also the newest
        one whose tag is below it (what a resume from round ``keep_before`` needs). Returns bytes written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        n = write_checkpoint(self.folder / self._name(tag), {**meta, "tag": tag}, state)
        self.prune(keep_before)
        return n

    def prune(self, keep_before: int | None = None) -> None:
        tags = self.tags()
        keep = kept_tags(tags, self.keep, keep_before)
        for t in tags:
            if t not in keep:
                (self.folder / self._name(t)).unlink(missing_ok=True)

    def latest(self, below: int | None = None) -> Loaded | None:
        """The newest readable checkpoint (with tag < ``below`` when given). Unreadable ones are logged, kept
        in :attr:`errors` and skipped: the previous one is used."""
        def read(tag: int) -> Loaded:
            path = self.folder / self._name(tag)
            meta, state = read_checkpoint(path)
            return Loaded(tag, meta, state, path)

        return newest_readable(self.tags(), below, read, self.errors)

    def drop_from(self, tag: int) -> None:
        """Remove checkpoints with tag >= ``tag`` (a node rolled back before them)."""
        for t in self.tags():
            if t >= tag:
                (self.folder / self._name(t)).unlink(missing_ok=True)
