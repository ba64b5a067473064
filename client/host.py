"""``fedhop clients``: a client host, one process serving many client ids of one parent.

Each id runs :func:`~fedhop.client.main.run_client` on its own thread: its own session with the parent (its own
Hello / Ready / Task / Result / Bye stream and re-joins), its own algorithm state, random streams and saved
state, exactly as a ``fedhop client`` process of that id would. What the ids share is what is a pure function of
the RunSpec: one parsed spec, one :class:`~fedhop.common.engine.workspace.Workspace` (topology, model template,
and the ids' partitions, built together once), and one torch import. Task handlers run one at a time in the
process (the model template is shared, as in the in-process engine, and ``functional_call`` swaps its
parameters), so results and byte counts are those of one process per id.

An id that ends before it is in the run (refused, unreachable, no data) ends the host with its exit code: the
ids of a host join one run together. Once every id is in, the host ends when the last id does, with the first
non-zero exit code among them (in id order), or 0.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence

import torch

from fedhop.common.engine.workspace import Workspace
from fedhop.common.exit_codes import ExitCode
from fedhop.common.spec import RunSpec
from fedhop.transport.credentials import ALL_PLAINTEXT, SecurityByNode
from fedhop.transport.node_config import NodeConfig

log = logging.getLogger("fedhop.clients")

JOIN_SLOTS = 8  # ids dialing and joining at once: a thousand simultaneous handshakes would outlast their timeout


class HostShare:
    """What the ids of one client host share: the Workspace of the run (by the Welcome's spec JSON) and the
    lock that lets one task handler run at a time."""

    def __init__(self, ids: Sequence[str], device: str | None = None, data_path: str | None = None) -> None:
        self.ids = tuple(ids)
        self.device = device
        self.data_path = data_path
        self.task_lock = threading.Lock()
        self._lock = threading.Lock()
        self._workspaces: dict[str, Workspace] = {}

    def workspace(self, spec_json: str) -> Workspace:
        """The Workspace of the run whose spec the parent sent; parsed and built once for every id."""
        with self._lock:
            ws = self._workspaces.get(spec_json)
            if ws is None:
                ws = Workspace(RunSpec.model_validate_json(spec_json), self.device, self.data_path,
                               own_clients=self.ids)
                self._workspaces[spec_json] = ws
            return ws


class ClientPrefix(logging.Filter):
    """Sets ``record.client``: the id whose thread logged the record (its session thread, named after it, or
    its task worker, ``<id>-tasks``), or ``host`` for the process's own threads."""

    def __init__(self, ids: Sequence[str]) -> None:
        super().__init__()
        self.ids = frozenset(ids)

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.threadName or ""
        node = name.removesuffix("-tasks")
        record.client = node if node in self.ids else "host"
        return True


def run_clients(ids: Sequence[str], config: NodeConfig, security: SecurityByNode = ALL_PLAINTEXT, *,
                join_slots: int = JOIN_SLOTS) -> int:
    """Serve every id in ``ids`` under ``config.connect`` from this process; returns the host's exit code (see
    the module's docstring). ``config``: what the ids share (parent, device, data path, state folder, connect
    timeout; its ``node_id`` names the host in logs, its ``security`` is unused); each id runs with
    ``config.for_node(id, security.of(id))``: its own credentials (plaintext for an id ``security`` holds none
    for)."""
    from fedhop.client.main import run_client

    # One thread per task (the handlers take turns anyway) and the same reductions as every other process of the
    # run: the bit-identity of the engines rests on this.
    torch.set_num_threads(1)
    share = HostShare(ids, config.device, config.data_path)
    slots = threading.Semaphore(max(1, join_slots))
    ended: queue.Queue[tuple[str, int, bool]] = queue.Queue()
    joined = threading.Event()  # an id of this host is in the run: its parent is a fedhop parent
    started = time.monotonic()

    def one(node: str) -> None:
        ready = threading.Event()

        def on_ready(_: str) -> None:
            ready.set()
            joined.set()
            slots.release()

        slots.acquire()
        code: int = ExitCode.FAILED
        try:
            while True:
                code = run_client(config.for_node(node, security.of(node)), host=share, on_ready=on_ready)
                if not dial_again(node, code, ready.is_set()):
                    break
        except Exception:
            log.exception("%s: failed", node)
        finally:
            if not ready.is_set():
                slots.release()
            ended.put((node, int(code), ready.is_set()))

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

    log.info("serving %d client ids under %s: %s", len(ids), config.connect, ", ".join(ids) if len(ids) <= 8 else
             f"{ids[0]} ... {ids[-1]}")
    for node in ids:
        threading.Thread(target=one, args=(node,), name=node, daemon=True).start()
    codes: dict[str, int] = {}
    while len(codes) < len(ids):
        node, code, was_ready = ended.get()
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
