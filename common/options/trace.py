"""Recorded participation traces: a rounds x clients table of 0/1 (participation model ``trace``).

Row r, column i says whether client i (ordinal: ``client-i``) took part in round r. Two file formats:

- ``.npy``: a 2-D array of bool or integers 0/1 (``numpy.save``);
- ``.csv`` (any other suffix is read as CSV): one row per round, comma-separated 0/1, no header; blank lines
  and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class TraceError(ValueError):
    """A trace file that cannot be read or is not a rounds x clients 0/1 table."""


def _read_csv(path: Path) -> np.ndarray:
    rows: list[list[int]] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            rows.append([int(v) for v in text.split(",")])
        except ValueError:
            raise TraceError(f"{path}:{lineno}: expected comma-separated 0/1 values, got {text[:60]!r}") from None
        if len(rows[-1]) != len(rows[0]):
            raise TraceError(f"{path}:{lineno}: {len(rows[-1])} columns, the first row has {len(rows[0])}")
    if not rows:
        raise TraceError(f"{path}: no rows")
    return np.asarray(rows, dtype=np.int64)


def load_trace(path: Path) -> np.ndarray:
    """The table as a bool array ``[rounds, clients]``; a TraceError says what is wrong with the file."""
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    if path.suffix == ".npy":
        try:
            table = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise TraceError(f"{path}: not a readable .npy array: {e}") from None
    else:
        table = _read_csv(path)
    if table.ndim != 2 or table.shape[0] == 0 or table.shape[1] == 0:
        raise TraceError(f"{path}: a trace is a 2-D rounds x clients table, got shape {table.shape}")
    integral = table.dtype == np.bool_ or np.issubdtype(table.dtype, np.integer)
    if not integral or not np.isin(table, (0, 1)).all():
        raise TraceError(f"{path}: entries must be 0 or 1 (dtype {table.dtype})")
    return table.astype(bool)
