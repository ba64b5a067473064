"""Which path a bundle takes between CUDA and the wire (common/wire/staging.py), on a machine without CUDA.

The pinned allocator is replaced by one that hands out ordinary host tensors and records its calls (the seam
``staging.ALLOCATOR``), and CUDA tensors are stood in for by CPU tensors that say they are on cuda:0 (copies from
them are real copies). What is tested is the real code around the allocator: which tensors are staged, that CPU
bundles never reach the allocator, that the bits survive, the bound (one staging and one decode buffer per process,
reused across bundles), the fallback when pinning fails, and release. The same paths on a real GPU, with
``is_pinned`` and throughput: tests/gpu/test_device_transfer.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from fedhop.common.wire import codec, staging
from fedhop.common.wire.codec import BUFFERS, BundleDecoder, decode, encode_parts, encode_views
from fedhop.common.wire.messages import on_host, to_device

MIB = 1 << 20


class FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on cuda:0 (torch functions see a plain CPU tensor)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def cuda(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(FakeCuda)


class RecordingHost:
    """The test's allocator: ordinary host tensors; every call recorded; ``fail`` makes pinning raise."""

    def __init__(self) -> None:
        self.pinned_calls: list[int] = []
        self.synced: list[torch.device] = []
        self.emptied = 0
        self.fail: str | None = None
        self.buffers: list[torch.Tensor] = []

    def pinned(self, nbytes: int) -> torch.Tensor:
        self.pinned_calls.append(nbytes)
        if self.fail is not None:
            raise RuntimeError(self.fail)
        buf = torch.empty(nbytes, dtype=torch.uint8)
        self.buffers.append(buf)
        return buf

    def synchronize(self, device: torch.device) -> None:
        self.synced.append(device)

    def empty_cache(self) -> None:
        self.emptied += 1

    def cuda_ready(self) -> bool:
        return True  # as if CUDA were initialised: CPU bundles are scanned, and must still not be staged

    def owns(self, t: torch.Tensor) -> bool:
        """``t`` lies in one of the buffers handed out."""
        p = t.data_ptr()
        return any(b.data_ptr() <= p < b.data_ptr() + b.numel() for b in self.buffers)


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingHost]:
    rec = RecordingHost()
    staging.reset()
    monkeypatch.setattr(staging, "ALLOCATOR", rec)
    yield rec
    staging.reset()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        width = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
    return torch.equal(a, b)


def _model(n: int = 2 * MIB) -> dict[str, torch.Tensor]:
    """Plain CPU tensors of every dtype the wire carries (n bytes of float32 first), odd shapes and values."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(257, 129, generator=g)
    return {
        "big": torch.randn(n // 4, generator=g),
        "w.T": w.t(),  # not contiguous
        "bf16": torch.randn(1000, generator=g).to(torch.bfloat16),
        "f16": torch.randn(33, 7, generator=g).to(torch.float16),
        "f64": torch.randn(5, generator=g, dtype=torch.float64),
        "i64": torch.randint(-2**40, 2**40, (17,), generator=g),
        "u8": torch.randint(0, 256, (4097,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(31, generator=g) > 0.5,
        "scalar": torch.tensor(-0.0),
        "nan": torch.tensor([float("nan"), float("inf"), -float("inf")]),
        "empty": torch.empty(0, 3),
    }


def _staged_bytes(bundle: dict[str, torch.Tensor]) -> int:
    return sum(-(-v.numel() * v.element_size() // 64) * 64 for v in bundle.values() if v.numel())


def test_cpu_bundles_never_reach_the_pinned_path(host: RecordingHost) -> None:
    model = _model()
    out = on_host(model)
    assert all(out[k].data_ptr() == v.data_ptr() for k, v in model.items() if v.numel())  # no copy, as before
    header, chunks = encode_views(model, MIB)
    back = decode(header, chunks)
    assert to_device(back, torch.device("cpu")) is back
    assert all(_same_bits(back[k], v) for k, v in model.items())
    assert host.pinned_calls == [] and host.synced == []
    assert staging.held() == staging.Held(0, 0, 0, 0, None)


def test_cuda_tensors_go_through_one_staging_buffer_bit_exactly(host: RecordingHost) -> None:
    model = _model()
    mixed = {k: cuda(v) for k, v in model.items()}
    mixed["on cpu"] = cpu = torch.arange(10.0)
    out = on_host(mixed)
    assert host.pinned_calls == [_staged_bytes(model)]  # one buffer for every CUDA tensor of the bundle
    assert host.synced == [torch.device("cuda", 0)]  # the copies are waited for before the views are handed out
    assert list(out) == list(mixed)
    for k, v in model.items():
        assert type(out[k]) is torch.Tensor and _same_bits(out[k], v), k
        assert host.owns(out[k]) == (v.numel() > 0), k  # an empty tensor needs no bytes of the buffer
        if v.numel():
            assert (out[k].data_ptr() - host.buffers[0].data_ptr()) % 64 == 0, k  # each at a multiple of 64
    assert out["on cpu"].data_ptr() == cpu.data_ptr()  # CPU tensors of a mixed bundle are not copied
    assert staging.held().staging_live == _staged_bytes(model)
    # what the codec makes of the staged bundle is what it makes of the same tensors on the CPU
    assert encode_parts(out)[0] == encode_parts({**model, "on cpu": cpu})[0]


def test_the_encoder_stages_cuda_tensors_itself(host: RecordingHost) -> None:
    model = _model()
    header, chunks = encode_views({k: cuda(v) for k, v in model.items()}, MIB)
    assert host.pinned_calls == [_staged_bytes(model)]
    assert header == encode_views(model, MIB)[0]  # same header, checksum included
    back = decode(header, chunks)
    assert all(_same_bits(back[k], v) for k, v in model.items())


def test_small_bundles_stay_pageable(host: RecordingHost) -> None:
    small = {"w": cuda(torch.randn(1000))}
    out = on_host(small)
    assert torch.equal(out["w"], small["w"].detach())
    assert host.pinned_calls == [] and not host.owns(out["w"])


def test_the_staging_buffer_is_reused_and_bounded(host: RecordingHost) -> None:
    model = {k: cuda(v) for k, v in _model().items()}
    size = _staged_bytes(_model())
    for _ in range(3):  # a node sends the same model every round: pinned once
        out = on_host(model)
        assert host.owns(out["big"])
        del out
    assert host.pinned_calls == [size]
    assert staging.held().staging_idle == size
    first = on_host(model)
    second = on_host(model)  # the buffer is in use: the second bundle is copied as before, nothing more pinned
    assert host.pinned_calls == [size] and not host.owns(second["big"])
    assert _same_bits(second["big"], first["big"])
    assert staging.held().total == size  # never more than one bundle's buffer
    del first, second
    other = on_host({"w": cuda(torch.randn(MIB))})  # another size replaces the kept buffer
    assert host.pinned_calls == [size, 4 * MIB] and host.emptied == 1
    del other
    assert staging.held() == staging.Held(0, 4 * MIB, 0, 0, None)


def test_a_bundle_in_flight_keeps_its_buffer(host: RecordingHost) -> None:
    """The chunks stream lazily from the staging buffer: it is not lent again while a chunk iterator needs it."""
    model = {k: cuda(v) for k, v in _model().items()}
    header, chunks = encode_views(model, MIB)
    first = next(chunks)
    assert on_host(model)["big"].data_ptr() != host.buffers[0].data_ptr()  # pageable: the buffer is in use
    back = decode(header, [first, *chunks])
    assert all(_same_bits(back[k], v.detach()) for k, v in model.items())
    assert host.pinned_calls == [_staged_bytes(_model())]


def test_decode_buffers_are_pinned_only_for_a_cuda_receiver(host: RecordingHost) -> None:
    model = _model()
    header, views = encode_parts(model, MIB)
    payload = b"".join(views)

    def received() -> dict[str, torch.Tensor]:
        dec = BundleDecoder(header)
        dec.fill(_reader(payload))
        return dec.finish()

    size = codec.bundle_layout(header).size
    assert not host.owns(received()["big"]) and host.pinned_calls == []  # not a CUDA receiver yet
    staging.receive_on(torch.device("cpu"))
    assert host.pinned_calls == [] and not host.owns(received()["big"])
    staging.receive_on(torch.device("cuda", 0))  # what to_device(bundle, cuda) says
    live = BUFFERS.live
    back = received()
    assert host.pinned_calls == [size] and host.owns(back["big"])
    assert BUFFERS.live == live + size  # counted as any decode buffer
    assert all(_same_bits(back[k], v) for k, v in model.items())
    assert staging.held().decode_live == size
    second = received()  # a second bundle while the first is alive: pageable
    assert not host.owns(second["big"]) and host.pinned_calls == [size]
    del back, second
    assert staging.held().decode_idle == size
    assert host.owns(received()["big"]) and host.pinned_calls == [size]  # the next round's bundle reuses it
    small = {"w": torch.randn(100)}
    h, c = encode_views(small, MIB)
    assert not host.owns(decode(h, c)["w"]) and host.pinned_calls == [size]


def test_the_fold_buffer_is_never_pinned(host: RecordingHost) -> None:
    staging.receive_on(torch.device("cuda", 0))
    buf = codec.allocate(4 * MIB)  # what fold.py allocates for its aggregate
    assert host.pinned_calls == [] and buf.nbytes == 4 * MIB


def test_release_drops_the_kept_buffers(host: RecordingHost) -> None:
    model = {k: cuda(v) for k, v in _model().items()}
    size = _staged_bytes(_model())
    on_host(model)
    staging.receive_on(torch.device("cuda", 0))
    header, chunks = encode_views(_model(), MIB)
    decoded = decode(header, chunks)
    decode_size = staging.held().decode_live
    assert decode_size > 0 and staging.held().staging_idle == size
    codec.release_pool()  # the pageable pool only (the spill calls it at every drop): the pinned buffers stay
    assert staging.held().staging_idle == size and host.emptied == 0
    assert staging.release() >= size  # the idle staging buffer
    assert staging.held() == staging.Held(0, 0, decode_size, 0, None) and host.emptied == 1
    del decoded  # a buffer in use at the release is dropped when freed, not kept
    assert staging.held().total == 0
    on_host(model)
    assert host.pinned_calls == [size, decode_size, size]


def test_a_failed_pin_is_logged_once_and_pageable_memory_used(host: RecordingHost,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    host.fail = "cudaErrorMemoryAllocation: out of memory"
    model = _model()
    staging.receive_on(torch.device("cuda", 0))
    with caplog.at_level(logging.WARNING, logger=staging.__name__):
        for _ in range(3):
            out = on_host({k: cuda(v) for k, v in model.items()})
            assert all(_same_bits(out[k], v) for k, v in model.items())
            header, chunks = encode_views(model, MIB)
            back = decode(header, chunks)
            assert all(_same_bits(back[k], v) for k, v in model.items())
    assert host.pinned_calls == [_staged_bytes(model)]  # tried once, then never again
    warnings = [r for r in caplog.records if r.name == staging.__name__]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "pinned host memory unavailable" in warnings[0].getMessage()
    assert "out of memory" in warnings[0].getMessage() and "pageable" in warnings[0].getMessage()
    assert staging.held().disabled is not None and staging.held().total == 0


def _reader(payload: bytes):
    pos = 0

    def recv_into(view: memoryview) -> int:
        nonlocal pos
        n = min(len(view), len(payload) - pos, 300_000)
        view[:n] = payload[pos:pos + n]
        pos += n
        return n

    return recv_into


def test_without_cuda_initialised_nothing_is_scanned_or_pinned() -> None:
    """The real allocator: in a process where CUDA was never initialised (a CPU node; this machine) no tensor can
    be on CUDA, so the bundle is not even looked at (a tensor that only says so is not staged either)."""
    staging.reset()
    assert isinstance(staging.ALLOCATOR, staging.TorchPinned)
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this process")
    assert staging.to_host({"w": cuda(torch.randn(MIB))}) is None
    assert staging.held() == staging.Held(0, 0, 0, 0, None)
