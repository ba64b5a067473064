"""Folding replies chunk by chunk (issue 19, ``common/wire/fold.py``): the same bits as folding decoded replies
whatever the chunk size, a reply that fails after part of it was added undone bit for bit, the engine's own
checks seeing what they would see in a decoded reply, and the reply gate handing the head reply's bundle to the
fold and aborting what was not committed. No sockets: the decoder is fed the encoder's chunks directly."""

from __future__ import annotations

import gc

import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.engine.api import Reply
from fedhop.common.engine.base import check_bundle
from fedhop.common.wire.bundle import clone
from fedhop.common.wire.codec import BUFFERS, BundleDecoder, CodecError, RawChunk, encode_views
from fedhop.common.wire.fold import FoldedBundle
from fedhop.transport.reply_gate import ReplyGate
from fedhop.v1 import fedhop_pb2 as pb

N = [10, 25, 7, 3]


def bundles(seed: int = 0, k: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(33, 65, generator=g), "b": torch.randn(65, generator=g),
             "d": torch.randn(7, generator=g, dtype=torch.float64), "s": torch.randn((), generator=g),
             "e": torch.zeros(0, 3), "h": torch.randn(129, generator=g).to(torch.bfloat16)} for _ in range(k)]


def plain(bs, nodes, total) -> dict[str, torch.Tensor]:
    """The in-process engine's fold: whole decoded replies, in canonical order."""
    mean = WeightedMean(lambda node, r: r.scalars["n"], total)
    for i in nodes:
        mean(f"c{i}", Reply(clone(bs[i]), {"n": N[i]}))
    return mean.result()


def stream(mean: WeightedMean, i: int, bundle, chunk: int, *, cut: int | None = None, corrupt: bool = False):
    """Feed reply ``i`` to ``mean`` through a decoder with its sink; None when the decoder failed."""
    header, chunks = encode_views(bundle, chunk)
    sink = mean.sink(f"c{i}", {"n": N[i]}, header)
    assert sink is not None
    dec = BundleDecoder(header, sink=sink)
    chunks = list(chunks)
    if corrupt:
        last = bytearray(chunks[-1].data)
        last[-1] ^= 1
        chunks[-1] = RawChunk(chunks[-1].offset, bytes(last))
    try:
        for c in chunks[:cut]:
            dec.feed(c)
        got = dec.finish()
    except CodecError:
        return None
    assert isinstance(got, FoldedBundle)
    return got


def same(a, b) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("chunk", [1, 7, 1000, 4096, 1 << 20])
def test_streamed_fold_is_bit_identical_to_the_plain_fold(chunk) -> None:
    bs = bundles()
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    for i, b in enumerate(bs):
        mean(f"c{i}", Reply(stream(mean, i, b, chunk), {"n": N[i]}))
    assert same(mean.result(), plain(bs, range(4), sum(N)))


def test_streamed_and_decoded_replies_mix_in_one_fold() -> None:
    bs = bundles(1)
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    mean("c0", Reply(clone(bs[0]), {"n": N[0]}))  # decoded whole (e.g. admitted early through a reply window)
    mean("c1", Reply(stream(mean, 1, bs[1], 999), {"n": N[1]}))
    mean("c2", Reply(clone(bs[2]), {"n": N[2]}))
    mean("c3", Reply(stream(mean, 3, bs[3], 4096), {"n": N[3]}))
    assert same(mean.result(), plain(bs, range(4), sum(N)))


@pytest.mark.parametrize("how", ["truncated", "checksum", "aborted"])
def test_a_failed_reply_leaves_the_aggregate_bit_for_bit_as_it_was(how) -> None:
    bs = bundles(2)
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    for i in (0, 1):
        mean(f"c{i}", Reply(stream(mean, i, bs[i], 1000), {"n": N[i]}))
    if how == "aborted":  # finished, then rejected or given up by the engine: the gate aborts it
        stream(mean, 2, bs[2], 1000).sink.abort()
    else:
        assert stream(mean, 2, bs[2], 1000, cut=-1 if how == "truncated" else None, corrupt=how == "checksum") is None
    assert mean.undo.restored_total > 0
    mean("c3", Reply(stream(mean, 3, bs[3], 1000), {"n": N[3]}))
    assert same(mean.result(), plain(bs, [0, 1, 3], sum(N)))


def test_a_failed_first_reply_is_dropped_and_the_next_one_starts_the_aggregate() -> None:
    bs = bundles(3)
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    assert stream(mean, 0, bs[0], 1000, corrupt=True) is None
    assert mean.empty
    for i in (1, 2, 3):
        mean(f"c{i}", Reply(stream(mean, i, bs[i], 1000), {"n": N[i]}))
    assert same(mean.result(), plain(bs, [1, 2, 3], sum(N)))


@pytest.mark.parametrize("first", [True, False])
def test_a_non_finite_reply_is_undone_and_rejected_with_the_words_of_the_plain_check(first) -> None:
    bs = bundles(4)
    bad = 0 if first else 2
    bs[bad]["w"][-1, -1] = float("inf")
    bs[bad]["h"][0] = float("nan")
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    usable = []
    for i, b in enumerate(bs):
        got = stream(mean, i, b, 1000)
        reason = check_bundle(got, bs[i])
        assert reason == check_bundle(bs[i], bs[i])
        if reason is None:
            mean(f"c{i}", Reply(got, {"n": N[i]}))
            usable.append(i)
        else:
            assert reason == "non-finite values (NaN/Inf) in ['w', 'h']"
            got.sink.abort()  # what the reply gate does with a sink the fold never committed: nothing left to undo
    assert usable == [i for i in range(4) if i != bad]
    assert same(mean.result(), plain(bs, usable, sum(N)))


def test_sink_declines_what_must_come_whole(monkeypatch) -> None:
    bs = bundles(5)
    mean = WeightedMean(lambda node, r: r.scalars["n"], 10)
    header, _ = encode_views(bs[0])
    monkeypatch.setenv("FEDHOP_FOLD_STREAM", "0")
    assert mean.sink("c0", {"n": 1}, header) is None  # the ablation: decoded whole
    monkeypatch.delenv("FEDHOP_FOLD_STREAM")
    assert mean.sink("c0", {"n": 0}, header) is None  # weight 0: not folded at all
    ints, _ = encode_views({"w": torch.ones(3, dtype=torch.int64)})
    assert mean.sink("c0", {"n": 1}, ints) is None  # not floating point
    mean("c0", Reply(clone(bs[0]), {"n": 1}))
    other, _ = encode_views({"w": torch.ones(3)})
    assert mean.sink("c1", {"n": 1}, other) is None  # not the aggregate's layout: the plain path says why


def test_a_committed_reply_must_be_finished_and_of_its_node() -> None:
    bs = bundles(6)
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    got = stream(mean, 0, bs[0], 1000)
    with pytest.raises(ValueError, match="another fold"):
        mean("c1", Reply(got, {"n": N[0]}))
    header, _ = encode_views(bs[1])
    sink = mean.sink("c1", {"n": N[1]}, header)
    with pytest.raises(RuntimeError, match="once finished"):
        sink.commit()


def test_decode_buffers_are_counted_while_alive() -> None:
    gc.collect()
    base = BUFFERS.live
    header, chunks = encode_views({"w": torch.ones(1000)})
    dec = BundleDecoder(header)
    for c in chunks:
        dec.feed(c)
    got = dec.finish()
    assert BUFFERS.live - base == 4032  # 4000 bytes, rounded up to 64
    del got, dec
    gc.collect()
    assert BUFFERS.live == base


class Recorder:
    def __init__(self) -> None:
        self.aborted = 0

    def write(self, index: int, pos: int, data: memoryview) -> None: ...

    def finish(self) -> dict:
        return {}

    def abort(self) -> None:
        self.aborted += 1


def test_reply_gate_streams_only_the_head_and_aborts_what_was_not_committed() -> None:
    made: list[Recorder] = []

    def stream(node, head, header):
        made.append(Recorder())
        return made[-1]

    gate = ReplyGate(window=1, stream=stream)
    for cid in (1, 2, 3):
        gate.add(cid)
    head, header = pb.Frame(), pb.BundleHeader()
    assert gate.sink(2, "c2", head, header) is None  # not the next to fold: decoded whole
    s1 = gate.sink(1, "c1", head, header)
    assert s1 is made[0]
    gate.settled(1)  # never committed: aborted before the next reply may touch the aggregate
    assert s1.aborted == 1
    s2 = gate.sink(2, "c2", head, header)
    gate.open()
    assert s2.aborted == 1 and gate.sink(3, "c3", head, header) is None
    assert ReplyGate(0).sink(1, "c1", head, header) is None  # no stream: always decoded


def test_a_payload_received_as_a_byte_stream_folds_the_same() -> None:
    """``BundleDecoder.fill`` (a transport that carries the payload as plain bytes) hands the sink its pieces too."""
    import io

    bs = bundles(7)
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    for i, b in enumerate(bs):
        header, chunks = encode_views(b, 4096)
        raw = io.BytesIO(b"".join(bytes(c.data) for c in chunks))
        dec = BundleDecoder(header, sink=mean.sink(f"c{i}", {"n": N[i]}, header))
        dec.fill(lambda view, raw=raw: raw.readinto(view[:777]))  # short reads: pieces end anywhere
        mean(f"c{i}", Reply(dec.finish(), {"n": N[i]}))
    assert same(mean.result(), plain(bs, range(4), sum(N)))


def test_without_a_temporary_file_the_undo_log_is_kept_in_memory(monkeypatch) -> None:
    from fedhop.common.wire import fold

    def no_file(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fold.tempfile, "TemporaryFile", no_file)
    bs = bundles(8)
    mean = WeightedMean(lambda node, r: r.scalars["n"], sum(N))
    for i in (0, 1):
        mean(f"c{i}", Reply(stream(mean, i, bs[i], 1000), {"n": N[i]}))
    assert stream(mean, 2, bs[2], 1000, corrupt=True) is None  # undone from memory
    mean("c3", Reply(stream(mean, 3, bs[3], 1000), {"n": N[3]}))
    assert mean.undo.restored_total > 0
    assert same(mean.result(), plain(bs, [0, 1, 3], sum(N)))
