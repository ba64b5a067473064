"""Transfer between device memory and the wire: a bundle of CUDA tensors encoded by the wire codec (which reads
CUDA tensors through a host copy) and decoded (into a host buffer), then moved back to the GPU as a node does
(``messages.on_host`` / ``messages.to_device``), is bit-exact for every dtype the wire carries. The timing test
prints each step's throughput for a 256 MiB model next to a plain device-to-host copy into pageable and into pinned
host memory (the codec does not use pinned buffers: its encoder copies with ``.cpu()``, its decoder fills a fresh
pageable buffer).

Run by `make test-gpu`; skipped where torch sees no CUDA device."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

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


def test_cuda_bundle_round_trips_bit_exactly() -> None:
    bundle = _bundle()
    for name, via_host in (("encoded from CUDA tensors", bundle), ("encoded after on_host", on_host(bundle))):
        header, chunks = encode_views(via_host, 4096)
        back = to_device(decode(header, chunks), CUDA)
        assert list(back) == list(bundle), name
        for k, v in bundle.items():
            assert back[k].device == CUDA, (name, k)
            assert _same_bits(back[k], v), f"{name}: {k} changed on the way"


def _median_s(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def test_device_transfer_throughput_256mib() -> None:
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

    def encode_pinned_staging() -> list:
        d2h_pinned()
        torch.cuda.synchronize()
        header, chunks = encode_views(pinned, chunk)
        return [header, list(chunks)]

    encoded = encode_all()
    assert encode_pinned_staging()[0] == encoded[0]  # same header, checksum included

    def decode_all() -> dict[str, torch.Tensor]:
        dec = BundleDecoder(encoded[0])
        for c in encoded[1]:
            dec.feed(c)
        return dec.finish()

    decoded = decode_all()
    rows = {
        "device->host .cpu() (pageable)": _median_s(d2h_pageable),
        "device->host into reused pageable buffers (pages mapped)": _median_s(d2h_pageable_reused),
        "device->host into pinned buffers": _median_s(d2h_pinned),
        "codec encode of CUDA tensors (host copy + xxh64 + chunk views)": _median_s(encode_all),
        "the same through pinned staging buffers (not the codec's path)": _median_s(encode_pinned_staging),
        "codec decode (1 MiB chunks into a fresh buffer + xxh64)": _median_s(decode_all),
        "host->device of decoded tensors (to_device, pageable)": _median_s(lambda: to_device(decoded, CUDA)),
        "host->device from pinned buffers": _median_s(h2d_pinned),
    }
    back = to_device(decoded, CUDA)
    for k, v in model.items():
        assert torch.equal(back[k], v), f"{k} changed on the way"
    print(f"\n[gpu] transfer of a {nbytes / (1 << 20):.0f} MiB float32 model on {torch.cuda.get_device_name(0)} "
          f"(median of 5):")
    for what, s in rows.items():
        print(f"[gpu]   {what:68s} {s * 1e3:8.1f} ms  {nbytes / s / 1e9:6.2f} GB/s")
