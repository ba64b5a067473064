"""A node's whole state as one value: what ``ctx.state``, ``ctx.public`` and ``ctx.inbox`` hold, plus its
Comm's record of its children's last usable replies. Both engines save and restore nodes through this."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedhop.common.engine.api import NodeContext


@dataclass
class NodeSnapshot:
    state: Any = None
    public: dict[str, Any] = field(default_factory=dict)
    inbox: dict[str, Any] = field(default_factory=dict)
    last_ok: dict[str, int] = field(default_factory=dict)


def snapshot(ctx: NodeContext) -> NodeSnapshot:
    """The node's state as it is now (not a copy: writing it to a checkpoint copies it)."""
    return NodeSnapshot(ctx.state, dict(ctx.public), dict(ctx.inbox), dict(getattr(ctx.comm, "last_ok", {})))


def restore(ctx: NodeContext, snap: NodeSnapshot) -> None:
    ctx.state = snap.state
    ctx.public.clear()
    ctx.public.update(snap.public)
    ctx.inbox.clear()
    ctx.inbox.update(snap.inbox)
    if hasattr(ctx.comm, "last_ok"):
        ctx.comm.last_ok = dict(snap.last_ok)
