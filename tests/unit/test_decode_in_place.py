"""Receiving a big bundle without the copies and page faults that need not be (issue 19, the 25M round's CPU beside
the training): the codec keeps a freed huge decode buffer for the next bundle of its size, and
``BundleDecoder.fill`` lands a fold's first reply in its fresh buffer and hands the sink whole pieces."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.engine.api import Reply
from fedhop.common.wire import codec
from fedhop.common.wire.codec import BundleDecoder, encode_views

HUGE = codec._HUGE_BUFFER_BYTES


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setattr(codec, "POOL_KEEP", 2)
    codec.release_pool()
    yield
    codec.release_pool()


@pytest.mark.skipif(codec._MADV_HUGEPAGE is None, reason="huge buffers are mappings only where THP can be advised")
def test_a_freed_huge_buffer_is_reused_for_the_next_of_its_size_only(pool) -> None:
    def mapping(buf: np.ndarray) -> object:
        return buf.base.obj  # np.frombuffer's base is a memoryview of the mapping

    a = codec.allocate(HUGE)
    kept = mapping(a)
    del a
    assert len(codec._pool) == 1 and codec._pool[0] is kept
    b = codec.allocate(HUGE + 64)  # another size: a fresh mapping, the kept one stays
    assert len(codec._pool) == 1 and codec._pool[0] is kept and mapping(b) is not kept
    c = codec.allocate(HUGE)
    assert mapping(c) is kept and codec._pool == []
    del b, c
    assert codec.release_pool() == 2 * HUGE + 64
    assert codec.release_pool() == 0


@pytest.mark.skipif(codec._MADV_HUGEPAGE is None, reason="huge buffers are mappings only where THP can be advised")
def test_the_pool_keeps_at_most_pool_keep_buffers(pool, monkeypatch) -> None:
    a, b, c = (codec.allocate(HUGE + 64 * i) for i in range(3))
    del a
    del b
    del c
    assert codec.release_pool() == 2 * HUGE + 64 * 3  # the last two freed: sizes +64 and +128
    monkeypatch.setattr(codec, "POOL_KEEP", 0)
    d = codec.allocate(HUGE)
    del d
    assert codec.release_pool() == 0


def test_a_reused_buffer_decodes_the_new_bundle_exactly(pool) -> None:
    """The kept buffer still holds the last bundle's bytes: every tensor of the next is written before it is read."""
    g = torch.Generator().manual_seed(3)
    first = {"w": torch.randn(HUGE // 4 + 20, generator=g), "b": torch.randn(3, generator=g)}
    second = {"w": torch.randn(HUGE // 4 + 20, generator=g), "b": torch.randn(3, generator=g)}
    huge = codec._MADV_HUGEPAGE is not None
    for bundle in (first, second):
        header, chunks = encode_views(bundle, 1 << 20)
        raw = io.BytesIO(b"".join(bytes(c.data) for c in chunks))
        dec = BundleDecoder(header)
        if huge:
            assert len(codec._pool) == 0  # the second decoder took the first one's buffer
        dec.fill(lambda view, raw=raw: raw.readinto(view[:100_003]))
        out = dec.finish()
        assert all(torch.equal(out[k], bundle[k]) for k in bundle)
        del out
        if huge:
            assert len(codec._pool) == 1


def test_fill_lands_a_folds_first_reply_in_its_buffer_and_writes_whole_pieces() -> None:
    g = torch.Generator().manual_seed(4)
    replies = [{"w": torch.randn(300_000, generator=g), "b": torch.randn(70, generator=g)} for _ in range(2)]
    mean = WeightedMean(lambda node, r: 1.0, 2.0)
    for i, bundle in enumerate(replies):
        header, chunks = encode_views(bundle, 1 << 20)
        raw = io.BytesIO(b"".join(bytes(c.data) for c in chunks))
        sink = mean.sink(f"c{i}", {}, header)
        assert sink is not None
        views: list[memoryview] = []
        writes: list[int] = []
        real = sink.write

        def write(index, pos, data, real=real, writes=writes):
            writes.append(data.nbytes)
            real(index, pos, data)

        sink.write = write  # type: ignore[method-assign]

        def recv(view, raw=raw, views=views):
            views.append(view)
            return raw.readinto(view[:65_536])  # short reads: a piece takes several

        dec = BundleDecoder(header, sink=sink)
        dec.fill(recv)
        mean(f"c{i}", Reply(dec.finish(), {}))
        assert writes == [1 << 20, 1_200_000 - (1 << 20), 280]  # one write per piece, however short the reads
        landed = np.frombuffer(views[0], dtype=np.uint8).ctypes.data
        into = sink.tensors["w"].data_ptr()
        assert (landed == into) == (i == 0)  # the first reply lands in its own buffer; the next in a scratch one
    expected = {k: replies[0][k] * 0.5 for k in replies[0]}
    for k in expected:
        expected[k].add_(replies[1][k], alpha=0.5)
    out = mean.result()
    assert all(torch.equal(out[k], expected[k]) for k in expected)


@pytest.mark.parametrize("broken", [0, 1])
def test_a_byte_stream_that_breaks_mid_piece_is_undone_and_the_next_reply_folds_the_same(broken) -> None:
    """``fill`` over a stream that ends inside a piece, after whole pieces were added (or, for the first reply,
    received in place): the reply is dropped alone, the aggregate is what it was, the bits of the rest unchanged."""
    g = torch.Generator().manual_seed(5)
    replies = [{"w": torch.randn(700_000, generator=g), "b": torch.randn(70, generator=g)} for _ in range(3)]
    mean = WeightedMean(lambda node, r: 1.0, 3.0)
    for i, bundle in enumerate(replies):
        header, chunks = encode_views(bundle, 1 << 20)
        data = b"".join(bytes(c.data) for c in chunks)
        if i == broken:
            data = data[:(1 << 21) + 12_345]  # two whole pieces, then part of the third
        raw = io.BytesIO(data)
        dec = BundleDecoder(header, sink=mean.sink(f"c{i}", {}, header))
        if i == broken:
            with pytest.raises(codec.CodecError, match="truncated bundle"):
                dec.fill(lambda view, raw=raw: raw.readinto(view[:300_001]))
            continue
        dec.fill(lambda view, raw=raw: raw.readinto(view[:300_001]))
        mean(f"c{i}", Reply(dec.finish(), {}))
    if broken:
        assert mean.undo.restored_total == 2 << 20
    usable = [b for i, b in enumerate(replies) if i != broken]
    expected = {k: usable[0][k] * (1 / 3) for k in usable[0]}
    for k in expected:
        expected[k].add_(usable[1][k], alpha=1 / 3)
    out = mean.result()
    assert mean.total == 2.0
    assert all(torch.equal(out[k], expected[k] * 1.5) for k in expected)
