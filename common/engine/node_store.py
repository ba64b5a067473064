"""An edge's or client's saved states, one per round it worked in, so that it can restart and roll back.

A node saves its whole state (:class:`~fedhop.common.engine.snapshot.NodeSnapshot`) after every task and
every hand-off it receives, tagged with the round it happened in. The PS's last committed round is the
truth: a node told to resume at round R (a PS that restarted from its checkpoint, or a node restarted with
its ``--state-dir``) restores its newest snapshot from before round R, so a node that is ahead rolls back.

A node with nothing to keep writes nothing: a snapshot that is empty (no ``ctx.state``, ``public``, ``inbox`` or
children's replies; a FedAvg client's, every round) while the store holds none is not written, since restoring
nothing gives the same node (10,000 clients of a host wrote 10,000 files of nothing a round, ~0.7 ms of a round's
time per client: docs/benchmarks.md). Once a non-empty snapshot is saved, every later one is.

Kept: the newest ``keep`` snapshots, plus the newest one older than the PS's last committed round (what a
resume needs, even with ``checkpoint_every`` > 1). With a ``state_dir`` they are records of the node's state log
(:mod:`~fedhop.common.engine.state_log`: appended and synced, through the checkpoint format); without one they
are copies in memory, which survive a PS restart but not this process.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from fedhop.common.engine.api import NodeContext, get_algorithm
from fedhop.common.engine.checkpoint import kept_tags
from fedhop.common.engine.snapshot import NodeSnapshot, restore, snapshot
from fedhop.common.engine.state_io import copy_state
from fedhop.common.engine.state_log import StateLog

log = logging.getLogger("fedhop.node_store")
NEWEST = 1 << 30  # rollback(ctx, NEWEST): restore the newest saved state (a restarted node)


@dataclass(frozen=True)
class Restored:
    """What a rollback or a restart found: ``tag`` = the round of the snapshot used (None: fresh state)."""

    tag: int | None
    source: str  # "disk" | "memory" | "fresh"


class NodeStore:
    def __init__(self, node_id: str, state_dir: Path | None = None, keep: int = 2) -> None:
        self.node = node_id
        self.keep = max(1, keep)
        self.disk = StateLog(Path(state_dir) / node_id, keep) if state_dir is not None else None
        self.memory: dict[int, NodeSnapshot] = {}
        self.committed: int | None = None  # the PS's last committed round (from the tasks it sends)
        self.bytes_written = 0
        self.skipped = 0  # empty snapshots not written (see the module's docstring)
        self._holds: bool | None = None  # whether the disk holds a snapshot (None: not looked yet)
        self._lock = threading.Lock()  # tasks and received hand-offs save from different threads

    def keep_rounds(self, n: int) -> None:
        """Keep at least the newest ``n`` snapshots (a PS that checkpoints every k rounds needs k + 1)."""
        self.keep = max(self.keep, n)
        if self.disk is not None:
            self.disk.keep = self.keep

    def save(self, ctx: NodeContext, run_id: str = "", tag: int | None = None) -> None:
        """Snapshot the node as it is now, under ``tag`` (default ``ctx.round``), replacing an earlier one."""
        tag = ctx.round if tag is None else tag
        with self._lock:
            self._save(ctx, run_id, tag)

    def _save(self, ctx: NodeContext, run_id: str, tag: int) -> None:
        snap = snapshot(ctx)
        if self.disk is not None:
            if self._holds is None:
                self._holds = bool(self.disk.tags())
            if not self._holds and _empty(ctx, snap):
                self.skipped += 1
                return
            self._holds = True
            self.bytes_written += self.disk.save(tag, {"node": self.node, "run_id": run_id}, snap,
                                                 keep_before=self.committed)
            return
        self.memory[tag] = copy_state(snap)
        tags = sorted(self.memory)
        keep = kept_tags(tags, self.keep, self.committed)
        for t in tags:
            if t not in keep:
                del self.memory[t]

    def newest_tag(self) -> int | None:
        tags = self.disk.tags() if self.disk is not None else sorted(self.memory)
        return tags[-1] if tags else None

    def rollback(self, ctx: NodeContext, resume_round: int, run_id: str = "") -> Restored:
        """Make the node's state what it was before round ``resume_round``; forget anything newer."""
        if self.disk is not None:
            got = self.disk.latest(below=resume_round)
            if got is not None and run_id and got.meta.get("run_id") not in ("", run_id):
                raise RuntimeError(f"{self.node}: the state in {self.disk.folder} belongs to run "
                                   f"{got.meta.get('run_id')!r}, not to {run_id!r}")
            self.disk.drop_from(resume_round)
            self._holds = None
            snap, tag, source = (got.state, got.tag, "disk") if got is not None else (None, None, "fresh")
        else:
            below = [t for t in sorted(self.memory) if t < resume_round]
            tag = below[-1] if below else None
            snap = copy_state(self.memory[tag]) if tag is not None else None
            source = "memory" if tag is not None else "fresh"
            for t in [t for t in self.memory if t >= resume_round]:
                del self.memory[t]
        if snap is None:
            ctx.public.clear()
            ctx.inbox.clear()
            ctx.state = get_algorithm(ctx.spec.algorithm.name).node_state(ctx.role)
            if hasattr(ctx.comm, "last_ok"):
                ctx.comm.last_ok = {}
        else:
            restore(ctx, snap)
        what = "restored" if resume_round >= NEWEST else f"rolled back to before round {resume_round + 1}"
        log.info("%s: state %s (%s%s)", self.node, what, source, f", from round {tag + 1}" if tag is not None else "")
        return Restored(tag, source)


def _empty(ctx: NodeContext, snap: NodeSnapshot) -> bool:
    """Nothing to restore: the node is what :meth:`NodeStore.rollback` makes a fresh one (a role whose fresh
    state is None, with nothing public, in its inbox or from its children)."""
    return (snap.state is None and not snap.public and not snap.inbox and not snap.last_ok
            and get_algorithm(ctx.spec.algorithm.name).node_state(ctx.role) is None)
