"""The fold's undo log written ahead by its own thread (issue 19, ``common/wire/fold.py`` ``UndoLog``): the receiving
thread writes none of it, a reply that fails after part of it was added is still undone bit for bit (the writer
saved each byte before the add changed it), and a writer whose file fails mid-reply hands over to the receiving
thread's own saves (then to memory) without losing a byte. No sockets: the decoder is fed the encoder's chunks."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.engine.api import Reply
from fedhop.common.wire import fold
from fedhop.common.wire.bundle import clone
from fedhop.common.wire.codec import BundleDecoder, CodecError, RawChunk, encode_views
from fedhop.common.wire.fold import UndoLog

N = [10, 25, 7, 3]


def bundles(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(129, 257, generator=g), "b": torch.randn(257, generator=g),
             "d": torch.randn(70, generator=g, dtype=torch.float64)} for _ in range(4)]


def plain(bs, nodes) -> dict[str, torch.Tensor]:
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    for i in nodes:
        mean(f"c{i}", Reply(clone(bs[i]), {"n": N[i]}))
    return mean.result()


def stream(mean: WeightedMean, i: int, bundle, *, corrupt: bool = False):
    """Reply ``i`` through a decoder with the fold's sink, in 4 KiB chunks; None when it failed (and was undone)."""
    header, chunks = encode_views(bundle, 4096)
    dec = BundleDecoder(header, sink=mean.sink(f"c{i}", {"n": N[i]}, header))
    chunks = list(chunks)
    if corrupt:  # the checksum fails at the end: after every piece was added
        last = bytearray(chunks[-1].data)
        last[-1] ^= 1
        chunks[-1] = RawChunk(chunks[-1].offset, bytes(last))
    try:
        for c in chunks:
            dec.feed(c)
        return dec.finish()
    except CodecError:
        return None


def same(a, b) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def writes(monkeypatch) -> list[str]:
    """The name of the thread of every write into an undo log's file; the writer's pieces made small (many of them
    per reply, so that the receiving thread waits for the writer again and again)."""
    names: list[str] = []
    real = os.pwrite

    def pwrite(fd, data, offset):
        names.append(threading.current_thread().name)
        return real(fd, data, offset)

    monkeypatch.setattr(fold.os, "pwrite", pwrite)
    monkeypatch.setattr(UndoLog, "PIECE", 1000)
    monkeypatch.setattr(UndoLog, "AHEAD_MIN_BYTES", 0)  # these bundles are ~135 KB
    return names


def test_the_undo_log_is_written_by_its_writer_and_a_failed_reply_is_undone_bit_for_bit(writes) -> None:
    bs = bundles()
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    for i in (0, 1):
        mean(f"c{i}", Reply(stream(mean, i, bs[i]), {"n": N[i]}))
    assert stream(mean, 2, bs[2], corrupt=True) is None  # every piece added, then undone from the log
    mean("c3", Reply(stream(mean, 3, bs[3]), {"n": N[3]}))
    assert mean.undo.restored_total > 0
    assert same(mean.result(), plain(bs, [0, 1, 3]))
    model = sum(t.numel() * t.element_size() for t in bs[0].values())
    assert len(writes) > 3 * (model // 1000)  # replies 1, 2 and 3 logged, each in many pieces
    assert set(writes) == {"fold-undo-log"}  # none by the receiving thread
    assert mean.undo._writer is None  # stopped and forgotten at each commit or restore


def test_below_the_size_for_a_writer_the_receiving_thread_logs_itself(writes, monkeypatch) -> None:
    # a writer thread per reply costs more than a small model's writes: 1,000 clients fold 1,000 replies a round
    bs = bundles()
    model = sum(t.numel() * t.element_size() for t in bs[0].values())
    monkeypatch.setattr(UndoLog, "AHEAD_MIN_BYTES", model + 1024)
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    for i in (0, 1):
        mean(f"c{i}", Reply(stream(mean, i, bs[i]), {"n": N[i]}))
    assert stream(mean, 2, bs[2], corrupt=True) is None
    assert writes and set(writes) == {threading.current_thread().name}  # no writer thread
    assert mean.undo._writer is None
    mean("c3", Reply(stream(mean, 3, bs[3]), {"n": N[3]}))
    assert same(mean.result(), plain(bs, [0, 1, 3]))


@pytest.mark.parametrize("for_good", [False, True])
@pytest.mark.parametrize("fail_after", [0, 1, 5, 40])
def test_a_writer_whose_file_fails_mid_reply_hands_its_saves_over_without_losing_a_byte(monkeypatch, fail_after,
                                                                                        for_good) -> None:
    """The writer's file fails after ``fail_after`` pieces (``for_good``: every write after, the receiving thread's
    too, so the log goes to memory); the reply being folded is corrupt, so every byte saved is read back."""
    real = os.pwrite
    count = {"writer": 0, "failed": 0}

    def pwrite(fd, data, offset):
        if threading.current_thread().name == "fold-undo-log":
            count["writer"] += 1
            if count["writer"] > fail_after:
                count["failed"] += 1
                raise OSError(28, "No space left on device")
        elif for_good and count["failed"]:
            raise OSError(28, "No space left on device")
        return real(fd, data, offset)

    bs = bundles(1)
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    mean("c0", Reply(stream(mean, 0, bs[0]), {"n": N[0]}))
    monkeypatch.setattr(UndoLog, "PIECE", 1000)
    monkeypatch.setattr(UndoLog, "AHEAD_MIN_BYTES", 0)
    monkeypatch.setattr(fold.os, "pwrite", pwrite)
    assert stream(mean, 1, bs[1], corrupt=True) is None
    mean("c2", Reply(stream(mean, 2, bs[2]), {"n": N[2]}))
    assert stream(mean, 3, bs[3], corrupt=True) is None
    assert same(mean.result(), plain(bs, [0, 2]))
    assert count["failed"] >= 1 and mean.undo.restored_total > 0
    assert (mean.undo._mem is not None) == for_good


def test_a_save_past_what_the_writer_covers_is_made_by_the_caller() -> None:
    log = UndoLog()
    data = memoryview(bytes(range(256)) * 8)
    done = threading.Event()

    def save() -> None:
        log.save(4096, data, whole=lambda: [(0, memoryview(bytes(1000)))])  # the writer stops at 1000
        done.set()

    t = threading.Thread(target=save, daemon=True)
    t.start()
    t.join(timeout=30)
    assert done.is_set(), "the save waited for bytes the writer never reaches"
    out = memoryview(bytearray(data.nbytes))
    log.restore(4096, out)
    assert bytes(out) == bytes(data)
    log.close()
