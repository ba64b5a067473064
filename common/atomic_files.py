"""Files that are either whole or absent: written to a temporary file in the same folder, synced, then renamed
over the target (and the folder synced). A full or read-only disk leaves the previous file as it was (or no
file), never a truncated one (issue 20: a full disk left ``spec.toml`` at 0 bytes).

Torch-free and process-free: the run folder's writers (``common/engine/results.py``) and the unit tier use it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers that infer a format from it keep working) to
    write ``path``'s new content to; when the block ends without an exception, the file is synced and renamed
    over ``path``. On an exception (an ``OSError`` of a full disk, ...) the temporary file is removed and
    ``path`` is untouched."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # a full disk may only say so here (delayed allocation)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable (a folder that cannot be opened for it is left as it is)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename itself is done
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> None:
    """``path`` holds ``text`` afterwards, or (on an error) what it held before."""
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` afterwards, or (on an error) what it held before."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
