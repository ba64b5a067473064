"""The PS's checkpoint of a run: everything needed to continue it from a round boundary.

Both engines write one after every ``spec.checkpoint_every`` rounds (and after the last) into
``<run folder>/checkpoints/ps/``: the algorithm's explicit state S, the byte meter rows and missing log so far,
the round records, and the PS Comm's record of its children's last usable replies. The meter rows go to one file
per round beside them (``meter_files.py``), written when the round's rows change. The in-process engine also
keeps every other node's snapshot in it (all nodes live in its process); over the network each node keeps its
own (``node_store.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedhop.common.engine import meter_files
from fedhop.common.engine.checkpoint import CheckpointError, CheckpointStore, Loaded
from fedhop.common.engine.snapshot import NodeSnapshot
from fedhop.common.spec import RunSpec


@dataclass
class RunCheckpoint:
    """``meter``: the byte meter's rows. Written with :class:`~fedhop.common.engine.meter_files.MeterFiles`
    (the engines' commit), the rows go to one file per round beside the checkpoints and the saved ``meter`` is
    empty; :func:`load_latest` puts them back, so a loaded checkpoint holds its rows either way."""

    state: Any
    meter: list[dict[str, Any]]
    missing: list[dict[str, Any]]
    records: list[dict[str, Any]]
    last_ok: dict[str, int]
    run_id: str = ""
    nodes: dict[str, NodeSnapshot] = field(default_factory=dict)


def ps_store(run_dir: Path) -> CheckpointStore:
    return CheckpointStore(Path(run_dir) / "checkpoints" / "ps")


def commit_due(spec: RunSpec, t: int) -> bool:
    """Whether round ``t`` (0-based; -1 = set-up) ends with a checkpoint."""
    every = spec.checkpoint_every
    return bool(every) and (t < 0 or (t + 1) % every == 0 or t + 1 == spec.rounds)


def save(store: CheckpointStore, t: int, ck: RunCheckpoint, spec: RunSpec,
         rows: meter_files.MeterFiles | None = None) -> int:
    """Write round ``t``'s checkpoint; returns the bytes written (the checkpoint's own file). ``rows``: the
    meter's rows go to their round files (the rounds changed since its last write) and ``ck.meter`` is not
    saved; without it ``ck.meter`` is saved inline."""
    meta: dict[str, Any] = {"next_round": t + 1, "spec": spec.model_dump(mode="json"), "run_id": ck.run_id}
    if rows is not None:
        meta[meter_files.META_KEY] = rows.write(store)
        ck = replace(ck, meter=[])
    n = store.save(t, meta, ck)
    if rows is not None:
        meter_files.prune(store)
    return n


def load_latest(store: CheckpointStore) -> tuple[Loaded, RunCheckpoint]:
    """The newest readable checkpoint (a corrupted newer one is reported and skipped; so is one whose meter
    files are missing or corrupted), its meter rows read back from their files when it lists them."""
    below: int | None = None
    while True:
        got = store.latest(below)
        if got is None:
            why = f" ({'; '.join(store.errors)})" if store.errors else ""
            raise CheckpointError(f"no readable checkpoint in {store.folder}{why}")
        if not isinstance(got.state, RunCheckpoint):
            raise CheckpointError(f"{got.path} is not a run checkpoint")
        names = got.meta.get(meter_files.META_KEY)
        if names is None:
            return got, got.state
        try:
            got.state.meter = meter_files.read_rows(store, list(names))
        except CheckpointError as e:
            store.errors.append(f"checkpoint {got.path}: {e}")
            below = got.tag
            continue
        return got, got.state
