"""The PS's commit costs what the round changed (issue 19): the byte meter rebuilds only the rows changed since
its last read (common/wire/meter_rows.py), a checkpoint writes only the rounds' row files that changed
(common/engine/meter_files.py), the live page's process rebuilds every row from the rounds that changed
(RoundRows), and what comes back is exactly what was there: the same rows, in the same order, after late replies,
a rollback's relabelling and a remote meter merged into an old round."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from fedhop.common.engine import meter_files
from fedhop.common.engine.checkpoint import CheckpointError, CheckpointStore, read_meta
from fedhop.common.engine.meter_files import MeterFiles
from fedhop.common.engine.run_checkpoint import RunCheckpoint, load_latest, save
from fedhop.common.wire.meter import WIRE_KIND, ByteMeter, RoundRows
from tests.specs import run_spec

CLIENTS = [f"client-{i}" for i in range(6)]


def reference_rows(meter: ByteMeter) -> list[dict[str, Any]]:
    """What ``ByteMeter.rows`` returned before it kept its rows: every count as a fresh dict, sorted by key."""
    return [{"src": k.src, "dst": k.dst, "kind": k.kind, "phase": k.phase, "round": k.round,
             "messages": c.messages, "payload_bytes": c.payload_bytes, "message_bytes": c.message_bytes,
             **({"wire_bytes": c.wire_bytes, "wire_segments": c.wire_segments, "wire_retrans": c.wire_retrans}
                if k.kind == WIRE_KIND else {})}
            for k, c in sorted(meter.counts.items())]


def fill_round(meter: ByteMeter, t: int) -> None:
    for c in CLIENTS:
        meter.record("ps", c, "fedavg.train", "request", 100, 120, t)
        meter.record(c, "ps", "fedavg.train", "reply", 100, 121, t)
        meter.record(c, "ps", "keepalive", "request", 0, 2, t)
    meter.record_wire("ps", CLIENTS[0], t, 5000, 4, 0)


def random_change(meter: ByteMeter, rng: random.Random, op: int, t: int) -> None:
    """One change a PS's meter sees in round ``t`` (``op`` 0-4): a message recorded, a wire row, a remote meter's
    row merged."""
    c = rng.choice(CLIENTS)
    if op <= 2:
        meter.record(c, "ps", rng.choice(["fedavg.train", "keepalive", "report"]), rng.choice(["request", "reply"]),
                     rng.randrange(100), rng.randrange(200), t)
    elif op == 3:
        meter.record_wire("ps", c, t, rng.randrange(1000), 3, rng.randrange(2))
    else:
        meter.merge([{"src": "edge-0", "dst": "ps", "kind": "report", "phase": "request", "round": t,
                      "messages": 2, "payload_bytes": 1, "message_bytes": 30}])


def test_rows_match_a_fresh_build_after_every_kind_of_change() -> None:
    rng = random.Random(19)
    meter = ByteMeter()
    for step in range(400):
        op = rng.randrange(6)
        t = rng.randrange(-1, 8)
        if op <= 4:
            random_change(meter, rng, op, t)
        elif step % 50 == 0:
            meter.relabel_from(t)
        if rng.random() < 0.3:  # read now and then, as the commits do: the cache must be right every time
            assert meter.rows() == reference_rows(meter)
            for r in range(-1, 8):
                assert meter.rows_of_round(r) == [x for x in reference_rows(meter) if x["round"] == r]
    assert meter.rows() == reference_rows(meter)


def test_another_process_rebuilds_every_row_from_the_rounds_each_view_changed() -> None:
    """The live page's process (server/web/proc.py) gets, per links event, only the rounds whose rows changed
    since the last one (ByteMeter.view): RoundRows rebuilds from them every row, in order, after every kind of
    change (a rollback's relabelling empties old keys of a round, a merge adds to an old round); the running
    totals are the rows' sums."""
    rng = random.Random(7)
    meter, copy, seen = ByteMeter(), RoundRows(), {}
    sizes = []
    for step in range(300):
        t = rng.randrange(-1, 8) if rng.random() < 0.3 else step // 40  # mostly the current round
        random_change(meter, rng, rng.randrange(5), t)
        if step in (150, 250):  # a rollback: old rows of rounds already sent move to "redo"
            assert meter.relabel_from(step // 40 - 1)
        if rng.random() < 0.2 or step == 299:  # a commit (and one after the last change)
            view = meter.view(seen)
            seen.update((r, v) for r, (v, _) in view.changed.items())
            sizes.append(sum(len(rows) for _, rows in view.changed.values()))
            expected = reference_rows(meter)
            assert view.rows == expected
            assert copy.apply({r: rows for r, (_, rows) in view.changed.items()}) == expected
            assert (view.totals.messages, view.totals.payload_bytes, view.totals.message_bytes,
                    view.totals.wire_bytes) == tuple(sum(r.get(k, 0) for r in expected) for k in (
                        "messages", "payload_bytes", "message_bytes", "wire_bytes"))
    assert meter.view(seen).changed == {}  # nothing changed since the last view
    assert max(sizes) < len(reference_rows(meter))  # the later views carry fewer rows than there are


def test_a_read_rebuilds_only_the_rows_changed_since_the_last() -> None:
    meter = ByteMeter()
    for t in range(5):
        fill_round(meter, t)
    first = meter.rows()
    fill_round(meter, 5)  # a new round: 19 new rows
    meter.record("client-2", "ps", "fedavg.train", "reply", 100, 121, 3)  # a late reply changes one old row
    second = meter.rows()
    assert second == reference_rows(meter)
    old = {id(r) for r in first}
    rebuilt = [r for r in second if id(r) not in old]
    assert len(rebuilt) == 19 + 1
    assert {r["round"] for r in rebuilt} == {5, 3}
    assert meter.rows()[0] is second[0]  # nothing changed since: every row is the one already built


def test_relabel_moves_the_rows_and_the_cache_follows() -> None:
    meter = ByteMeter()
    for t in range(4):
        fill_round(meter, t)
    meter.rows()
    assert meter.relabel_from(2) == 2 * (3 * len(CLIENTS) + 1)
    rows = meter.rows()
    assert rows == reference_rows(meter)
    assert {r["phase"] for r in rows if r["round"] >= 2} == {"redo"}


def store_and_spec(tmp_path: Path) -> tuple[CheckpointStore, Any]:
    return CheckpointStore(tmp_path / "ps"), run_spec("fedavg", {"local_steps": 1}, clients=len(CLIENTS), rounds=10)


def checkpoint(meter: ByteMeter, t: int) -> RunCheckpoint:
    return RunCheckpoint({"round": t}, meter.rows(), [], [{"round": t + 1}], {}, "r-19")


def test_a_checkpoint_writes_only_the_rounds_that_changed(tmp_path: Path) -> None:
    store, spec = store_and_spec(tmp_path)
    meter = ByteMeter()
    files = MeterFiles(meter)
    folder = store.folder / meter_files.FOLDER
    seen: set[str] = set()
    for t in range(6):
        fill_round(meter, t)
        if t == 4:
            meter.record("client-1", "ps", "fedavg.train", "reply", 100, 121, 1)  # late: round 1 changes
        save(store, t, checkpoint(meter, t), spec, rows=files)
        now = {p.name for p in folder.iterdir()}
        new = now - seen
        assert sorted(int(n.split("_")[1]) for n in new) == ([1, 4] if t == 4 else [t])
        seen = now
    # the checkpoint itself holds no row: they are in the round files it lists
    got, ck = load_latest(store)
    assert len(got.meta[meter_files.META_KEY]) == 6
    assert ck.meter == meter.rows() == reference_rows(meter)


def test_the_rows_come_back_exactly_after_relabel_and_an_old_round_merged(tmp_path: Path) -> None:
    store, spec = store_and_spec(tmp_path)
    meter = ByteMeter()
    files = MeterFiles(meter)
    for t in range(-1, 5):
        fill_round(meter, t)
        save(store, t, checkpoint(meter, t), spec, rows=files)
    meter.relabel_from(3)  # a rollback before round 3
    meter.merge([{"src": "edge-0", "dst": "ps", "kind": "report", "phase": "request", "round": 0, "messages": 2,
                  "payload_bytes": 0, "message_bytes": 60},
                 {"src": "ps", "dst": "client-0", "kind": WIRE_KIND, "phase": "tcp", "round": 1, "messages": 0,
                  "payload_bytes": 0, "message_bytes": 0, "wire_bytes": 7, "wire_segments": 1, "wire_retrans": 1}])
    save(store, 5, checkpoint(meter, 5), spec, rows=files)
    _, ck = load_latest(store)
    assert ck.meter == reference_rows(meter)
    assert [list(r) for r in ck.meter] == [list(r) for r in reference_rows(meter)]  # the columns' order too
    resumed = ByteMeter()
    resumed.merge(ck.meter)  # what both engines do on resume
    assert resumed.rows() == meter.rows()
    # round files that no kept checkpoint lists are gone (keep = 2: the last two checkpoints' files stay)
    listed = {n for tag in store.tags() for n in read_meta(store.path(tag))[meter_files.META_KEY]}
    assert len(store.tags()) == 2 and len(listed) == 6 + 4  # rounds 0, 1 (merged), 3, 4 (relabelled) twice
    assert {p.name for p in (store.folder / meter_files.FOLDER).iterdir()} == listed


def test_a_checkpoint_with_a_damaged_round_file_falls_back_to_the_one_before(tmp_path: Path) -> None:
    store, spec = store_and_spec(tmp_path)
    meter = ByteMeter()
    files = MeterFiles(meter)
    fill_round(meter, 0)
    save(store, 0, checkpoint(meter, 0), spec, rows=files)
    kept = meter.rows()
    fill_round(meter, 1)
    save(store, 1, checkpoint(meter, 1), spec, rows=files)
    newest = [n for n in (store.folder / meter_files.FOLDER).iterdir() if n.name.startswith("rows_1_")]
    newest[0].write_bytes(newest[0].read_bytes().replace(b"121", b"122"))
    got, ck = load_latest(store)
    assert got.tag == 0 and ck.meter == kept
    assert any("fails its checksum" in e for e in store.errors)


def test_a_checkpoint_with_its_rows_inline_still_loads(tmp_path: Path) -> None:
    """Checkpoints written before the round files (their rows in the state) resume as they did."""
    store, spec = store_and_spec(tmp_path)
    meter = ByteMeter()
    fill_round(meter, 0)
    save(store, 0, checkpoint(meter, 0), spec)
    got, ck = load_latest(store)
    assert meter_files.META_KEY not in got.meta and ck.meter == reference_rows(meter)


@pytest.mark.parametrize("name", ["rows_1_zz.json", "../rows_1_0000000000000000.json"])
def test_a_meter_file_name_that_is_not_one_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(CheckpointError, match="is not rows_<round>_<digest>.json"):
        meter_files.read_rows(CheckpointStore(tmp_path), [name])
