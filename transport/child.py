"""The child side of ``Parent.Session`` (DESIGN.md section 4), used by clients and by edges.

The child dials its parent (outbound only, NAT-friendly), says Hello, receives Welcome with the RunSpec,
reports Ready with its data sizes, and then serves the Task messages its parent pushes: each runs the
registered handler (``get_task(name)``) in a worker thread with this node's :class:`NodeContext`, whose
state persists in this process. Every request is validated before it touches state; a malformed frame, a
bad bundle or an unknown task is answered with an error naming the problem, and the node keeps serving.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import grpc

from fedhop.common.engine.api import NodeContext, NodeId, Reply, Scalar, get_task
from fedhop.common.engine.base import BaseComm, Failure, check_bundle
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec
from fedhop.common.wire.bundle import Bundle
from fedhop.common.wire.codec import CodecError
from fedhop.common.wire.frames import (
    MAX_MESSAGE,
    PROTOCOL_VERSION,
    ROUND_ARG,
    BadFrame,
    FrameError,
    Message,
    MessageAssembler,
    error_frame,
    error_result_frame,
    get_scalars,
    message_frames,
    meter_rows_to_pb,
    missing_to_pb,
    on_host,
    parse_frame_lenient,
    put_scalars,
    result_frame,
    serialize_frame,
    to_device,
)
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.child")

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
ROLES = {"client": pb.ROLE_CLIENT, "edge": pb.ROLE_EDGE}
_CLOSE = object()


class JoinError(RuntimeError):
    """The parent refused this node, or could not be reached."""


class LeafComm(BaseComm):
    """A client's Comm: it has no children and no neighbours, so every call is an error."""

    def current_round(self) -> int:
        return -1

    def _exchange(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                  deadline_s: float | None) -> dict[NodeId, Reply | Failure]:
        raise RuntimeError(f"{self.node} is a client; it has nobody to scatter to")

    def hand_off(self, to: NodeId, slot: str, bundle: Bundle, scalars: Mapping[str, Scalar] | None = None) -> None:
        raise RuntimeError(f"{self.node} is a client; hand-offs are edge -> edge")

    def describe(self, peers: list[NodeId]) -> dict[NodeId, dict[str, Scalar]]:
        raise RuntimeError(f"{self.node} is a client; describe is edge -> edge")


class ChildSession:
    """This node's one stream to its parent."""

    def __init__(self, node_id: NodeId, role: str, parent: str, *, address: str = "",
                 info: Mapping[str, Scalar] | None = None, connect_timeout_s: float = 60.0) -> None:
        self.node = node_id
        self.role = role
        self.parent_addr = parent
        self.address = address
        self.info = dict(info or {})
        self.connect_timeout_s = connect_timeout_s
        self.peers: dict[NodeId, str] = {}  # edge id -> Edge service address, from the parent's Ready
        self.started = threading.Event()
        self.welcome: pb.Welcome | None = None
        self.chunk_bytes = 1 << 20
        self.max_bytes: int | None = None
        self._q: queue.Queue = queue.Queue()
        self._channel: grpc.Channel | None = None
        self._responses: Any = None
        # A node runs its tasks one at a time, in arrival order, as in the in-process engine: handlers share
        # the node's state and model template (functional_call is not thread-safe), and a task that arrives
        # while a stale one runs (its parent stopped waiting) must wait for it, not race it.
        self._tasks: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None

    # -- outbound -----------------------------------------------------------------------------------------
    def send(self, frames: Iterable[pb.Frame | bytes]) -> None:
        self._q.put(frames)

    def _outgoing(self) -> Iterator[pb.Frame | bytes]:
        while True:
            item = self._q.get()
            if item is _CLOSE:
                return
            try:
                yield from item
            except CodecError as e:
                log.error("%s: cannot send a message: %s", self.node, e)

    # -- joining ------------------------------------------------------------------------------------------
    def connect(self) -> pb.Welcome:
        """Dial the parent (waiting for it to come up), say Hello, and return its Welcome."""
        self._channel = grpc.insecure_channel(self.parent_addr, options=CHANNEL_OPTIONS)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.connect_timeout_s)
        except grpc.FutureTimeoutError:
            raise JoinError(f"{self.node}: parent {self.parent_addr} unreachable for "
                            f"{self.connect_timeout_s:.0f}s") from None
        rpc = self._channel.stream_stream("/fedhop.v1.Parent/Session", request_serializer=serialize_frame,
                                          response_deserializer=parse_frame_lenient)
        self._responses = rpc(self._outgoing())
        hello = pb.Frame()
        hello.hello.protocol = PROTOCOL_VERSION
        hello.hello.node_id = self.node
        hello.hello.role = ROLES[self.role]
        hello.hello.address = self.address
        put_scalars(hello.hello.info, self.info)
        self.send([hello])
        try:
            first = next(self._responses)
        except StopIteration:
            raise JoinError(f"{self.node}: parent {self.parent_addr} closed the session without a Welcome") from None
        except grpc.RpcError as e:
            raise JoinError(f"{self.node}: parent {self.parent_addr}: {e.code().name}: {e.details()}") from None
        if isinstance(first, pb.Frame) and first.WhichOneof("body") == "error":
            raise JoinError(f"{self.node}: parent {self.parent_addr} refused: {first.error.message}")
        if not isinstance(first, pb.Frame) or first.WhichOneof("body") != "welcome":
            raise JoinError(f"{self.node}: expected Welcome from {self.parent_addr}, got {first!r}")
        self.welcome = first.welcome
        return first.welcome

    def join(self, device: str | None = None, data_path: str | None = None) -> tuple[pb.Welcome, Workspace]:
        """connect(), then build this process's Workspace from the RunSpec in the Welcome and check that the
        run gives this node the role it joined as; a JoinError says what went wrong."""
        welcome = self.connect()
        ws = Workspace(RunSpec.model_validate_json(welcome.spec), device, data_path)
        try:
            role = ws.topology.role(self.node)
        except KeyError:
            role = None
        if role != self.role:
            raise JoinError(f"{self.node} is not {'an' if self.role == 'edge' else 'a'} {self.role} of this run")
        self.configure(ws.spec.transport.chunk_bytes, ws.spec.transport.max_bundle_bytes)
        return welcome, ws

    def configure(self, chunk_bytes: int, max_bytes: int) -> None:
        self.chunk_bytes, self.max_bytes = chunk_bytes, max_bytes

    def send_ready(self, data_sizes: Mapping[NodeId, int]) -> None:
        f = pb.Frame()
        f.ready.SetInParent()
        for k, v in data_sizes.items():
            f.ready.data_sizes[k] = int(v)
        self.send([f])

    # -- serving ------------------------------------------------------------------------------------------
    def serve(self, ctx: NodeContext, on_bye: Callable[[], tuple[list[dict], list[dict]]]) -> bool:
        """Serve Tasks until the parent says Bye (answered with ``on_bye()``'s meter rows and missing log;
        returns True) or the stream breaks (returns False)."""
        asm = MessageAssembler(max_bytes=self.max_bytes)
        try:
            for frame in self._responses:
                if isinstance(frame, pb.Frame):
                    body = frame.WhichOneof("body")
                    if body is None:
                        continue
                    if body == "ready":
                        self.peers.update(frame.ready.peers)
                        self.started.set()
                        continue
                    if body == "bye":
                        self._finish(on_bye)
                        return True
                    if body == "error":
                        log.warning("%s: parent reports (call %d): %s", self.node, frame.call_id,
                                    frame.error.message)
                        continue
                    if body in ("hello", "welcome"):
                        self._complain(0, f"unexpected {body} frame from the parent; ignored")
                        continue
                try:
                    msg = asm.feed(frame)
                except FrameError as e:
                    self._complain(e.call_id, str(e))
                    if isinstance(frame, BadFrame):
                        continue
                    continue
                if msg is not None:
                    if self._worker is None:
                        self._worker = threading.Thread(target=self._work, args=(ctx,), daemon=True,
                                                        name=f"{self.node}-tasks")
                        self._worker.start()
                    self._tasks.put(msg)
        except grpc.RpcError as e:
            log.error("%s: stream to parent %s broken: %s %s", self.node, self.parent_addr, e.code().name,
                      e.details())
            return False
        log.error("%s: parent %s closed the stream without Bye", self.node, self.parent_addr)
        return False

    def _complain(self, call_id: int, message: str) -> None:
        log.warning("%s: %s", self.node, message)
        self.send([error_frame(call_id, pb.ERROR_CODE_BAD_REQUEST, f"{self.node}: {message}")])

    def _fail(self, call_id: int, code: int, message: str) -> None:
        log.warning("%s: call %d failed: %s", self.node, call_id, message)
        self.send([error_result_frame(call_id, code, message)])

    def _work(self, ctx: NodeContext) -> None:
        while (msg := self._tasks.get()) is not _CLOSE:
            self._run_task(ctx, msg)

    def _run_task(self, ctx: NodeContext, msg: Message) -> None:
        cid = msg.call_id
        if msg.kind != "task":
            self._fail(cid, pb.ERROR_CODE_BAD_REQUEST, f"{self.node} expected a Task, got a {msg.kind} frame")
            return
        task = msg.head.task
        if msg.error is not None:
            self._fail(cid, pb.ERROR_CODE_BAD_BUNDLE, f"{self.node} rejected {task.name!r}: {msg.error}")
            return
        try:
            args = get_scalars(task.args)
        except CodecError as e:
            self._fail(cid, pb.ERROR_CODE_BAD_REQUEST, f"{self.node}: bad args of {task.name!r}: {e}")
            return
        rnd = args.pop(ROUND_ARG, None)
        try:
            handler = get_task(task.name)
        except KeyError:
            self._fail(cid, pb.ERROR_CODE_UNKNOWN_TASK, f"{self.node}: unknown task {task.name!r}")
            return
        reason = check_bundle(msg.bundle)
        if reason is not None:
            self._fail(cid, pb.ERROR_CODE_BAD_BUNDLE, f"{self.node} rejected the request {task.name!r}: {reason}")
            return
        if isinstance(rnd, int | float):
            ctx.round = int(rnd)
        try:
            reply = handler(ctx, to_device(msg.bundle, ctx.device), dict(args))
            out = on_host(reply.bundle)
            frames = message_frames(result_frame(cid, reply.scalars, has_bundle=bool(out)), out, self.chunk_bytes)
        except Exception as e:  # the handler failed: the parent sees this node as missing for this call
            log.exception("%s: task %s failed", self.node, task.name)
            self._fail(cid, pb.ERROR_CODE_INTERNAL, f"{self.node}: {task.name} raised {type(e).__name__}: {e}")
            return
        self.send(frames)

    def _finish(self, on_bye: Callable[[], tuple[list[dict], list[dict]]]) -> None:
        if self._worker is not None:
            self._tasks.put(_CLOSE)
            self._worker.join(timeout=5)
        try:
            rows, missing = on_bye()
        except Exception:
            log.exception("%s: collecting the byte meter failed", self.node)
            rows, missing = [], []
        f = pb.Frame()
        f.bye.reason = "bye"
        meter_rows_to_pb(rows, f.bye.meter)
        missing_to_pb(missing, f.bye.missing)
        self.send([f])
        self._q.put(_CLOSE)
        try:  # drain until the parent closes its side, so the Bye is delivered
            for _ in self._responses:
                pass
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._q.put(_CLOSE)
        if self._channel is not None:
            self._channel.close()
