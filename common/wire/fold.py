"""Folding a reply into an aggregate chunk by chunk while its bytes arrive (issue 19: a node holds the aggregate
and one chunk of the reply being received, not the whole reply).

A :class:`~fedhop.common.wire.codec.BundleDecoder` given a sink hands it each piece of the payload after its
checks; :class:`AxpySink` adds ``alpha * piece`` into the aggregate's tensors in place (or, for the first
reply of a fold, scales the piece in a fresh buffer, where ``BundleDecoder.fill`` receives it in place: that buffer
becomes the aggregate). A later reply is added from where the decoder received it (no copy in between).

Bits
    The arithmetic is the whole-tensor fold's (``WeightedMean``: ``acc = b * alpha`` then
    ``acc.add_(b, alpha=alpha)``), elementwise, on slices. Slices start at multiples of :data:`ALIGN`
    elements inside each tensor and only a tensor's last slice may have a length that is not such a multiple,
    so each element is computed by the same vector loop (or the same scalar tail) of the same kernel as in the
    whole-tensor fold, on any CPU: the result is bit-identical to folding the decoded reply (the in-process
    engine's path). The bytes of a partial group wait in a small carry until the next chunk completes them.

Failures after the first chunk was folded
    A reply can still fail after part of it was added: a later chunk holding NaN or Inf, a checksum mismatch at
    its end, a stream that breaks off, a deadline. Floating-point addition cannot be undone bit for bit, so the
    sink first saves the aggregate's bytes it is about to change in an :class:`UndoLog`: a temporary file
    (page cache, not the process's memory; written to disk only under memory pressure), emptied when the reply
    is committed and read back when it is aborted. A failed reply is thus dropped alone, as before, and the
    aggregate is bit for bit what it was. The first reply needs no log: its buffer is simply dropped.

Validation
    Every finiteness check of ``check_bundle`` is made per piece (a tensor is bad iff one of its elements is
    NaN or Inf; whole-tensor and per-piece tests agree). A reply with a bad tensor stops being folded, is
    restored at its end, and :meth:`AxpySink.finish` returns stand-ins that are NaN for exactly the bad
    tensors, so the engine's own check rejects it with the words it uses for a decoded reply.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from fedhop.common.wire.bundle import Bundle
from fedhop.common.wire.codec import DTYPES, Layout, allocate, bundle_layout
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.fold")

ALIGN = 64  # elements: a fold slice starts at a multiple of this inside its tensor (>= any vector loop's step)
_NO_BYTES = np.empty(0, dtype=np.uint8)


@runtime_checkable
class StreamingFold(Protocol):
    """A scatter fold that can take a reply chunk by chunk (``Comm.scatter(..., fold=...)``): ``sink`` is asked
    when the reply's bundle header arrives (the reply is the next to fold, its scalars are known and checked);
    None: decode the reply whole and call the fold with it. A streamed reply reaches the fold as a Reply whose
    bundle is a :class:`FoldedBundle` of that sink; the fold commits it then."""

    def sink(self, node: str, scalars: Mapping[str, object], header: pb.BundleHeader) -> AxpySink | None: ...


class FoldedBundle(dict[str, torch.Tensor]):
    """The bundle of a reply already folded by ``sink``: stand-in tensors of the reply's names, dtypes and
    shapes (one element each, expanded: no memory), zero, or NaN where the reply had a non-finite value.

    ``non_finite`` names those NaN ones, in the bundle's order: the sink checked every element of the reply as
    it was folded (each piece, ``_bad``), so the engine's finiteness check (``check_bundle``) reads this list
    instead of testing the stand-ins again (the same names, the same words)."""

    def __init__(self, items: Mapping[str, torch.Tensor], sink: AxpySink, non_finite: tuple[str, ...] = ()) -> None:
        super().__init__(items)
        self.sink = sink
        self.non_finite = non_finite


def _stand_in(dtype: torch.dtype, shape: tuple[int, ...], nan: bool) -> torch.Tensor:
    return torch.full((), float("nan") if nan else 0.0, dtype=dtype).expand(shape)


@dataclass(frozen=True, eq=False)
class FoldPlan:
    """What every reply of one layout folded into one aggregate shares, built once (``WeightedMean.sink`` keeps
    the last one: a scatter's replies have the same layout and go into the same aggregate), not per reply: each
    tensor's dtype and element size, the zero stand-ins :meth:`AxpySink.finish` returns for a finite reply, and,
    for an existing aggregate (``acc``), its tensors' flat views and bytes, which the sinks write through.

    A plan is only read: the sinks built from it share its views (one sink folds at a time: the reply gate's
    order), and a first reply's sink builds its own over its fresh buffer."""

    layout: Layout
    dtypes: tuple[torch.dtype, ...]
    sizes: tuple[int, ...]  # bytes per element
    zeros: tuple[torch.Tensor, ...]  # the stand-ins of a finite reply (expanded, read-only)
    acc: tuple[torch.Tensor, ...] | None = None  # the aggregate's tensors, in the layout's order
    flat: tuple[torch.Tensor, ...] = ()  # ... flattened
    bytes: tuple[memoryview, ...] = ()  # ... as bytes

    @classmethod
    def of(cls, layout: Layout, acc: Mapping[str, torch.Tensor] | None = None) -> FoldPlan:
        """The plan of ``layout`` (folding into ``acc``'s tensors, in order, when given: the caller checked that
        they are the layout's, on the CPU and contiguous)."""
        dtypes = tuple(DTYPES[s.dtype] for s in layout.slots)
        zeros = tuple(_stand_in(d, s.shape, False) for s, d in zip(layout.slots, dtypes, strict=True))
        plan = cls(layout, dtypes, tuple(d.itemsize for d in dtypes), zeros)
        if acc is None:
            return plan
        tensors = tuple(acc.values())
        if len(tensors) != len(layout.slots):
            raise ValueError(f"a fold plan of {len(layout.slots)} tensors for an aggregate of {len(tensors)}")
        return cls(plan.layout, plan.dtypes, plan.sizes, plan.zeros, tensors,
                   tuple(t.reshape(-1) for t in tensors), tuple(_flat_bytes(t) for t in tensors))


class UndoLog:
    """The aggregate's bytes before the reply being folded changed them, by payload-stream offset, in an unlinked
    temporary file (``tempfile``'s directory, ``TMPDIR``): at most one model, in the page cache. Where no such
    file can be written (no temporary directory, a full disk), the log goes on in memory (one model more, the
    cost of decoding the reply whole) and says so once.

    Why a file in ``$TMPDIR`` (docs/benchmarks.md, "The CPU beside the training, cut"): of the places measured it is
    the cheapest that costs neither the process's memory nor disk writes (its pages are dropped unwritten at each
    commit); tmpfs or a memfd cost twice the CPU (the kernel zeroes each page it gives them) unless kept at a model's
    size for good, and ``O_DIRECT`` writes every logged byte to the disk.

    Written ahead (:meth:`save` with ``whole``): the first save after a clear starts a writer thread that copies the
    whole aggregate into the file in payload order, and each save waits until the writer has passed its bytes
    instead of writing them itself. The receiving thread then only receives, checks and adds, while the file's
    writes (~0.2 CPU ms per MiB, as much as the add and the checksum together) run on another core: at a PS the
    replies are folded one after another once the clients trained, and this is the time each one takes. The same
    bytes reach the file (a byte is read before any add changes it: the add waits for the writer); ``clear`` and
    ``restore`` stop the writer first."""

    # the writer's write size, what a save may wait for beyond its own bytes: bench_fold_cpu.py --part fold, 4 replies
    # of 100 MB, wall of the fold 0.14-0.15 s written by the receiver; written ahead in 1 MiB pieces 0.106-0.112 s in 3
    # runs of 3 (+0.02 CPU s for the hand-offs), in 4 or 16 MiB pieces 0.10-0.20 s (a wait for a whole piece that the
    # writer, on a busy machine, finishes late)
    PIECE = 1 << 20
    # below this aggregate size the receiver writes the log itself: a writer thread per reply costs more than the
    # writes it takes off (a thread's start and join ~0.1 ms, against ~0.2 CPU ms per MiB written; 1,000 clients of
    # a small model fold 1,000 replies a round)
    AHEAD_MIN_BYTES = 8 << 20

    def __init__(self) -> None:
        self._fd: int | None = None
        self._mem: bytearray | None = None  # the log in memory, after the file failed
        self._end = 0  # the end of what the current reply saved
        self.saved = 0  # bytes saved since the last clear
        self.saved_total = 0  # bytes saved in all (what the log cost in writes)
        self.restored_total = 0
        self._cond = threading.Condition()
        self._writer: threading.Thread | None = None  # the writer of the current reply's log (None: not started)
        self._ahead = 0  # the writer saved the payload stream's bytes [0, _ahead)
        self._stop = False
        self._writing = False  # the writer runs (it may still pass a waiting save's bytes)
        self._failed: OSError | None = None  # why the writer stopped early (its saves are then made by save)

    def save(self, offset: int, data: memoryview,
             whole: Callable[[], list[tuple[int, memoryview]]] | None = None) -> None:
        """Save the aggregate's bytes ``data`` at payload offset ``offset`` before they change. ``whole``: the
        aggregate as (payload offset, bytes) in payload order, contiguous from 0 (called once per reply): the log is
        written ahead by a writer thread and this waits for it (see the class)."""
        if whole is not None and self._mem is None and self._wait(offset + data.nbytes, whole):
            return
        if self._mem is None:
            try:
                self._save_file(offset, data)
            except OSError as e:
                log.warning("the fold's undo log cannot use a temporary file (%s): it is kept in memory", e)
                self._to_memory()
        if self._mem is not None:
            if len(self._mem) < offset:
                self._mem.extend(bytes(offset - len(self._mem)))
            self._mem[offset:offset + data.nbytes] = data
        self._end = max(self._end, offset + data.nbytes)
        self.saved += data.nbytes
        self.saved_total += data.nbytes

    def _wait(self, end: int, whole: Callable[[], list[tuple[int, memoryview]]]) -> bool:
        """Block until the writer saved the payload's bytes below ``end`` (starting it for this reply): True, or
        False where it cannot (its file failed: the caller saves the bytes itself, from the writer's end on)."""
        with self._cond:
            if self._writer is None and self._failed is None:
                try:
                    self._open()
                except OSError as e:
                    self._failed = e
                else:
                    self._stop, self._writing = False, True
                    self._writer = threading.Thread(target=self._write_ahead, args=(whole(),), daemon=True,
                                                     name="fold-undo-log")
                    self._writer.start()
            while self._ahead < end and self._writing:
                self._cond.wait()
            if self._ahead >= end:
                return True
            self._end = max(self._end, self._ahead)
            return False

    def _write_ahead(self, spans: list[tuple[int, memoryview]]) -> None:
        """The writer: the aggregate's bytes into the file, piece by piece in payload order, until done or stopped."""
        size = self.PIECE
        try:
            for offset, view in spans:
                pos = 0
                while pos < view.nbytes:
                    if self._stop:
                        return
                    piece = view[pos:pos + size]
                    self._save_file(offset + pos, piece)
                    pos += piece.nbytes
                    with self._cond:
                        self._ahead = offset + pos
                        self._end = max(self._end, self._ahead)
                        self.saved += piece.nbytes
                        self.saved_total += piece.nbytes
                        self._cond.notify_all()
        except OSError as e:
            with self._cond:
                self._failed = e
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def _halt(self) -> None:
        """Stop the writer (if any) and forget it: the next save starts a new one."""
        writer = self._writer
        if writer is not None:
            self._stop = True
            writer.join()
        with self._cond:
            self._writer, self._ahead, self._failed, self._stop, self._writing = None, 0, None, False, False

    def _open(self) -> None:
        if self._fd is None:
            with tempfile.TemporaryFile(prefix="fedhop-fold-undo-") as f:  # unlinked at once: the fd is the file
                self._fd = os.dup(f.fileno())

    def _save_file(self, offset: int, data: memoryview) -> None:
        self._open()
        assert self._fd is not None
        done = 0
        while done < data.nbytes:
            done += os.pwrite(self._fd, data[done:], offset + done)

    def _to_memory(self) -> None:
        self._mem = bytearray(self._end)
        if self._fd is not None:
            if self._end:
                self._read(0, memoryview(self._mem))
            os.close(self._fd)
            self._fd = None

    def _read(self, offset: int, into: memoryview) -> None:
        assert self._fd is not None
        done = 0
        while done < into.nbytes:
            got = os.pread(self._fd, into.nbytes - done, offset + done)
            if not got:
                raise OSError(f"the fold's undo log ended at {offset + done} bytes")
            into[done:done + len(got)] = got
            done += len(got)

    def restore(self, offset: int, into: memoryview) -> None:
        self._halt()
        if self._mem is not None:
            into[:] = self._mem[offset:offset + into.nbytes]
        else:
            self._read(offset, into)
        self.restored_total += into.nbytes

    def clear(self) -> None:
        """The reply was committed or restored: its saved bytes are not needed (their pages are dropped unwritten)."""
        self._halt()
        if self._fd is not None and self.saved:
            os.ftruncate(self._fd, 0)
        if self._mem is not None:
            self._mem = bytearray()
        self.saved = self._end = 0

    def close(self) -> None:
        self._halt()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._mem = None if self._mem is None else bytearray()

    def __del__(self) -> None:
        self.close()


def _flat_bytes(t: torch.Tensor) -> memoryview:
    flat = t.reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def _bad(x: torch.Tensor) -> bool:
    """``x`` holds NaN or Inf (``non_finite``'s test: a finite sum implies finite elements)."""
    return x.numel() > 0 and not bool(torch.isfinite(x.sum())) and not bool(torch.isfinite(x).all())


class AxpySink:
    """``acc += alpha * reply`` piece by piece (``acc is None``: ``acc = reply * alpha`` in a fresh buffer).

    Called from the session reader that receives the reply (``write``, ``finish``) and from the node's thread
    (``commit``, ``abort``); a lock orders them. States: open -> finished -> committed, or -> aborted (from
    open or finished; a write after an abort is ignored: the call was given up)."""

    def __init__(self, header: pb.BundleHeader, alpha: float, acc: Mapping[str, torch.Tensor] | None,
                 undo: UndoLog | None, plan: FoldPlan | None = None) -> None:
        """``plan``: what this reply shares with the others of its scatter (:class:`FoldPlan`, made for
        ``header``'s layout and, when ``acc`` is given, for ``acc``); None: made here."""
        if plan is None:
            plan = FoldPlan.of(bundle_layout(header), acc)
        elif (plan.acc is None) != (acc is None):
            raise ValueError("a fold plan made for " + ("no aggregate" if plan.acc is None else "an aggregate")
                             + " given a sink " + ("into an aggregate" if acc is not None else "of a first reply"))
        layout: Layout = plan.layout
        self.layout = layout
        self.plan = plan
        self.alpha = alpha
        self._lock = threading.Lock()
        self.state = "open"
        self.bad: set[int] = set()  # tensors with a non-finite value
        self._dtypes = plan.dtypes
        self._sizes = plan.sizes
        self._buf: np.ndarray | None = None
        if acc is None:  # the first reply: its buffer becomes the aggregate (laid out as the decoder would)
            self._buf = allocate(layout.size)
            base = torch.from_numpy(self._buf)
            tensors = [base[s.at:s.at + s.nbytes].view(d).view(s.shape) if s.nbytes else torch.empty(s.shape, dtype=d)
                       for s, d in zip(layout.slots, self._dtypes, strict=True)]
            self._undo = None
            self._flat: list[torch.Tensor] | tuple[torch.Tensor, ...] = [t.reshape(-1) for t in tensors]
            self._bytes: list[memoryview] | tuple[memoryview, ...] = [_flat_bytes(t) for t in tensors]
        else:
            assert plan.acc is not None
            tensors = list(plan.acc)
            if undo is None:
                raise ValueError("folding into an existing aggregate needs an undo log")
            self._undo = undo
            self._flat, self._bytes = plan.flat, plan.bytes  # shared with the scatter's other sinks (read only)
        self.tensors: dict[str, torch.Tensor] = {s.name: t for s, t in zip(layout.slots, tensors, strict=True)}
        self._done = [0] * len(tensors)  # elements received and checked per tensor (a carry aside)
        self._added = [0] * len(tensors)  # ... of which added into the aggregate (saved in the undo log first)
        self._carry = _NO_BYTES  # bytes after the folded ones of the tensor being received
        self._landed: tuple[int, int, memoryview] | None = None  # the last ``target`` handed out
        self._scratch = np.empty(0, dtype=np.uint8)

    # -- the reader's side --------------------------------------------------------------------------------------
    def target(self, index: int, pos: int, nbytes: int) -> memoryview | None:
        """Where :meth:`BundleDecoder.fill <fedhop.common.wire.codec.BundleDecoder.fill>` may receive bytes
        ``[pos, pos + nbytes)`` of tensor ``index`` in place: for the first reply, their place in its fresh buffer
        (its ``write`` then copies nothing); None for a reply added into an existing aggregate (a scratch buffer)."""
        with self._lock:
            if self._buf is None or self.state != "open":
                return None
            view = self._bytes[index][pos:pos + nbytes]
            self._landed = (index, pos, view)
            return view

    def write(self, index: int, pos: int, data: memoryview) -> None:
        with self._lock:
            if self.state != "open":
                return
            if self._buf is not None:
                self._write_first(index, pos, data)
            else:
                self._write_add(index, pos, data)

    def _limit(self, index: int, end: int) -> int:
        """How many elements of tensor ``index`` may be folded once its bytes up to ``end`` are in."""
        size, n = self._sizes[index], self._flat[index].numel()
        if end >= n * size:
            return n
        return (end // size) // ALIGN * ALIGN

    def _write_first(self, index: int, pos: int, data: memoryview) -> None:
        k = data.nbytes
        landed, self._landed = self._landed, None
        if landed is None or landed[:2] != (index, pos) or k > landed[2].nbytes:  # not received in place
            self._bytes[index][pos:pos + k] = data
        lo, hi = self._done[index], self._limit(index, pos + k)
        if hi > lo:
            x = self._flat[index][lo:hi]
            if index not in self.bad and _bad(x):
                self.bad.add(index)
            if not self.bad:
                x.mul_(self.alpha)
            self._done[index] = hi

    def _whole(self) -> list[tuple[int, memoryview]]:
        """The aggregate's bytes by payload offset, in payload order (what the undo log writes ahead)."""
        return [(s.start, b) for s, b in zip(self.layout.slots, self._bytes, strict=True) if b.nbytes]

    def _write_add(self, index: int, pos: int, data: memoryview) -> None:
        size = self._sizes[index]
        lo = self._done[index]
        held = pos - lo * size  # carry bytes: [lo * size, pos)
        if held != self._carry.nbytes:
            want = lo * size + self._carry.nbytes
            raise ValueError(f"fold sink: tensor #{index} got bytes at {pos}, expected them at {want}")
        k = data.nbytes
        hi = self._limit(index, pos + k)
        use = (hi - lo) * size
        if held == 0 and not data.readonly:  # the piece is added from where it was received (no copy)
            s = np.frombuffer(data, dtype=np.uint8)
        else:  # joined with the carry, or read-only (torch wants a writable buffer)
            if self._scratch.nbytes < held + k:
                self._scratch = np.empty(held + k + 64, dtype=np.uint8)
            s = self._scratch
            s[:held] = self._carry
            s[held:held + k] = np.frombuffer(data, dtype=np.uint8)
        if hi > lo:
            b = torch.from_numpy(s[:use]).view(self._dtypes[index])
            if index not in self.bad and _bad(b):
                self.bad.add(index)
            if not self.bad:
                assert self._undo is not None
                self._undo.save(self.layout.slots[index].start + lo * size, self._bytes[index][lo * size:hi * size],
                                whole=self._whole if self.layout.size >= UndoLog.AHEAD_MIN_BYTES else None)
                self._flat[index][lo:hi].add_(b, alpha=self.alpha)
                self._added[index] = hi
            self._done[index] = hi
        self._carry = s[use:held + k].copy() if use < held + k else _NO_BYTES

    def finish(self) -> Bundle:
        """Every byte came and matched the checksum: stand-ins for the engine's checks (a reply with a non-finite
        value is restored here and its stand-ins say where)."""
        with self._lock:
            if self.state == "open" and self.bad:
                self._restore()
            elif self.state == "open":
                self.state = "finished"
            slots, zeros = self.layout.slots, self.plan.zeros
            if not self.bad:  # the plan's zero stand-ins (read-only: expanded), shared by the scatter's replies
                return FoldedBundle({s.name: z for s, z in zip(slots, zeros, strict=True)}, self)
            stand = {s.name: _stand_in(self._dtypes[i], s.shape, True) if i in self.bad else zeros[i]
                     for i, s in enumerate(slots)}
            return FoldedBundle(stand, self, tuple(s.name for i, s in enumerate(slots) if i in self.bad))

    # -- the node's side ------------------------------------------------------------------------------------------
    def commit(self) -> dict[str, torch.Tensor]:
        """Keep the folded reply; the aggregate's tensors (for the first reply: the new buffer's)."""
        with self._lock:
            if self.state != "finished":
                raise RuntimeError(f"a fold sink can only be committed once finished, not {self.state}")
            self.state = "committed"
            if self._undo is not None:
                self._undo.clear()
            return self.tensors

    def abort(self) -> None:
        """Undo the reply: the aggregate is bit for bit what it was before it (no-op once committed)."""
        with self._lock:
            if self.state in ("open", "finished"):
                self._restore()

    def _restore(self) -> None:
        self.state = "aborted"
        if self._buf is not None:  # the first reply: nothing of the aggregate was touched
            self._buf = None
            self.tensors, self._flat, self._bytes = {}, [], []
            return
        assert self._undo is not None
        for i, s in enumerate(self.layout.slots):
            n = self._added[i] * self._sizes[i]
            if n:
                self._undo.restore(s.start, self._bytes[i][:n])
        self._undo.clear()
