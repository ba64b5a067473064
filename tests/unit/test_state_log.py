"""A node's state log (common/engine/state_log.py): what a save appends is read back by a new process, drops
outlive a restart, a save cut short or a damaged record falls back to the one before, old segments and checkpoint
files of an older fedhop go once nothing in them is kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhop.common.engine import state_log
from fedhop.common.engine.checkpoint import CheckpointStore, write_checkpoint
from fedhop.common.engine.state_log import StateLog


def _state(tag: int) -> dict:
    return {"w": torch.full((3,), float(tag)), "step": tag}


def _save(log: StateLog, tag: int, **kw) -> None:
    log.save(tag, {"node": "client-0", "run_id": "r"}, _state(tag), **kw)


def _w(log: StateLog, below: int | None = None) -> tuple[int, float] | None:
    got = log.latest(below)
    return None if got is None else (got.tag, float(got.state["w"][0]))


def test_a_new_process_reads_back_every_kept_state(tmp_path: Path) -> None:
    log = StateLog(tmp_path, keep=2)
    for t in range(5):
        _save(log, t)
    assert log.tags() == [3, 4]
    again = StateLog(tmp_path, keep=2)
    assert _w(again) == (4, 4.0)
    assert _w(again, below=4) == (3, 3.0)
    got = again.latest()
    assert got is not None and got.meta == {"node": "client-0", "run_id": "r", "tag": 4}
    assert torch.equal(got.state["w"], torch.full((3,), 4.0)) and got.state["step"] == 4


def test_a_tag_saved_twice_reads_as_its_newest_save(tmp_path: Path) -> None:
    log = StateLog(tmp_path)
    _save(log, 1)
    log.save(1, {"node": "client-0", "run_id": "r"}, {"w": torch.full((3,), 9.0), "step": 1})
    assert _w(StateLog(tmp_path)) == (1, 9.0)


def test_a_drop_outlives_a_restart(tmp_path: Path) -> None:
    log = StateLog(tmp_path, keep=4)
    for t in range(4):
        _save(log, t)
    log.drop_from(2)
    assert log.tags() == [0, 1]
    again = StateLog(tmp_path, keep=4)
    assert again.tags() == [0, 1] and _w(again) == (1, 1.0)
    _save(again, 2)  # a new state under a dropped tag counts
    assert _w(StateLog(tmp_path, keep=4)) == (2, 2.0)


def _three_saves(folder: Path) -> Path:
    """Tags 0, 1, 2 saved by one process (keep = 3); its one segment."""
    log = StateLog(folder, keep=3)
    for t in range(3):
        _save(log, t)
    (seg,) = folder.glob("state_*.fhlog")
    return seg


def test_a_save_cut_short_falls_back_and_the_next_process_goes_on(tmp_path: Path) -> None:
    seg = _three_saves(tmp_path)
    with open(seg, "r+b") as f:  # the crash cut the last record
        f.truncate(seg.stat().st_size - 5)
    again = StateLog(tmp_path, keep=3)
    assert again.tags() == [0, 1] and _w(again) == (1, 1.0)
    _save(again, 2)  # appended to a new segment, after the torn one
    assert len(list(tmp_path.glob("state_*.fhlog"))) == 2
    assert _w(StateLog(tmp_path, keep=3)) == (2, 2.0)


def test_a_damaged_record_is_reported_and_the_one_before_is_used(tmp_path: Path) -> None:
    seg = _three_saves(tmp_path)
    data = bytearray(seg.read_bytes())
    data[-2] ^= 0xFF  # a byte of the last record's payload
    seg.write_bytes(bytes(data))
    again = StateLog(tmp_path, keep=3)
    assert _w(again) == (1, 1.0)
    assert len(again.errors) == 1 and "record at byte" in again.errors[0] and str(seg) in again.errors[0]


def test_old_segments_go_once_nothing_in_them_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_log, "SEGMENT_RECORDS", 2)
    log = StateLog(tmp_path, keep=2)
    for t in range(20):
        _save(log, t)
    segs = sorted(p.name for p in tmp_path.glob("state_*.fhlog"))
    assert len(segs) <= 2, segs  # the kept tags 18 and 19 fill the newest segment (the one before may hold 18)
    assert segs[-1] == "state_00000009.fhlog"
    assert _w(StateLog(tmp_path, keep=2)) == (19, 19.0)


def test_a_drop_is_not_deleted_while_a_segment_it_cancels_is_kept(tmp_path: Path) -> None:
    first = StateLog(tmp_path, keep=8)
    for t in range(3):
        _save(first, t)  # segment 0: tags 0, 1, 2
    StateLog(tmp_path, keep=8).drop_from(1)  # another process: segment 1 holds the drop alone
    third = StateLog(tmp_path, keep=8)
    _save(third, 5)  # segment 2; tag 0 still kept in segment 0, so segment 1 (no kept state) must stay
    assert sorted(p.name for p in tmp_path.glob("state_*.fhlog")) == [
        "state_00000000.fhlog", "state_00000001.fhlog", "state_00000002.fhlog"]
    assert StateLog(tmp_path, keep=8).tags() == [0, 5]  # tags 1 and 2 stay dropped


def test_checkpoint_files_of_an_older_fedhop_are_read_and_go_when_not_kept(tmp_path: Path) -> None:
    old = CheckpointStore(tmp_path)
    for t in (3, 4):
        write_checkpoint(old.path(t), {"node": "client-0", "run_id": "r", "tag": t}, _state(t))
    log = StateLog(tmp_path, keep=2)
    assert log.tags() == [3, 4] and _w(log) == (4, 4.0)
    _save(log, 5)
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.fhck")) == ["ckpt_00000004.fhck"]
    _save(log, 6)
    assert list(tmp_path.glob("ckpt_*.fhck")) == []
    assert StateLog(tmp_path, keep=2).tags()[-2:] == [5, 6]


def test_a_failed_sync_ends_the_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = StateLog(tmp_path, keep=3)
    _save(log, 0)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state_log.os, "fdatasync", full)
    with pytest.raises(OSError, match="No space"):
        _save(log, 1)
    monkeypatch.undo()
    _save(log, 2)
    assert len(list(tmp_path.glob("state_*.fhlog"))) == 2
    assert _w(StateLog(tmp_path, keep=3)) == (2, 2.0)


def test_a_large_state_is_written_part_by_part_and_reads_back(tmp_path: Path) -> None:
    big = torch.arange(600_000, dtype=torch.float32)  # 2.4 MB: above state_log.SMALL
    log = StateLog(tmp_path)
    n = log.save(0, {"node": "edge-0"}, {"model": big, "t": 0})
    _save(log, 1)
    assert n > state_log.SMALL
    got = StateLog(tmp_path).latest(below=1)
    assert got is not None and got.tag == 0 and torch.equal(got.state["model"], big)


def test_a_record_longer_than_its_checkpoint_is_reported(tmp_path: Path) -> None:
    seg = _three_saves(tmp_path)
    body = b"".join(bytes(memoryview(p).cast("B")) for p in
                    state_log.checkpoint_parts({"node": "client-0", "run_id": "r", "tag": 3}, _state(3)))
    with open(seg, "ab") as f:  # a record whose length claims 4 bytes more than its checkpoint holds
        f.write(state_log._head(state_log.STATE, 3, len(body) + 4) + body + b"\0" * 4)
    again = StateLog(tmp_path, keep=4)
    assert again.tags() == [0, 1, 2, 3]
    assert _w(again) == (2, 2.0)
    assert len(again.errors) == 1 and "ends at byte" in again.errors[0]
