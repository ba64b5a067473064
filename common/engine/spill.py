"""A round's starting model out of a node's resident memory while the round runs (issue 19): the PS's, an edge's.

A FedAvg round at the PS holds its starting model M0 (the state it was given: sent to every child, kept for a
retry and for a round without a usable reply) beside the aggregate being folded; an edge holds the model its
parent sent (decoded from the request, sent to its clients, kept for a child's resend and for a round without a
usable reply) beside its own aggregate. That model is read only while the requests go out and again if the
round is redone or ends without a usable reply, yet many holders keep a reference to it (the round loop or the
task handler, the algorithm's locals, the scatter's calls). :func:`spill_state` moves its bytes instead of its
references: the tensors are written into an unlinked temporary file (``tempfile``'s directory, ``TMPDIR``, as
the fold's undo log) and each tensor is pointed at a shared mapping of that file (``Tensor.set_``: the same
tensor objects, shapes, strides and bytes; each storage's span sits at the same address modulo the page size
as before, so every kernel sees the alignment it saw). The anonymous copy is freed. :meth:`Spill.drop` then
takes the mapping's pages out of the process's resident memory (``madvise(MADV_DONTNEED)``): a later read (a
retry, an empty round, a resend) faults the same bytes back from the page cache, so a drop is safe at any
moment, even during a send. A swap must happen where no other thread reads the tensors' memory: the PS's round
loop spills at each round's start, between rounds (no reader of ``ctx.state`` runs then); an edge spills the
model of each of its scatters before the scatter sends it (``edge/comm.py``; the task handler's thread is
the only reader then). The drop comes through the node's Comm (:func:`dropping`, ``BaseComm.model_sent``)
when the first reply of a scatter starts to be folded (its child received its request: in practice every
request has left by then; one that has not reads its remaining pages back and the next drop takes them out
again), before each reply is settled and when a scatter ends. At the run's end the PS's final model goes the
same way once ``model.pt`` is written (``results._save_model``).

Cost: one write of the model per round into the page cache (memory the kernel may reclaim, being file pages,
but memory: with ``TMPDIR`` on a tmpfs the bytes stay in RAM as shared memory, out of the node's RSS only).
Applies where :func:`spill_state` is asked to: the networked engine's PS and edges, for an algorithm that never
changes the state's tensors in place (``Algorithm.round_replaces_tensors``), when they hold at least
``transport.spill_model_bytes`` bytes (:func:`spiller`).
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import os
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from pydantic import BaseModel

from fedhop.common.engine.api import Algorithm
from fedhop.common.engine.base import BaseComm
from fedhop.common.spec import TransportSpec
from fedhop.common.wire.codec import release_pool

log = logging.getLogger("fedhop.engine")

PAGE = mmap.PAGESIZE
CAN_DROP = hasattr(mmap.mmap, "madvise") and hasattr(mmap, "MADV_DONTNEED")


class Spill:
    """State tensors whose bytes live in one shared mapping of an unlinked file (:func:`spill_state`).

    The mapping lives as long as any tensor that points into it (the tensors hold the buffer); this object
    only drops its pages (it holds the mapping weakly: once its tensors are gone, there is nothing to drop).
    Safe to call from any thread."""

    def __init__(self, mm: mmap.mmap, nbytes: int, tensors: int, address: int, also: Spill | None = None) -> None:
        self._mm = weakref.ref(mm)
        self._also = also  # an earlier spill that holds the rest of the state's tensors
        self.nbytes = nbytes  # the tensors' bytes (their storages' spans) written into the file
        self.tensors = tensors  # how many tensor objects point into it
        self.address = address  # where the mapping starts in this process (for /proc/self/smaps)
        self.length = len(mm)
        self.drops = 0

    @property
    def alive(self) -> bool:
        """Whether a tensor still points into the mapping."""
        return self._mm() is not None

    def drop(self) -> None:
        """Take the mapping's pages out of this process's resident memory (their bytes stay in the file)."""
        mm = self._mm()
        if mm is not None:
            mm.madvise(mmap.MADV_DONTNEED)
            self.drops += 1
        del mm
        release_pool()  # a buffer the state's tensors left may have been freed since the spill (see spill_state)
        if self._also is not None:
            self._also.drop()


def state_tensors(value: Any) -> list[torch.Tensor]:
    """The tensor objects a state value holds (the containers ``state_io`` saves walked), each once."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        elif isinstance(v, BaseModel):
            stack.extend(getattr(v, k) for k in type(v).model_fields)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            stack.extend(getattr(v, f.name) for f in dataclasses.fields(v))
        elif isinstance(v, Mapping):
            stack.extend(v.values())
        elif isinstance(v, list | tuple | set | frozenset):
            stack.extend(v)
    return out


def _movable(t: torch.Tensor) -> bool:
    """A plain dense CPU tensor with bytes (what ``set_`` can point at a byte storage unchanged)."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" and t.layout == torch.strided
            and not t.is_quantized and not t.is_conj() and not t.is_neg() and t.numel() > 0)


def _with_bases(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The movable ``tensors`` and the base tensor of each that is a view (a view keeps its base, and so the
    base's storage, alive: moving the views alone would free nothing; moving the base with them keeps them its
    views), each once."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    for t in tensors:
        if not _movable(t):
            continue
        base = t._base
        for x in (t, base) if isinstance(base, torch.Tensor) and _movable(base) else (t,):
            if id(x) not in seen and x.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
                seen.add(id(x))
                out.append(x)
    return out


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [lo, hi) of its storage that ``t`` can read."""
    size = t.element_size()
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
    lo = t.storage_offset() * size
    return lo, lo + extent * size


def spill_bytes(transport: TransportSpec, engine: str) -> int:
    """The spill threshold a run's PS uses: ``transport.spill_model_bytes`` for the networked engine, 0 (never)
    for the in-process one, which holds every node's models anyway."""
    return transport.spill_model_bytes if engine == "network" else 0


class Spiller:
    """One node's spills, one run's: the round loop's (:meth:`spill` at each round's start) or an edge's (at
    each of its scatters, ``edge/comm.py``)."""

    def __init__(self, min_bytes: int) -> None:
        self.min_bytes = min_bytes
        self.last: Spill | None = None

    def spill(self, state: Any) -> Spill | None:
        """:func:`spill_state` of ``state``, whose tensors already in the last round's mapping stay there (a round
        that kept its starting model, e.g. no usable reply: a request of that round still being sent may be
        reading them)."""
        if self.min_bytes <= 0:
            return None
        s = spill_state(state, self.min_bytes, self.last)
        self.last = s
        return s


def spiller(algo: Algorithm, min_bytes: int) -> Spiller:
    """The spills of a node that runs ``algo``: at ``min_bytes`` (``transport.spill_model_bytes``; 0: never) for an
    algorithm that never changes its models' tensors in place (``round_replaces_tensors``), never for the others
    (their rounds write tensors in place, so the round loop clones the state for a retry: there is no model
    held only for reading to give back)."""
    return Spiller(min_bytes if algo.round_replaces_tensors else 0)


@contextmanager
def dropping(comm: BaseComm | None, spilled: Spill | None) -> Iterator[None]:
    """While inside: ``comm``'s :meth:`~BaseComm.model_sent` (a reply starts to be folded or is settled, a scatter
    ended) drops ``spilled``'s pages; nothing when either is None. The PS's round loop and an edge's scatters
    share it."""
    if comm is None or spilled is None:
        yield
        return
    comm.on_model_sent = spilled.drop
    try:
        yield
    finally:
        comm.on_model_sent = None


def spill_state(state: Any, min_bytes: int, previous: Spill | None = None) -> Spill | None:
    """Move the bytes of ``state``'s tensors into a file-backed shared mapping (see the module's docstring);
    None (nothing moved) when they hold fewer than ``min_bytes`` (0: never), this platform cannot drop pages,
    or the file cannot be written (logged; the round goes on with the state as it was). Tensors already in
    ``previous``'s mapping are not moved: ``previous`` is returned when they are all there, else the new
    spill drops its pages too."""
    spilled = _move(state, min_bytes, previous)
    if spilled is not None and spilled is not previous:
        # the buffers the tensors left are freed now (_move's references to them gone), and the codec keeps a freed
        # decode buffer for the next bundle of its size (codec.POOL_KEEP): resident memory, the model this spill
        # exists to give back
        release_pool()
    return spilled


def _move(state: Any, min_bytes: int, previous: Spill | None) -> Spill | None:
    """:func:`spill_state`'s work, whose locals hold the old storages until it returns."""
    if min_bytes <= 0 or not CAN_DROP:
        return None
    groups: dict[int, tuple[torch.UntypedStorage, list[torch.Tensor], int, int]] = {}
    kept = 0
    for t in _with_bases(state_tensors(state)):
        storage = t.untyped_storage()
        if previous is not None and previous.alive and storage.data_ptr() == previous.address:
            kept += 1
            continue
        lo, hi = _span(t)
        key = storage.data_ptr()
        if key in groups:
            s, ts, a, b = groups[key]
            groups[key] = (s, [*ts, t], min(a, lo), max(b, hi))
        else:
            groups[key] = (storage, [t], lo, hi)
    total = sum(hi - lo for _, _, lo, hi in groups.values())
    if kept and not groups:
        return previous
    if total + (previous.nbytes if kept and previous is not None else 0) < min_bytes or not groups:
        return None
    # each storage's span at the same address modulo the page size as now, so alignment is unchanged
    layout: list[tuple[torch.UntypedStorage, list[torch.Tensor], int, int, int]] = []
    at = 0
    for storage, ts, lo, hi in groups.values():
        at += (storage.data_ptr() + lo - at) % PAGE
        layout.append((storage, ts, lo, hi, at))
        at += hi - lo
    length = at
    try:
        mm = _write(layout, length)
    except OSError as e:
        log.warning("the round's starting model stays in memory: its temporary file cannot be written (%s)", e)
        return None
    base = torch.frombuffer(mm, dtype=torch.uint8)  # holds the mapping while a tensor points into it
    mapped = base.untyped_storage()
    n = 0
    with torch.no_grad():
        for _, ts, lo, _, at in layout:
            for t in ts:
                size = t.element_size()
                byte = at + t.storage_offset() * size - lo
                t.set_(mapped, byte // size, t.size(), t.stride())
                n += 1
    return Spill(mm, total, n, base.data_ptr(), previous if kept else None)


def _write(layout: list[tuple[torch.UntypedStorage, list[torch.Tensor], int, int, int]], length: int) -> mmap.mmap:
    """The spans written into a fresh unlinked file (by ``pwrite``: the page cache, not this process's pages),
    mapped shared. Made by name and unlinked at once (not ``O_TMPFILE``), so that the mapping shows in
    /proc/PID/maps as ``$TMPDIR/fedhop-m0-... (deleted)``."""
    fd, name = tempfile.mkstemp(prefix="fedhop-m0-")
    try:
        os.unlink(name)
        os.ftruncate(fd, length)
        for storage, _, lo, hi, at in layout:
            src = torch.empty(0, dtype=torch.uint8).set_(storage, lo, (hi - lo,), (1,))
            view = memoryview(src.numpy())
            done = 0
            while done < view.nbytes:
                done += os.pwrite(fd, view[done:], at + done)
            del view, src
        return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mapping keeps the file
