"""The checks of a session's first frame (docs/design.md section 6): Hello, the protocol, the peer's proven
identity, its place in the topology, its role and its run. Pure: they read the frame, the session's identity
and the hub's configuration; the checks that need the hub's state (duplicates, late joins) are admission's.

A refusal names the problem to the peer without telling a stranger the topology or the run id (the log line
does): under plaintext the run id is what a re-joining child says, so no refusal may teach it to a newcomer."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fedhop.common.engine.api import NodeId
from fedhop.common.testhooks import mark
from fedhop.common.wire.framing import BadFrame
from fedhop.common.wire.messages import PROTOCOL_VERSION, error_frame
from fedhop.transport.session.config import HubConfig
from fedhop.transport.session.link import ROLE_NAMES, ChildLink, Frame
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.session")


@dataclass(frozen=True)
class Refusal:
    """Why a session is refused: the error code and message the peer gets, and ``detail`` for the log only."""

    code: int
    message: str
    detail: str = ""


def first_frame_refusal(frame: Frame) -> Refusal | None:
    """A session must open with a Hello of this node's protocol."""
    if not isinstance(frame, pb.Frame) or frame.WhichOneof("body") != "hello":
        what = frame.error if isinstance(frame, BadFrame) else type(frame).__name__
        if isinstance(frame, pb.Frame):
            what = frame.WhichOneof("body") or "keep-alive"
        return Refusal(pb.ERROR_CODE_BAD_REQUEST, f"the first frame of a session must be Hello, got {what}")
    hello = frame.hello
    if hello.protocol != PROTOCOL_VERSION:
        return Refusal(pb.ERROR_CODE_PROTOCOL_MISMATCH,
                       f"protocol {hello.protocol} is not this node's protocol {PROTOCOL_VERSION}")
    return None


def hello_refusal(config: HubConfig, link: ChildLink, hello: pb.Hello) -> Refusal | None:
    """Who the Hello says it is, against what the session proved (with TLS or tokens) and the run's topology."""
    node = hello.node_id
    if not config.security.plaintext:
        if link.identity is None:
            return Refusal(pb.ERROR_CODE_BAD_REQUEST, "unauthenticated peer", f": {link.unauthenticated}")
        if link.identity != node:
            return Refusal(pb.ERROR_CODE_BAD_REQUEST,
                           f"the peer's certificate or token is {link.identity}'s, but it said Hello as {node!r}")
    if node not in config.child_set:  # the refusal does not list the topology's node ids (the log line does)
        return Refusal(pb.ERROR_CODE_BAD_REQUEST, f"{node!r} is not a child of {config.node} in this run",
                       f" (its children: {list(config.children)})")
    role = config.topology.role(node)
    if ROLE_NAMES.get(hello.role, "") != role:
        return Refusal(pb.ERROR_CODE_BAD_REQUEST,
                       f"{node} is a {role} in this run, but said Hello as {ROLE_NAMES.get(hello.role, '?')}")
    if hello.run_id and hello.run_id != config.run_id:  # the refusal does not say this parent's run id (the log does)
        return Refusal(pb.ERROR_CODE_RUN_MISMATCH, f"{node} re-joins run {hello.run_id!r}, which {config.node} does "
                       "not run", f" (it runs {config.run_id!r})")
    return None


def reject(at: NodeId, link: ChildLink, refusal: Refusal) -> bool:
    """Refuse a session at its Hello: one Error frame, then the stream ends; False (the session is over)."""
    log.warning("%s: rejected %s: %s%s", at, link.peer, refusal.message, refusal.detail)
    mark(f"rejected-{at}")  # a test hook (common/testhooks.py): the tests await the refusal, then read its line
    link.send([error_frame(0, refusal.code, refusal.message)])
    link.alive = False
    link.close()
    return False
