"""What a client host's per-task state saves cost, and what a group commit would save (issue 19, docs/benchmarks.md
"The live page at 10,000 under `launch`: not the gap; the hosts' state files are").

    python tests/bench/bench_state_saves.py [--clients 500] [--rounds 3] [--threads 4] [--reps 3]

Each of ``--clients`` stores (one per client, as ``NodeStore`` makes under ``--state-dir``) saves a small
client state once per round, from ``--threads`` threads (a host's task threads save outside the task lock). Five
ways, interleaved, median of ``--reps``:

- ``checkpoint files``: ``CheckpointStore.save``, a node's saves until the tenth session (the file fsynced, renamed,
  its folder fsynced, the folder listed to prune);
- ``no fsync``: the same with ``os.fsync`` stubbed out (not durable: the floor of everything else);
- ``group commit`` (a prototype here, not fedhop's path): each save without its fsyncs, then one ``syncfs`` of
  the file system shared by every save that finished before it began (a save returns only after a ``syncfs`` that
  began after its own write: as durable as ``checkpoint files`` before the result is sent);
- ``host log`` (a prototype here, not fedhop's path): each save appends the same checkpoint bytes as one record to
  one file shared by the host's clients, then ``fdatasync`` s it (as durable; no rename, folder sync, listing or
  unlink; the pruning and reading back a log would need are not built);
- ``state log``: ``StateLog.save``, a node's saves since (``common/engine/state_log.py``: a record appended to
  the node's own log and ``fdatasync`` ed; a new segment, and its folder synced, every 64 records).

Prints wall and CPU per save and the number of ``syncfs`` calls; the load average before and after.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import torch

from fedhop.common.engine.checkpoint import CheckpointStore, checkpoint_parts
from fedhop.common.engine.state_log import StateLog

_libc = ctypes.CDLL(None, use_errno=True)


class GroupSync:
    """One ``syncfs`` serves every caller whose write finished before it began."""

    def __init__(self, folder: Path) -> None:
        self.fd = os.open(folder, os.O_RDONLY)
        self.cond = threading.Condition()
        self.started = 0  # syncs begun
        self.done = 0  # syncs finished
        self.running = False
        self.calls = 0

    def sync(self) -> None:
        with self.cond:
            need = self.started + 1  # a sync that begins after this point
            while self.done < need:
                if not self.running:
                    self.running = True
                    self.started += 1
                    mine = self.started
                    break
                self.cond.wait()
            else:
                return
        try:
            if _libc.syncfs(self.fd) != 0:
                raise OSError(ctypes.get_errno(), "syncfs failed")
            self.calls += 1
        finally:
            with self.cond:
                self.running = False
                self.done = mine
                self.cond.notify_all()


def one(way: str, root: Path, clients: int, rounds: int, threads: int) -> tuple[float, float, int]:
    folder = Path(tempfile.mkdtemp(dir=root))
    stores = [CheckpointStore(folder / f"client-{i}", 2) for i in range(clients)]
    state = {"rng": torch.arange(5), "step": 3, "lr": 0.1}
    group = GroupSync(folder)
    real_fsync = os.fsync

    log_fd = os.open(folder / "host.fhlog", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    log_lock = threading.Lock()
    logs = {s.folder.name: StateLog(s.folder, 2) for s in stores}

    def save(store: CheckpointStore, r: int) -> None:
        if way == "host log":
            record = b"".join(checkpoint_parts({"node": store.folder.name, "run_id": "bench", "tag": r}, state))
            with log_lock:
                os.write(log_fd, record)
            os.fdatasync(log_fd)
            return
        if way == "state log":
            logs[store.folder.name].save(r, {"node": "c", "run_id": "bench"}, state, keep_before=r)
            return
        store.save(r, {"node": "c", "run_id": "bench"}, state, keep_before=r)
        if way == "group commit":
            group.sync()

    stub = way not in ("checkpoint files", "host log", "state log")
    t0, c0 = time.perf_counter(), time.process_time()
    with mock.patch.object(os, "fsync", (lambda fd: None) if stub else real_fsync), \
            ThreadPoolExecutor(threads) as pool:
        for r in range(rounds):
            list(pool.map(lambda s, r=r: save(s, r), stores))
    os.close(log_fd)
    n = clients * rounds
    return (time.perf_counter() - t0) / n * 1e3, (time.process_time() - c0) / n * 1e3, group.calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()}; {a.clients} clients x {a.rounds} rounds, {a.threads} threads")
    ways = ["checkpoint files", "no fsync", "group commit", "host log", "state log"]
    got: dict[str, list[tuple[float, float, int]]] = {w: [] for w in ways}
    for _ in range(a.reps):
        for w in ways:
            got[w].append(one(w, a.dir, a.clients, a.rounds, a.threads))
    print(f"{'way':14s} {'wall ms/save':>13s} {'CPU ms/save':>12s} {'syncfs calls':>13s}   (median of {a.reps})")
    for w in ways:
        wall = statistics.median(x[0] for x in got[w])
        cpu = statistics.median(x[1] for x in got[w])
        calls = statistics.median(x[2] for x in got[w])
        print(f"{w:14s} {wall:13.3f} {cpu:12.3f} {calls:13.0f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
