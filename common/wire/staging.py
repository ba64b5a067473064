"""Pinned (page-locked) host buffers between CUDA tensors and the wire (issue 19, the GPU target).

A GPU node's bundles cross host memory on their way to and from the wire: the encoder reads a CUDA tensor's bytes
on the host, and a received bundle is decoded on the host and then moved to the device. Into fresh pageable memory
both copies are slow (measured on an H200, 256 MiB: device -> host 1.1-1.5 GB/s, host -> device 6.5 GB/s, against
~55 GB/s each way from and to pinned memory kept across rounds; docs/benchmarks.md, "GPU (H100/H200)"). This module
keeps those host buffers pinned and reuses them:

Encode (:func:`to_host`, called by ``messages.on_host`` and ``codec.encode_parts``)
    The CUDA tensors of a bundle are copied device -> host with ``non_blocking=True`` into ONE pinned staging buffer
    (each tensor at a multiple of 64 bytes), then the source devices' current streams are synchronised; the returned
    host tensors are views of that buffer, which the codec hashes and chunks as any CPU tensor. CPU tensors of the
    bundle are passed through as they are (``detach``), anything else (a sparse tensor, a non-tensor) unchanged, for
    the codec to refuse with its usual message.
Decode (:func:`decode_buffer`, called by ``codec.BundleDecoder``; :func:`to_device`, by ``messages.to_device``)
    Once a process has moved a received bundle to a CUDA device (:func:`receive_on`; ``to_device`` says it), the
    decoder's buffer of every later bundle is pinned; ``to_device`` moves each tensor with ``non_blocking=True`` and
    synchronises the device's current stream before it returns, so the tensors are complete before anyone uses them
    and the host buffer may be reused as soon as the caller drops it.

Which memory, and how much
    The buffers come from torch's caching host allocator (``torch.empty(n, dtype=uint8, pin_memory=True)``), not
    from a mapping of our own registered with ``cudaHostRegister``: torch pins with ``cudaHostAlloc``, raises a
    plain ``RuntimeError`` when pinning fails and clears CUDA's error state (a failed raw ``cudaHostRegister``
    can leave its error for the next kernel launch check to report as if the kernel had failed), and it knows the
    memory is pinned (``is_pinned``, asynchronous copies). Its price: it rounds each block up to a power of two
    (a 256 MiB model pins 256 MiB, a 100 MB one 128 MiB) and keeps freed blocks in its own cache, which
    :func:`release` empties.
    Bound: one staging buffer and one decode buffer per process, each the size of one bundle (rounded as above),
    in use or kept idle for the next bundle of the same size (a node sends and receives the same model every
    round: the pinning, ~as costly as the copy it saves, is paid once). A bundle that needs a buffer while its kind
    is in use (a second reply being decoded, two clients of one process staging at once) or that is smaller than
    :data:`PINNED_MIN_BYTES` takes the pageable path, as before this module. A buffer of another size replaces the
    kept one. :func:`release` drops the kept buffers (``codec.release_pool``, which the spill calls at every
    drop, does not: it empties the pageable pool only).
    CPU nodes never reach any of this: no CUDA tensor to stage, no CUDA device to receive for.

Pinning can fail (locked-memory limits, a host short of memory). Then this module says so ONCE in the log (a
warning naming the error) and the process uses pageable memory from then on: a named fallback, bits unchanged.

The allocator is :data:`ALLOCATOR` (a :class:`HostAllocator`): tests on machines without CUDA replace it with one
that returns ordinary host tensors and records its calls (tests/unit/test_pinned_staging.py).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

log = logging.getLogger(__name__)

PINNED_MIN_BYTES = 1 << 20  # smaller bundles stay pageable: their copies cost less than keeping pinned memory
_ALIGN = 64  # every staged tensor starts at a multiple of this many bytes


class HostAllocator(Protocol):
    """Where pinned host memory comes from, and how a device's queued copies are waited for."""

    def pinned(self, nbytes: int) -> torch.Tensor:
        """A 1-D uint8 CPU tensor of ``nbytes`` page-locked bytes; raises (RuntimeError, MemoryError) if it cannot."""
        ...

    def synchronize(self, device: torch.device) -> None:
        """Wait until every copy queued on ``device``'s current stream has completed."""
        ...

    def empty_cache(self) -> None:
        """Give the allocator's cached, unused pinned blocks back to the system."""
        ...

    def cuda_ready(self) -> bool:
        """Whether this process may hold CUDA tensors at all (False: every bundle is on the host; nothing to scan)."""
        ...


class TorchPinned:
    """The real allocator: torch's caching host allocator and the device's current stream."""

    def cuda_ready(self) -> bool:
        return torch.cuda.is_initialized()  # a CUDA tensor initialises CUDA (torch.cuda._lazy_init) first

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.current_stream(device).synchronize()

    def empty_cache(self) -> None:
        empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)  # newer torch
        if empty is None:
            empty = getattr(torch._C, "_host_emptyCache", None)  # older torch
        if empty is not None:
            empty()


ALLOCATOR: HostAllocator = TorchPinned()


@dataclass(frozen=True)
class Held:
    """What this process holds of pinned buffers: ``live`` in use (their tensors alive), ``idle`` kept for the next
    bundle of their size; bytes as requested (torch's allocator rounds each block up to a power of two)."""

    staging_live: int
    staging_idle: int
    decode_live: int
    decode_idle: int
    disabled: str | None  # why this process stopped pinning, or None

    @property
    def total(self) -> int:
        return self.staging_live + self.staging_idle + self.decode_live + self.decode_idle


_lock = threading.RLock()  # RLock: a buffer's finalizer may run on this thread while it holds the lock (GC)
_disabled: str | None = None  # set once pinning failed: the process uses pageable memory from then on
_receiving: torch.device | None = None  # the CUDA device received bundles go to (see receive_on)


class _Keeper:
    """One pinned buffer of one kind (staging or decode): lent out to one bundle at a time, kept idle between."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.idle: torch.Tensor | None = None
        self.live = 0  # bytes of the buffer lent out (0: none)
        self.generation = 0  # bumped by release(): a buffer lent out before comes back to be dropped, not kept

    def take(self, nbytes: int) -> np.ndarray | None:
        """The pinned buffer as a uint8 array of ``nbytes`` (back to this keeper when the array and every tensor made
        from it are gone), or None: the caller uses pageable memory."""
        with _lock:
            if _disabled is not None or self.live:
                return None
            buf, stale = self.idle, None
            if buf is not None and buf.numel() != nbytes:
                buf, stale = None, buf
            self.idle = None
            self.live = nbytes
            generation = self.generation
        if stale is not None:  # one buffer per kind: the kept one of another size goes (torch's cache emptied too)
            del stale
            ALLOCATOR.empty_cache()
        if buf is None:
            try:
                buf = ALLOCATOR.pinned(nbytes)
            except (RuntimeError, MemoryError, OSError) as e:
                with _lock:
                    self.live = 0
                _disable(f"pinning {nbytes} bytes for {self.kind} failed: {e}")
                return None
        arr = buf.numpy()  # keeps buf alive; torch.from_numpy(arr) and its views keep arr alive
        weakref.finalize(arr, self._give_back, buf, generation)
        return arr

    def _give_back(self, buf: torch.Tensor, generation: int) -> None:
        with _lock:
            self.live = 0
            if generation == self.generation and _disabled is None:
                self.idle = buf

    def drop(self) -> int:
        with _lock:
            held = self.idle.numel() if self.idle is not None else 0
            self.idle = None
            self.generation += 1
        return held


_staging = _Keeper("staging")
_decode = _Keeper("decode")


def _disable(why: str) -> None:
    global _disabled
    with _lock:
        first = _disabled is None
        if first:
            _disabled = why
    if first:
        log.warning("pinned host memory unavailable (%s): this process moves tensors between CUDA and the wire "
                    "through pageable memory from now on (same bits, slower copies)", why)
    release()


def _staged(v: object) -> bool:
    return isinstance(v, torch.Tensor) and v.is_cuda and v.layout == torch.strided and v.numel() > 0


def to_host(bundle: Mapping[str, Any]) -> dict[str, Any] | None:
    """``bundle`` with its CUDA tensors copied into the pinned staging buffer (views of it, in bundle order); CPU
    tensors ``detach`` ed, other values unchanged. None when there is nothing to stage this way (no CUDA tensor,
    fewer than :data:`PINNED_MIN_BYTES` of them, the buffer in use, pinning off): the caller copies as before."""
    if _disabled is not None or not ALLOCATOR.cuda_ready():  # a CPU node: no scan, no cost
        return None
    spans: dict[str, tuple[int, int]] = {}
    at = 0
    for k, v in bundle.items():
        if _staged(v):
            assert isinstance(v, torch.Tensor)
            n = v.numel() * v.element_size()
            spans[k] = (at, n)
            at += -(-n // _ALIGN) * _ALIGN
    if at < max(PINNED_MIN_BYTES, 1):
        return None
    arr = _staging.take(at)
    if arr is None:
        return None
    base = torch.from_numpy(arr)
    out: dict[str, Any] = {}
    devices: dict[torch.device, None] = {}
    try:
        with torch.no_grad():
            for k, v in bundle.items():
                if k in spans:
                    assert isinstance(v, torch.Tensor)
                    start, n = spans[k]
                    dst = base[start:start + n].view(v.dtype).view(v.shape)
                    devices[v.device] = None
                    dst.copy_(v.detach(), non_blocking=True)
                    out[k] = dst
                elif isinstance(v, torch.Tensor) and not v.is_cuda:
                    out[k] = v.detach()
                elif isinstance(v, torch.Tensor) and v.layout == torch.strided:  # an empty CUDA tensor
                    out[k] = v.detach().to("cpu")
                else:
                    out[k] = v
    finally:
        for d in devices:  # before anyone reads the views, or the buffer goes back on an error
            ALLOCATOR.synchronize(d)
    return out


def decode_buffer(size: int) -> np.ndarray | None:
    """A pinned decode buffer of ``size`` bytes where this process receives for a CUDA device (:func:`receive_on`),
    else None (the codec allocates pageable memory, as on every CPU node)."""
    if _receiving is None or size < max(PINNED_MIN_BYTES, 1):
        return None
    return _decode.take(size)


def receive_on(device: torch.device) -> None:
    """Received bundles of this process go to ``device``: a CUDA device turns pinned decode buffers on."""
    global _receiving
    if device.type == "cuda" and _receiving is None:
        with _lock:
            _receiving = device


def to_device(bundle: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A received (host) bundle on ``device``. To a CUDA device: every copy queued with ``non_blocking=True``
    (asynchronous from a pinned decode buffer), then the device's current stream synchronised, so the tensors are
    complete when this returns and their host buffer may be reused; this process's next decode buffers are pinned."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in bundle.items()}
    receive_on(device)
    try:
        return {k: v.to(device, non_blocking=True) for k, v in bundle.items()}
    finally:
        ALLOCATOR.synchronize(device)


def held() -> Held:
    """The pinned buffers this process holds now (:class:`Held`)."""
    with _lock:
        return Held(
            staging_live=_staging.live,
            staging_idle=_staging.idle.numel() if _staging.idle is not None else 0,
            decode_live=_decode.live,
            decode_idle=_decode.idle.numel() if _decode.idle is not None else 0,
            disabled=_disabled,
        )


def release() -> int:
    """Drop the kept (idle) pinned buffers and empty torch's host cache; how many bytes were kept. A buffer in use
    now is dropped when its bundle is freed, not kept."""
    held_bytes = _staging.drop() + _decode.drop()
    if held_bytes:
        ALLOCATOR.empty_cache()
    return held_bytes


def reset() -> None:
    """Back to a fresh process's state (for tests): buffers released, pinning allowed, no CUDA receiver."""
    global _disabled, _receiving
    release()
    with _lock:
        _disabled = None
        _receiving = None
