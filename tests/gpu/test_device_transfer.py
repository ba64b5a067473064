"""Transfer between device memory and the wire: a bundle of CUDA tensors encoded by the wire codec and decoded, then
moved back to the GPU as a node does (``messages.on_host`` / ``messages.to_device``), is bit-exact for every dtype
the wire carries, through both of the codec's host paths: the pinned one (``common/wire/staging.py``: CUDA tensors
copied into a pinned staging buffer kept across bundles; a CUDA receiver decodes into a pinned buffer and moves it
with ``non_blocking=True`` and a synchronisation) and the pageable one (bundles under ``staging.PINNED_MIN_BYTES``,
or pinning off). The timing test prints each step's throughput for a 256 MiB model: the codec's encode and
decode + to_device through pinned buffers next to the pageable path and the test's own prototype rows (a plain
device-to-host copy into pageable and into pinned host memory, pinned staging by hand).

Run by `make test-gpu`; skipped where torch sees no CUDA device."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from fedhop.common.wire import staging
from fedhop.common.wire.codec import BundleDecoder, decode, encode_views
from fedhop.common.wire.messages import on_host, to_device
from tests.gpu.gpuutil import cuda_only

pytestmark = cuda_only

CUDA = torch.device("cuda:0")


def _bundle() -> dict[str, torch.Tensor]:
    g = torch.Generator(device=CUDA).manual_seed(3)
    w = torch.randn(257, 129, generator=g, device=CUDA)
    return {
        "fc.weight": w,
        "fc.weight.T": w.t(),  # not contiguous: the codec's general path
        "bf16": torch.randn(1000, generator=g, device=CUDA).to(torch.bfloat16),
        "f16": torch.randn(33, 7, generator=g, device=CUDA).to(torch.float16),
        "f64": torch.randn(5, generator=g, device=CUDA, dtype=torch.float64),
        "i64": torch.randint(-2**40, 2**40, (17,), generator=g, device=CUDA),
        "u8": torch.randint(0, 256, (4097,), generator=g, device=CUDA, dtype=torch.uint8),
        "bool": torch.rand(31, generator=g, device=CUDA) > 0.5,
        "scalar": torch.tensor(-0.0, device=CUDA),
        "nan": torch.tensor([float("nan"), float("inf"), -float("inf")], device=CUDA),
        "empty": torch.empty(0, 3, device=CUDA),
    }


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits, NaNs and signed zeros included."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        width = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.contiguous().view(width).cpu(), b.contiguous().view(width).cpu())
    return torch.equal(a.cpu(), b.cpu())


@pytest.fixture
def fresh_staging() -> Iterator[None]:
    """A fresh process's staging state (no buffers kept, not yet a CUDA receiver), restored afterwards."""
    staging.reset()
    yield
    staging.reset()


@contextmanager
def pageable() -> Iterator[None]:
    """The codec's pageable host path for every bundle (as before pinned staging was built)."""
    saved = staging.PINNED_MIN_BYTES
    staging.PINNED_MIN_BYTES = 1 << 62
    try:
        yield
    finally:
        staging.PINNED_MIN_BYTES = saved


@pytest.mark.parametrize("path", ["pinned", "pageable"])
def test_cuda_bundle_round_trips_bit_exactly(path: str, monkeypatch: pytest.MonkeyPatch, fresh_staging: None) -> None:
    pinned = path == "pinned"
    monkeypatch.setattr(staging, "PINNED_MIN_BYTES", 0 if pinned else 1 << 62)  # the bundle is < 1 MiB
    bundle = _bundle()
    staged_bytes = sum(-(-v.numel() * v.element_size() // 64) * 64 for v in bundle.values())
    for i, name in enumerate(("encoded from CUDA tensors", "encoded after on_host")):
        source = bundle if i == 0 else on_host(bundle)
        if i == 1:
            assert all(v.is_pinned() == pinned for v in source.values() if v.numel()), name
        header, chunks = encode_views(source, 4096)
        assert staging.held().staging_live == (staged_bytes if pinned else 0), name
        decoded = decode(header, chunks)
        # the first to_device to CUDA makes this process a CUDA receiver: its next decode buffers are pinned
        assert all(v.is_pinned() == (pinned and i == 1) for v in decoded.values() if v.numel()), name
        back = to_device(decoded, CUDA)
        assert list(back) == list(bundle), name
        for k, v in bundle.items():
            assert back[k].device == CUDA, (name, k)
            assert _same_bits(back[k], v), f"{name} ({path}): {k} changed on the way"
        del source, header, chunks, decoded, back  # the buffers go back for the next bundle
    held = staging.held()
    assert held.disabled is None, held.disabled
    assert held.total == (staged_bytes + held.decode_idle if pinned else 0)  # one buffer of each kind, kept idle


def _median_s(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def test_device_transfer_throughput_256mib(fresh_staging: None) -> None:
    n = 64 << 20  # 64 Mi float32 = 256 MiB, as tests/bench/bench_transfer.py
    model = {f"layer{i}.weight": torch.randn(n // 4, device=CUDA) for i in range(4)}
    nbytes = sum(v.numel() * 4 for v in model.values())
    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in model.items()}
    chunk = 1 << 20

    def d2h_pageable() -> dict[str, torch.Tensor]:
        return {k: v.cpu() for k, v in model.items()}

    touched = d2h_pageable()  # pageable host tensors whose pages are already mapped

    def d2h_pageable_reused() -> None:
        for k, v in model.items():
            touched[k].copy_(v)

    def d2h_pinned() -> None:
        for k, v in model.items():
            pinned[k].copy_(v, non_blocking=True)

    def h2d_pinned() -> None:
        for v in pinned.values():
            v.to(CUDA, non_blocking=True)

    def encode_all() -> list:
        header, chunks = encode_views(model, chunk)
        return [header, list(chunks)]

    def encode_pageable() -> list:
        with pageable():
            return encode_all()

    def encode_pinned_staging() -> list:
        d2h_pinned()
        torch.cuda.synchronize()
        header, chunks = encode_views(pinned, chunk)
        return [header, list(chunks)]

    def send_path() -> list:  # what a node does: on_host (the scatter's snapshot), then the encoder
        header, chunks = encode_views(on_host(model), chunk)
        return [header, list(chunks)]

    staged = on_host(model)
    assert all(v.is_pinned() for v in staged.values()), "the codec's staging buffer is not pinned"
    del staged
    encoded = encode_pageable()  # its chunks are views of pageable copies: the staging buffer stays free
    assert encode_pinned_staging()[0] == encoded[0]  # same header, checksum included
    assert encode_all()[0] == encoded[0]

    def decode_all() -> dict[str, torch.Tensor]:
        dec = BundleDecoder(encoded[0])
        for c in encoded[1]:
            dec.feed(c)
        return dec.finish()

    def decode_pageable() -> dict[str, torch.Tensor]:
        with pageable():
            return decode_all()

    def receive() -> dict[str, torch.Tensor]:
        return to_device(decode_all(), CUDA)

    def receive_pageable() -> dict[str, torch.Tensor]:
        with pageable():
            return to_device(decode_all(), CUDA)

    decoded = decode_pageable()
    assert not any(v.is_pinned() for v in decoded.values())
    rows = {
        "device->host .cpu() (pageable)": _median_s(d2h_pageable),
        "device->host into reused pageable buffers (pages mapped)": _median_s(d2h_pageable_reused),
        "device->host into pinned buffers": _median_s(d2h_pinned),
        "codec encode of CUDA tensors, pageable (.cpu() + xxh64 + chunk views)": _median_s(encode_pageable),
        "the same through pinned buffers (the test's prototype)": _median_s(encode_pinned_staging),
        "codec encode of CUDA tensors, its pinned staging (kept across calls)": _median_s(encode_all),
        "on_host + codec encode (a node's send path), pinned staging": _median_s(send_path),
        "codec decode into a pageable buffer (1 MiB chunks + xxh64)": _median_s(decode_pageable),
        "host->device of decoded tensors (to_device, pageable)": _median_s(lambda: to_device(decoded, CUDA)),
        "host->device from pinned buffers": _median_s(h2d_pinned),
        "codec decode + to_device, pageable (as before)": _median_s(receive_pageable),
    }
    staging.receive_on(CUDA)  # what the first to_device above already said; the decode buffer is pinned from now on
    rows["codec decode into its pinned buffer (kept across calls)"] = _median_s(decode_all)
    rows["codec decode + to_device, pinned + non_blocking"] = _median_s(receive)
    received = decode_all()
    assert all(v.is_pinned() for v in received.values()), "the codec's decode buffer is not pinned"
    back = to_device(received, CUDA)
    del received
    for k, v in model.items():
        assert torch.equal(back[k], v), f"{k} changed on the way"
    held = staging.held()
    assert held.disabled is None, held.disabled
    assert held.staging_idle == held.decode_idle == nbytes and held.total == 2 * nbytes  # one bundle of each kind
    print(f"\n[gpu] transfer of a {nbytes / (1 << 20):.0f} MiB float32 model on {torch.cuda.get_device_name(0)} "
          f"(median of 5):")
    for what, s in rows.items():
        print(f"[gpu]   {what:72s} {s * 1e3:8.1f} ms  {nbytes / s / 1e9:6.2f} GB/s")
