"""The CPU a node spends beside the training on the 25M job's bundles, piece by piece (issue 19; docs/benchmarks.md
"The CPU beside the training, cut"): one process, CPU seconds (``time.process_time``), median of ``--reps``.

    .venv/bin/python tests/bench/bench_fold_cpu.py            # all three parts
    .venv/bin/python tests/bench/bench_fold_cpu.py --part fold

* ``fold``: 4 replies of the 25M MLP (99.9 MB) folded through ``WeightedMean.sink`` and ``BundleDecoder.fill`` over a
  reader that returns at most the rest of a 1 MiB chunk frame per call (as a lane's does), one thread; checked bit for
  bit against the whole-tensor fold. The reader's copy stands in for the receive. Then the undo log written ahead by
  its own thread (as built) against written by the receiving thread, interleaved: process CPU, the receiving
  thread's CPU and the wall per round.
* ``small``: 1,000 replies of the 10,000-clients bench's small MLP (20-16-10, 4 float32 tensors, 2.0 KB: one
  chunk each) folded through ``WeightedMean.sink`` and ``BundleDecoder.feed`` from read-only chunk bytes (as gRPC's),
  each committed; CPU ms per reply, bit for bit against the whole-tensor fold (``--reps`` rounds of 1,000).
* ``undo``: where the undo log's 3 x 100 MB a round could go (the ext4 file as built, tmpfs/memfd, memory, O_DIRECT).
* ``loopback``: CPU per GB through 127.0.0.1 (both ends in this process) and per GB of memcpy: what moving a round's
  800 MB costs at the least.
"""

from __future__ import annotations

import argparse
import mmap
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

H = 4960
SHAPES = {"w1": (H, 64), "b1": (H,), "w2": (H, H), "b2": (H,), "w3": (10, H), "b3": (10,)}
MB100 = 100 << 20
PIECE = 1 << 20


def cpu(fn: Callable[[], object], reps: int) -> float:
    ts = []
    for _ in range(reps):
        c = time.process_time()
        fn()
        ts.append(time.process_time() - c)
    return statistics.median(ts)


def fold(reps: int) -> None:
    from fedhop.common.algorithms.aggregate import WeightedMean
    from fedhop.common.engine.api import Reply
    from fedhop.common.wire.codec import BundleDecoder, encode_parts
    from fedhop.common.wire.fold import UndoLog

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    replies = [{k: torch.randn(s, generator=g) for k, s in SHAPES.items()} for _ in range(4)]
    streams = []
    for r in replies:
        header, views = encode_parts(r, PIECE)
        streams.append((header, memoryview(b"".join(bytes(v) for v in views))))

    def reader(stream: memoryview) -> Callable[[memoryview], int]:
        pos = 0

        def recv_into(view: memoryview) -> int:
            nonlocal pos
            k = min(len(view), PIECE - pos % PIECE, len(stream) - pos)
            view[:k] = stream[pos:pos + k]
            pos += k
            return k
        return recv_into

    def one_round() -> dict[str, torch.Tensor]:
        mean = WeightedMean(lambda node, r: 1.0, 4.0)
        for i, (header, stream) in enumerate(streams):
            dec = BundleDecoder(header, sink=mean.sink(f"c{i}", {}, header))
            dec.fill(reader(stream))
            mean(f"c{i}", Reply(dec.finish(), {}))
        return mean.result()

    want = {k: replies[0][k] * 0.25 for k in SHAPES}
    for r in replies[1:]:
        for k in SHAPES:
            want[k].add_(r[k], alpha=0.25)
    got = one_round()
    assert all(torch.equal(got[k], want[k]) for k in SHAPES), "the streamed fold changed a bit"
    print(f"fold of 4 replies of 99.9 MB (streamed, fill): {cpu(one_round, reps):.3f} CPU s per round (bit-identical)")

    # the undo log written ahead by its own thread (as built) or by the receiving thread (its saves made in place):
    # process CPU, the receiving thread's CPU and the wall per round, the two interleaved
    ahead = UndoLog._wait

    def in_place(self: UndoLog, end: int, whole: object) -> bool:
        return False

    rows: dict[str, list[tuple[float, float, float]]] = {"written ahead": [], "written by the receiver": []}
    for _ in range(reps):
        for name, wait in (("written ahead", ahead), ("written by the receiver", in_place)):
            UndoLog._wait = wait  # type: ignore[method-assign]
            c, t, w = time.process_time(), time.thread_time(), time.perf_counter()
            got = one_round()
            rows[name].append((time.process_time() - c, time.thread_time() - t, time.perf_counter() - w))
            assert all(torch.equal(got[k], want[k]) for k in SHAPES), "the streamed fold changed a bit"
    UndoLog._wait = ahead  # type: ignore[method-assign]
    for name, got_rows in rows.items():
        med = [statistics.median(r[i] for r in got_rows) for i in range(3)]
        print(f"  undo log {name}: {med[0]:.3f} CPU s (the receiving thread {med[1]:.3f}), wall {med[2]:.3f} s "
              f"per round (median of {reps})")


def small(reps: int) -> None:
    from fedhop.common.algorithms.aggregate import WeightedMean
    from fedhop.common.engine.api import Reply
    from fedhop.common.wire.codec import BundleDecoder, RawChunk, encode_views

    torch.set_num_threads(1)
    n = 1000
    g = torch.Generator().manual_seed(0)
    shapes = {"0.weight": (16, 20), "0.bias": (16,), "2.weight": (10, 16), "2.bias": (10,)}
    replies = [{k: torch.randn(s, generator=g) for k, s in shapes.items()} for _ in range(n)]
    streams = []
    for r in replies:
        header, chunks = encode_views(r, PIECE)
        streams.append((header, [RawChunk(c.offset, bytes(c.data)) for c in chunks]))

    def one_round() -> dict[str, torch.Tensor]:
        mean = WeightedMean(lambda node, r: 1.0, float(n))
        for i, (header, chunks) in enumerate(streams):
            dec = BundleDecoder(header, sink=mean.sink(f"c{i}", {}, header))
            for c in chunks:
                dec.feed(c)
            mean(f"c{i}", Reply(dec.finish(), {}))
        return mean.result()

    plain = WeightedMean(lambda node, r: 1.0, float(n))
    for i, r in enumerate(replies):
        plain(f"c{i}", Reply({k: v.clone() for k, v in r.items()}, {}))
    want, got = plain.result(), one_round()
    assert all(torch.equal(got[k], want[k]) for k in shapes), "the streamed fold changed a bit"
    print(f"fold of {n} small replies (4 tensors, one chunk each, feed): "
          f"{cpu(one_round, reps) / n * 1e3:.4f} CPU ms per reply (median of {reps} rounds; bit-identical)")


def undo(reps: int) -> None:
    src = memoryview(np.random.default_rng(0).integers(0, 255, MB100, dtype=np.uint8))

    def writes(save: Callable[[int, memoryview], object], clear: Callable[[], object], piece: int = PIECE):
        def go() -> None:
            for _ in range(3):
                for off in range(0, MB100, piece):
                    save(off, src[off:off + piece])
                clear()
        return go

    def report(name: str, go: Callable[[], None]) -> None:
        print(f"undo log, {name}: {cpu(go, reps):.3f} CPU s per 3 x 100 MB")

    with tempfile.TemporaryFile() as f:
        fd = f.fileno()
        report("ext4/$TMPDIR pwrite + ftruncate (as built)", writes(lambda o, d: os.pwrite(fd, d, o),
                                                                     lambda: os.ftruncate(fd, 0)))
        report("the same, 4 MiB writes",
               writes(lambda o, d: os.pwrite(fd, d, o), lambda: os.ftruncate(fd, 0), 4 * PIECE))

        def refill() -> None:
            os.ftruncate(fd, 0)
            os.posix_fallocate(fd, 0, MB100)
        report("posix_fallocate before each reply", writes(lambda o, d: os.pwrite(fd, d, o), refill))
    if hasattr(os, "memfd_create"):
        m = os.memfd_create("fedhop-undo-bench")
        report("memfd pwrite + ftruncate", writes(lambda o, d: os.pwrite(m, d, o), lambda: os.ftruncate(m, 0)))
        report("memfd kept at its size (one model of shmem)", writes(lambda o, d: os.pwrite(m, d, o), lambda: None))
        os.close(m)
    buf = np.empty(MB100, dtype=np.uint8)

    def keep(o: int, d: memoryview) -> None:
        buf[o:o + d.nbytes] = np.frombuffer(d, dtype=np.uint8)
    report("anonymous memory kept (one model of RSS)", writes(keep, lambda: None))
    if hasattr(os, "O_DIRECT") and hasattr(os, "O_TMPFILE"):
        aligned = mmap.mmap(-1, MB100)
        aligned[:] = bytes(src)
        try:
            fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR | os.O_DIRECT)
        except OSError as e:
            print(f"undo log, O_DIRECT: not here ({e})")
            return
        view = memoryview(aligned)
        w0 = time.perf_counter()
        c = cpu(lambda: [os.pwrite(fd, view[o:o + PIECE], o) for o in range(0, MB100, PIECE)] and os.ftruncate(fd, 0),
                reps)
        wall = (time.perf_counter() - w0) / reps
        print(f"undo log, O_DIRECT (writes to the disk): {3 * c:.3f} CPU s per 3 x 100 MB, "
              f"wall {wall:.3f} s per 100 MB")
        os.close(fd)


def loopback(reps: int) -> None:
    n = 400 << 20
    src, dst = np.ones(n, dtype=np.uint8), np.empty(n, dtype=np.uint8)
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        a = socket.create_connection(ls.getsockname())
        b, _ = ls.accept()

    def send() -> None:
        view = memoryview(src)
        for off in range(0, n, 4 * PIECE):
            a.sendall(view[off:off + 4 * PIECE])

    def move() -> None:
        t = threading.Thread(target=send)
        t.start()
        view, got = memoryview(dst), 0
        while got < n:
            got += b.recv_into(view[got:got + PIECE], PIECE, socket.MSG_WAITALL)
        t.join()
    move()  # the first pass pays for fresh pages
    print(f"loopback TCP: {cpu(move, reps) / 0.4:.2f} CPU s per GB (sender and receiver); "
          f"memcpy: {cpu(lambda: np.copyto(dst, src), reps) / 0.4:.3f} CPU s per GB")
    a.close()
    b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", action="append", choices=["fold", "small", "undo", "loopback"])
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for part in a.part or ["fold", "undo", "loopback"]:
        {"fold": fold, "small": small, "undo": undo, "loopback": loopback}[part](a.reps)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
