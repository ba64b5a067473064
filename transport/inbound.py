"""The one validation path for inbound messages: a Task (from a parent), a HandOff (from a neighbour edge)
and a Result (from a child). Every check happens here, before anything touches a node's state; what fails
becomes an answer that names the problem (a :class:`Rejection` for requests, a ``Failure`` for results).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhop.common.engine.api import Reply, Scalar
from fedhop.common.engine.base import Failure, check_bundle
from fedhop.common.wire.codec import CodecError
from fedhop.common.wire.messages import ROUND_ARG, Message, to_device
from fedhop.common.wire.scalars import get_scalars
from fedhop.v1 import fedhop_pb2 as pb


@dataclass(frozen=True)
class Rejection:
    """Why a request is refused: an error code and a message naming the problem."""

    code: int
    message: str


@dataclass(frozen=True)
class Request:
    """A validated Task or HandOff: its bundle is finite and on this node's device."""

    call_id: int
    name: str
    args: dict[str, Scalar]
    round: int | None  # the sender's round (args[ROUND_ARG]), when it sent one
    bundle: dict[str, torch.Tensor]
    deadline_s: float  # the receiver's budget from receipt; 0 = none


def accept_request(msg: Message, receiver: str, sender: str, device: torch.device, *,
                   expect_name: str | None = None) -> Request | Rejection:
    """Validate a Task message (``expect_name``: the only task name allowed, e.g. "handoff")."""
    what = "the hand-off" if expect_name else "the request"
    if msg.kind != "task":
        return Rejection(pb.ERROR_CODE_BAD_REQUEST, f"{receiver} expected a Task from {sender}, got a {msg.kind} frame")
    task = msg.head.task
    if expect_name is not None and task.name != expect_name:
        return Rejection(pb.ERROR_CODE_BAD_REQUEST,
                         f"{what} from {sender} is a {task.name!r} Task, expected {expect_name!r}")
    if msg.error is not None:
        return Rejection(pb.ERROR_CODE_BAD_BUNDLE, f"{receiver} rejected {task.name!r} from {sender}: {msg.error}")
    try:
        args = get_scalars(task.args)
    except CodecError as e:
        return Rejection(pb.ERROR_CODE_BAD_REQUEST, f"{receiver}: bad args of {task.name!r} from {sender}: {e}")
    rnd = args.pop(ROUND_ARG, None)
    reason = check_bundle(msg.bundle)
    if reason is not None:
        return Rejection(pb.ERROR_CODE_BAD_BUNDLE, f"{receiver} rejected {what} {task.name!r} from {sender}: {reason}")
    return Request(msg.call_id, task.name, args, int(rnd) if isinstance(rnd, int | float) else None,
                   to_device(msg.bundle, device), float(task.deadline_s))


def accept_result(msg: Message, sender: str, device: torch.device) -> Reply | Failure:
    """A child's answer as a Reply (bundle on ``device``), or the Failure it amounts to. The reply's bundle is
    checked against what the caller expects in ``BaseComm.scatter``, the same for both engines."""
    if msg.kind != "result":
        return Failure(f"{sender} answered with a {msg.kind} frame instead of a Result")
    result = msg.head.result
    if not result.ok:
        return Failure(f"{pb.ErrorCode.Name(result.error.code)}: {result.error.message}")
    if msg.error is not None:
        return Failure(f"reply from {sender} could not be decoded: {msg.error}")
    try:
        scalars = get_scalars(result.scalars)
    except CodecError as e:
        return Failure(f"reply from {sender} has bad scalars: {e}")
    return Reply(to_device(msg.bundle, device), scalars)
