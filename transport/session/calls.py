"""The call table of a parent hub: Tasks pushed to children (:meth:`CallTable.call`), their Results matched
back to them, calls given up on (whose late replies are still counted, then dropped), and the rule that a
child's frames open messages only for calls pending for it."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedhop.common import timeline, timing
from fedhop.common.engine.api import NodeId, Reply, Scalar, meter_kind
from fedhop.common.engine.base import Failure
from fedhop.common.wire.budget import InflightBudget
from fedhop.common.wire.bundle import Bundle, payload_bytes
from fedhop.common.wire.codec import CodecError, PayloadSink
from fedhop.common.wire.messages import (
    CALL_ID_BASE,
    POST_ID_BASE,
    EncodedBundle,
    Message,
    MessageAssembler,
    TensorShape,
    bundle_shapes,
    encode_bundle,
    message_frames,
    task_frame,
)
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.inbound import accept_result
from fedhop.transport.reply_gate import ReplyGate
from fedhop.transport.session.config import HubConfig
from fedhop.transport.session.link import ChildLink, Roster, complain
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.session")

_HOST = torch.device("cpu")
REJOIN_READY_WAIT_S = 5.0
EXPIRED_KEPT = 4096  # calls given up on whose late replies are still counted (older ones: refused)

# what identifies a bundle's contents between two calls: per tensor (name, id, version counter, storage address,
# shape, dtype); an in-place change bumps the version, a new storage moves the address
_TensorKey = tuple[str, int, int, int, tuple[int, ...], torch.dtype]


@dataclass
class Call:
    """One Task sent to one child, waiting for its Result."""

    call_id: int
    node: NodeId
    task: str
    round: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Reply | Failure | None = None
    answered: threading.Event = field(default_factory=threading.Event)  # its Result frame arrived
    gate: ReplyGate | None = None  # a folding scatter's admission of replies (reply_gate.py)
    on_finish: Callable[[], None] | None = None  # called once the result is in (a caller waiting on several)
    sent_at: float = 0.0  # time.perf_counter() when its request was encoded and handed to the link
    expect: tuple[TensorShape, ...] | None = None  # what the reply's bundle must hold (checked at its header)
    answered_at: float | None = None  # time.monotonic() when its Result frame arrived
    admitted_at: float | None = None  # ... and when the gate let its bundle be read (the same without a gate)

    def held_s(self) -> float:
        """How long the gate has held this reply's bundle back (up to now while it still does)."""
        if self.answered_at is None:
            return 0.0
        until = self.admitted_at if self.admitted_at is not None else time.monotonic()
        return max(0.0, until - self.answered_at)

    def wait_settled(self, end: float, cap_s: float) -> bool:
        """Wait for the result until ``end`` (a time.monotonic() time: the scatter's deadline); whether it came.

        A reply whose Result frame came before ``end`` but whose bundle the gate held back gets that much longer
        (at most ``cap_s``): it would have been in time without the gate. A reply whose bytes stop arriving
        gets no more than it was held: a participant stalling mid-upload does not hold the round past its
        deadline (issue 20: a 5 s round took 35 s)."""
        until = end
        while not self.done.wait(max(0.0, until - time.monotonic())):
            if self.answered_at is None or self.answered_at > end:
                return False
            now = time.monotonic()
            until = end + min(self.held_s(), cap_s)
            if self.admitted_at is None:  # still held: its credit grows; look again once it may have run out
                until = max(until, min(now + 0.05, end + cap_s))
            if until <= now:
                return self.done.is_set()
        return True

    def finish(self, result: Reply | Failure) -> None:
        if self.result is None:
            self.result = result
            self.done.set()
            if self.on_finish is not None:
                self.on_finish()


def _bundle_key(bundle: Bundle) -> tuple[_TensorKey, ...] | None:
    """What identifies ``bundle``'s contents for :meth:`CallTable._encoded` (None: not memoised, e.g. a value
    that is not a tensor, whose CodecError the encoder words, or an inference tensor, which has no version)."""
    key: list[_TensorKey] = []
    for name, t in bundle.items():
        if not isinstance(t, torch.Tensor):
            return None
        try:
            key.append((name, id(t), t._version, t.data_ptr(), tuple(t.shape), t.dtype))
        except RuntimeError:
            return None
    return tuple(key)


class CallTable:
    """The calls of one parent to its children, pending and given up on (under the roster's lock)."""

    def __init__(self, config: HubConfig, roster: Roster, meter: ByteMeter) -> None:
        self.config = config
        self.node = config.node
        self.roster = roster
        self.meter = meter
        self._calls: dict[int, Call] = {}
        self._expired: OrderedDict[int, Call] = OrderedDict()  # calls given up on, for their late replies
        self._ids = itertools.count(CALL_ID_BASE)
        self._last_shapes: tuple[Mapping[str, torch.Tensor], tuple[tuple[str, int], ...],
                                 tuple[TensorShape, ...]] | None = None
        self._last_encoded: tuple[Mapping[str, torch.Tensor], tuple[_TensorKey, ...], EncodedBundle] | None = None
        self._last_task: tuple[tuple[Any, ...], pb.Frame] | None = None  # the last Task frame built (_task_frame)
        self.encodings = 0  # bundles encoded by call() (one per scatter, not one per call: _encoded)

    @property
    def expired(self) -> Mapping[int, Call]:
        """The calls given up on whose late replies are still counted (the newest ``EXPIRED_KEPT``)."""
        return self._expired

    def call(self, target: NodeId, task: str, bundle: Bundle, args: Mapping[str, Scalar], round_idx: int,
             deadline_s: float, gate: ReplyGate | None = None,
             expect: Mapping[str, torch.Tensor] | None = None) -> Call | Failure:
        """Push one Task (and its bundle) to a child; the Result completes the returned :class:`Call`. With
        ``gate``, the reply's bundle is read only when the gate admits it; with ``expect`` (what the reply's
        bundle must hold: names, dtypes, shapes), a bundle header announcing anything else fails the reply
        before its bytes are read."""
        link, admitted = self.await_link(target)
        if link is not None and link.dropped and not link.alive:
            return Failure(f"{target} is not connected (dropped: {link.dropped})")
        if link is None or not link.alive:
            return Failure(f"{target} is not connected")
        # a node that just re-joined says Ready right after its Welcome: worth a short wait, not a lost round
        if not link.ready.is_set() and not (admitted and link.ready.wait(min(deadline_s, REJOIN_READY_WAIT_S))):
            return Failure(f"{target} is (re-)joining and not ready yet")
        if not admitted:
            return Failure(f"{target} joined late and is admitted at the next round")
        cid = next(self._ids)
        head = self._task_frame(cid, task, args, deadline_s, bool(bundle), round_idx)
        began = time.perf_counter()
        try:
            encoded = self._encoded(bundle)
            frames = message_frames(head, bundle, self.config.transport.chunk_bytes, encoded)
        except CodecError as e:
            return Failure(f"cannot send the bundle: {e}")
        sent_at = time.perf_counter()
        timeline.recorder(self.node).add(round_idx, self.node, "encode_req", sent_at - began)
        call = Call(cid, target, task, round_idx, gate=gate, sent_at=sent_at, expect=self._shapes(expect))
        timing.event("call", at=self.node, call=cid, child=target, task=task, round=round_idx)
        if gate is not None:
            gate.add(cid)
        with self.roster.lock:
            self._calls[cid] = call
        payload = int(encoded.header.total_bytes) if encoded is not None else payload_bytes(bundle)  # the same sum

        def sent(n: int) -> None:
            self.meter.record(self.node, target, meter_kind(task, "request"), "request", payload, n, round_idx)

        link.send(frames, sent)
        return call

    def _task_frame(self, cid: int, task: str, args: Mapping[str, Scalar], deadline_s: float, has_bundle: bool,
                    round_idx: int) -> pb.Frame:
        """``task_frame(cid, ...)``: the calls of one scatter send the same Task but for its call id, so the last
        one built is copied (a message copy, ~1 us, against ~7 us to build it: issue 19's per-call cost) while
        the task, its args, deadline and round are the same; the same fields, so the same size on every meter."""
        try:
            # the values' types too: 1, 1.0 and True are equal keys but different scalars
            key: tuple[Any, ...] | None = (task, tuple((k, type(v), v) for k, v in args.items()), deadline_s,
                                           has_bundle, round_idx)
            hash(key)
        except TypeError:  # a value that cannot be a key: task_frame says what is wrong with it, if anything
            key = None
        last = self._last_task
        if key is None or last is None or last[0] != key:
            frame = task_frame(cid, task, args, deadline_s=deadline_s, has_bundle=has_bundle, round_idx=round_idx)
            if key is not None:  # a copy of its own: the frame sent may be read by the link's thread meanwhile
                template = pb.Frame()
                template.CopyFrom(frame)
                self._last_task = (key, template)
            return frame
        frame = pb.Frame()
        frame.CopyFrom(last[1])
        frame.call_id = cid
        return frame

    def _shapes(self, expect: Mapping[str, torch.Tensor] | None) -> tuple[TensorShape, ...] | None:
        """``bundle_shapes(expect)``, computed once for the calls of one scatter (they share its ``expect``)."""
        if expect is None:
            return None
        key = tuple((k, id(v)) for k, v in expect.items())  # the tensors are alive (held by ``expect``)
        last = self._last_shapes
        if last is None or last[0] is not expect or last[1] != key:
            last = self._last_shapes = (expect, key, bundle_shapes(expect))
        return last[2]

    def _encoded(self, bundle: Bundle) -> EncodedBundle | None:
        """``bundle`` encoded once for the calls of one scatter (they share its snapshot): the header, checksum
        and payload views of the last bundle sent are reused while it is the same mapping holding the same
        tensors, unchanged (:data:`_TensorKey`: an in-place ``add_`` between two calls encodes again). None for
        an empty bundle; a bundle that cannot travel raises CodecError here, as ``message_frames`` would. The
        encoding is held until :meth:`forget_encoded` (NetComm calls it once a scatter's calls are queued)."""
        if not bundle:
            return None
        chunk_bytes = self.config.transport.chunk_bytes
        key = _bundle_key(bundle)
        last = self._last_encoded
        if key is not None and last is not None and last[0] is bundle and last[1] == key \
                and last[2].chunk_bytes == chunk_bytes:
            return last[2]
        encoded = encode_bundle(bundle, chunk_bytes)
        self.encodings += 1
        self._last_encoded = (bundle, key, encoded) if key is not None else None
        return encoded

    def forget_encoded(self) -> None:
        """Drop the memo of the last bundle encoded (and of the shapes expected of its replies): the calls that
        share it hold their own references until they are sent, and the model's memory is not held beyond them."""
        self._last_encoded = None
        self._last_shapes = None

    @contextlib.contextmanager
    def sharing_encoding(self) -> Iterator[None]:
        """The calls made inside share one encoding of their bundle (:meth:`_encoded`), forgotten on the way out."""
        try:
            yield
        finally:
            self.forget_encoded()

    def await_link(self, target: NodeId) -> tuple[ChildLink | None, bool]:
        """The target's session; a child that was admitted once and is away (restarting, re-joining) is
        given transport.rejoin_grace_s to come back and say Ready before the call fails."""
        end = time.monotonic() + self.config.transport.rejoin_grace_s
        roster = self.roster
        with roster.changed:
            while True:
                link = roster.links.get(target)
                admitted = target in roster.admitted
                usable = link is not None and link.alive and link.ready.is_set()
                left = end - time.monotonic()
                if usable or not admitted or left <= 0:
                    return link, admitted
                roster.changed.wait(min(left, 1.0))

    def expire(self, call: Call, why: str) -> None:
        """The caller stopped waiting: a reply that still comes is counted and dropped."""
        with self.roster.lock:
            if self._calls.pop(call.call_id, None) is not None:
                self._keep_expired(call)
        call.finish(Failure(why, silent=True))

    def _keep_expired(self, call: Call) -> None:
        self._expired[call.call_id] = call
        while len(self._expired) > EXPIRED_KEPT:
            self._expired.popitem(last=False)

    def take_pending(self, node: NodeId, *, keep_expired: bool) -> list[Call]:
        """Remove ``node``'s pending calls (the caller holds the roster's lock and finishes them); with
        ``keep_expired``, they are kept as given up on, so that their late replies are counted and dropped."""
        pending = [c for c in self._calls.values() if c.node == node]
        for c in pending:
            del self._calls[c.call_id]
            if keep_expired:
                self._keep_expired(c)
        return pending

    # -- a child's Result frames ----------------------------------------------------------------------------
    def assembler(self, link: ChildLink) -> MessageAssembler:
        """A child's frames become messages only for calls sent to it and pending, within its caps."""
        t = self.config.transport
        asm = MessageAssembler(t.max_bundle_bytes, budget=InflightBudget(t.max_open_bundles, t.inflight_bytes()),
                               accept=lambda head: self._unexpected_reply(link, head), expect=self._expected,
                               sink=self._sink)
        asm.lane = link.lane  # a bulk lane opened already (transport/lane.py); else set when it opens
        return asm

    def _sink(self, head: pb.Frame, header: pb.BundleHeader) -> PayloadSink | None:
        """Where a reply's bundle goes instead of a decode buffer: its gate's fold, chunk by chunk (reply_gate.py)."""
        with self.roster.lock:
            call = self._calls.get(head.call_id)
        return call.gate.sink(call.call_id, call.node, head, header) if call is not None and call.gate else None

    def _expected(self, call_id: int) -> tuple[TensorShape, ...] | None:
        """What the reply to ``call_id`` must hold (None: not said, or no such call: the assembler's ``accept``
        already admitted only calls pending for the link)."""
        with self.roster.lock:
            info = self._calls.get(call_id) or self._expired.get(call_id)
        return info.expect if info is not None else None

    def _unexpected_reply(self, link: ChildLink, head: pb.Frame) -> str | None:
        """Why a Task/Result frame from ``link`` opens no message (None: it is a reply to a call of ours, or a
        Post: a child's unprompted message for this node's mailbox)."""
        if head.WhichOneof("body") == "post":
            return None if head.call_id >= POST_ID_BASE else \
                f"{link.name} sent a Post with call id {head.call_id}, below a post's ({POST_ID_BASE})"
        if head.WhichOneof("body") != "result":
            return f"{link.name} sent a {head.WhichOneof('body')} frame; a child only answers calls"
        with self.roster.lock:
            info = self._calls.get(head.call_id) or self._expired.get(head.call_id)
        if info is None or info.node != link.node_id:
            return f"{link.name} answered call {head.call_id}, which is not pending for it"
        return None

    def answered(self, link: ChildLink, frame: pb.Frame) -> None:
        """A Result frame of a pending call came in: mark the call answered; a reply of a folding scatter then
        waits for its turn (``ReplyGate``) before its bundle is read, holding this session's reader."""
        call = self.arrived(link, frame)
        if call is not None and call.gate is not None:
            call.gate.enter(call.call_id)
            call.admitted_at = time.monotonic()

    def arrived(self, link: ChildLink, frame: pb.Frame) -> Call | None:
        """The first half of :meth:`answered`, which never waits: marks the call answered (once: a second Result
        frame of the call changes nothing) and returns it when its bundle must wait for the gate's admission
        (the caller then sets ``admitted_at``); None otherwise (admitted at once, or no such call)."""
        with self.roster.lock:
            call = self._calls.get(frame.call_id)
        if call is None or call.node != link.node_id or call.answered.is_set():
            return None
        call.answered_at = time.monotonic()
        call.answered.set()
        if call.gate is not None and frame.result.has_bundle:
            return call
        call.admitted_at = time.monotonic()
        return None

    def result(self, link: ChildLink, msg: Message) -> None:
        """A whole Result message: it completes its call (a late one is counted and dropped)."""
        with self.roster.lock:
            info = self._calls.get(msg.call_id) or self._expired.get(msg.call_id)
            if info is not None and info.node == link.node_id:
                call = self._calls.pop(msg.call_id, None)
                late = self._expired.pop(msg.call_id, None) if call is None else None
                link.heard(info.round)  # a whole reply, on time or late, good or an error: the child is not silent
            else:
                info = call = late = None
        if info is None:
            complain(self.node, link, msg.call_id, pb.ERROR_CODE_BAD_REQUEST,
                     f"{link.name} answered call {msg.call_id}, which is not pending for it")
            return
        self.meter.record(info.node, self.node, meter_kind(info.task, "reply"), "reply", msg.payload_bytes,
                          msg.message_bytes, info.round)
        timing.event("reply", at=self.node, call=msg.call_id, child=info.node)
        if info.sent_at:  # the round trip; less the child's own time (its Report), the messages' transfer
            timeline.recorder(self.node).add(info.round, self.node, "rtt", time.perf_counter() - info.sent_at,
                                             peer=info.node)
        if late is not None:
            log.info("%s: late reply from %s to %s (round %d) dropped", self.node, info.node, info.task,
                     info.round + 1)
            return
        assert call is not None
        call.finish(accept_result(msg, link.name, _HOST))  # NetComm moves replies to its node's device
