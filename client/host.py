"""``fedhop clients``: a client host, one process serving many client ids of one parent.

Each id lives as a ``fedhop client`` process of that id would (:func:`~fedhop.client.main.run_client_async`): its
own session with the parent (its own Hello / Ready / Task / Result / Bye stream, on a TCP connection of its own,
and re-joins), its own algorithm state, random streams and saved state. What the ids share is what is a pure
function of the RunSpec: one parsed spec, one :class:`~fedhop.common.engine.workspace.Workspace` (topology, model
template, and the ids' partitions, built together once), one torch import; and the threads: every session runs on
one asyncio loop (``grpc.aio`` streams), the ids' tasks on :data:`TASK_WORKERS` shared worker threads, their
joins and re-joins (blocking, with backoff) on :data:`JOIN_WORKERS`. A host of any number of ids runs the same
few threads (a thread per id and four more inside gRPC and the session was 50,000 threads for 10,000 ids, past
``pid_max``). Task handlers run one at a time in the process (the model template is shared, as in the in-process
engine, and ``functional_call`` swaps its parameters), so results and byte counts are those of one process per id.

An id that ends before it is in the run (refused, unreachable, no data) ends the host with its exit code: the
ids of a host join one run together. Once every id is in, the host ends when the last id does, with the first
non-zero exit code among them (in id order), or 0.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence

import torch

from fedhop.common import heap
from fedhop.common.engine.workspace import Workspace
from fedhop.common.exit_codes import ExitCode
from fedhop.common.malloc_tuning import fix_mmap_threshold
from fedhop.common.spec import RunSpec
from fedhop.transport.credentials import ALL_PLAINTEXT, SecurityByNode
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.workers import DaemonPool

log = logging.getLogger("fedhop.clients")

JOIN_SLOTS = 8  # ids dialing and joining at once: a thousand simultaneous handshakes would outlast their timeout
JOIN_WORKERS = 16  # threads for the blocking steps of joins, re-joins and Byes (waits for a parent, backoff sleeps)
# threads for the ids' tasks: the handlers take turns (task_lock), but an emulated slow node waits outside the
# lock, and a posted task waits for its parent: a few more than one
TASK_WORKERS = 4
CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("fedhop_client", default=None)  # id of a task


class HostShare:
    """What the ids of one client host share: the Workspace of the run (by the Welcome's spec JSON) and the
    lock that lets one task handler run at a time; the worker threads of their joins and tasks."""

    def __init__(self, ids: Sequence[str], device: str | None = None, data_path: str | None = None, *,
                 join_workers: int = JOIN_WORKERS, task_workers: int = TASK_WORKERS) -> None:
        self.ids = tuple(ids)
        self.joins = DaemonPool(join_workers, "joins")  # threads start as work comes
        self.workers = DaemonPool(task_workers, "tasks")
        self.device = device
        self.data_path = data_path
        self.task_lock = threading.Lock()
        self._lock = threading.Lock()
        self._workspaces: dict[str, Workspace] = {}
        self._tuned = False

    def workspace(self, spec_json: str) -> Workspace:
        """The Workspace of the run whose spec the parent sent; parsed and built once for every id."""
        with self._lock:
            ws = self._workspaces.get(spec_json)
            if ws is None:
                ws = Workspace(RunSpec.model_validate_json(spec_json), self.device, self.data_path,
                               own_clients=self.ids)
                self._workspaces[spec_json] = ws
            return ws

    def tune_process(self) -> None:
        """What every client process sets before it joins, once for the host's ids (glibc's mmap threshold: a
        C library lookup that starts a process)."""
        with self._lock:
            if not self._tuned:
                fix_mmap_threshold()  # freed chunk buffers go back to the OS (common/malloc_tuning.py)
                self._tuned = True

    def shutdown(self) -> None:
        self.joins.shutdown()
        self.workers.shutdown()


class ClientPrefix(logging.Filter):
    """Sets ``record.client``: the id that logged the record (its asyncio task on the host's loop, :data:`CLIENT`;
    a worker thread while it works for the id is named after it, or ``<id>-tasks``), or ``host``."""

    def __init__(self, ids: Sequence[str]) -> None:
        super().__init__()
        self.ids = frozenset(ids)

    def filter(self, record: logging.LogRecord) -> bool:
        node = CLIENT.get() or (record.threadName or "").removesuffix("-tasks")
        record.client = node if node in self.ids else "host"
        return True


def run_clients(ids: Sequence[str], config: NodeConfig, security: SecurityByNode = ALL_PLAINTEXT, *,
                join_slots: int = JOIN_SLOTS) -> int:
    """Serve every id in ``ids`` under ``config.connect`` from this process; returns the host's exit code (see
    the module's docstring). ``config``: what the ids share (parent, device, data path, state folder, connect
    timeout; its ``node_id`` names the host in logs, its ``security`` is unused); each id runs with
    ``config.for_node(id, security.of(id))``: its own credentials (plaintext for an id ``security`` holds none
    for). The ids' sessions run on a new asyncio loop in this thread."""
    # One thread per task (the handlers take turns anyway) and the same reductions as every other process of the
    # run: the bit-identity of the engines rests on this.
    torch.set_num_threads(1)
    share = HostShare(ids, config.device, config.data_path)
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_serve_ids(share, config, security, max(1, join_slots)))
    finally:
        _close_loop(loop)
        share.shutdown()


async def _serve_ids(share: HostShare, config: NodeConfig, security: SecurityByNode, join_slots: int) -> int:
    from fedhop.client import main as client_main

    ids = share.ids
    loop = asyncio.get_running_loop()
    on_loop = threading.get_ident()
    slots = asyncio.Semaphore(join_slots)
    ended: asyncio.Queue[tuple[str, int, bool]] = asyncio.Queue()
    joined = asyncio.Event()  # an id of this host is in the run: its parent is a fedhop parent
    started = time.monotonic()
    readied: set[str] = set()  # the ids that were ready once

    def soon(fn: Callable[[], None]) -> None:  # on the loop, from the loop or a worker
        if threading.get_ident() == on_loop:
            fn()
        else:
            loop.call_soon_threadsafe(fn)

    async def one(node: str) -> None:
        CLIENT.set(node)  # this task's log records name the id (a copy of the context per task)
        ready = False

        def became_ready() -> None:
            nonlocal ready
            if not ready:
                ready = True
                joined.set()
                slots.release()
                readied.add(node)
                if len(readied) == len(ids):
                    settle_heap()

        await slots.acquire()
        code: int = ExitCode.FAILED
        try:
            while True:
                code = await client_main.run_client_async(config.for_node(node, security.of(node)), host=share,
                                                          on_ready=lambda _: soon(became_ready))
                if not dial_again(node, code, ready):
                    break
        except Exception:
            log.exception("%s: failed", node)
        finally:
            if not ready:
                slots.release()
            ended.put_nowait((node, int(code), ready))

    def dial_again(node: str, code: int, was_ready: bool) -> bool:
        """An id whose handshake timed out (NOT_FEDHOP) while other ids of this host are in the run met a busy
        parent, not a stranger (1,000 ids joining a loaded 2-core machine: one slow handshake ended a host of
        500 ids): it dials again while ``config.connect_timeout_s`` lasts."""
        if code != ExitCode.NOT_FEDHOP or was_ready or not joined.is_set():
            return False
        if time.monotonic() - started > config.connect_timeout_s:
            return False
        log.warning("%s: no gRPC handshake in time, but other ids of this host are in the run: the parent is "
                    "busy; dialing again", node)
        return True

    def settle_heap() -> None:
        """Every id joined: settle the heap, then tidy it every TIDY_MIN_S (common/heap.py: a host does not know
        the rounds; its ids' tasks come and go on their own)."""
        heap.settle(f"all {len(ids)} ids of this host joined")

        def look() -> None:
            heap.tidy("this host's ids")
            loop.call_later(heap.TIDY_MIN_S, look)

        if heap.SETTLER.enabled:
            loop.call_later(heap.TIDY_MIN_S, look)

    log.info("serving %d client ids under %s: %s", len(ids), config.connect, ", ".join(ids) if len(ids) <= 8 else
             f"{ids[0]} ... {ids[-1]}")
    for node in ids:
        loop.create_task(one(node), name=node)
    codes: dict[str, int] = {}
    while len(codes) < len(ids):
        node, code, was_ready = await ended.get()
        codes[node] = code
        if code != 0 and not was_ready:
            log.error("%s ended with exit code %d before it was in the run; stopping this host's %d other ids",
                      node, code, len(ids) - len(codes))
            return code
    bad = [(n, codes[n]) for n in ids if codes[n] != 0]
    if bad:
        log.error("%d of %d ids did not finish cleanly: %s", len(bad), len(ids),
                  ", ".join(f"{n} (exit {c})" for n, c in bad))
        return bad[0][1]
    log.info("all %d client ids finished", len(ids))
    return ExitCode.OK


def _close_loop(loop: asyncio.AbstractEventLoop, grace_s: float = 5.0) -> None:
    """Cancel what still runs on ``loop`` (ids of a host that ends early), give it ``grace_s`` to unwind, close it.
    A worker thread still busy for such an id is a daemon: it does not hold the process."""
    tasks = asyncio.all_tasks(loop)
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.wait(tasks, timeout=grace_s))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
