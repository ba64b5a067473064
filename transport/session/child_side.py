"""The child side of ``Parent.Session`` (docs/design.md section 6), free of gRPC: :class:`ChildProtocol` handles
the parent's Welcome / Ready / Task / Bye and runs the tasks; :func:`hello_frame` opens a session. The gRPC
streams, dialing and re-joining are ``transport/child.py``'s."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from fedhop.common import timeline, timing
from fedhop.common.engine.api import NoAnswer, NodeContext, NodeId, get_task
from fedhop.common.engine.base import post_of
from fedhop.common.network_spec import compute_speed
from fedhop.common.spec import TransportSpec
from fedhop.common.testhooks import gate
from fedhop.common.wire.budget import InflightBudget
from fedhop.common.wire.control import ReportCursor, bye_frame, report_frame
from fedhop.common.wire.messages import (
    PROTOCOL_VERSION,
    FrameError,
    Message,
    MessageAssembler,
    error_frame,
    error_result_frame,
    message_frames,
    on_host,
    result_frame,
)
from fedhop.common.wire.scalars import put_scalars
from fedhop.transport.inbound import Rejection, accept_request
from fedhop.transport.session.link import CLOSE, ROLES, Frame
from fedhop.transport.workers import DaemonPool, SerialWork
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.session")

@dataclass(frozen=True)
class TaskHooks:
    """What a child node does around its tasks; each is optional. ``before_task(round, seconds left)``: before a
    task runs (an edge's per-round reset); ``after_task(ctx)``: after it, before its result is sent (the node's
    state is saved); ``report() -> (byte rows, missing entries)``: the node's meter and missing log, whose new
    rows follow each answered task as a Report."""

    before_task: Callable[[int | None, float], None] | None = None
    after_task: Callable[[NodeContext], None] | None = None
    report: Callable[[], tuple[list[dict], list[dict]]] | None = None
    parent_up: threading.Event | None = None  # set while the session to the parent works: posted tasks wait for it


NO_HOOKS = TaskHooks()
POSTED = object()  # the task worker's queue: (POSTED, inbox key) is a neighbour's post to run


class ChildProtocol:
    """What a child does with its parent's frames: tasks run one at a time, in arrival order, in a worker
    thread (handlers share the node's state and model template, and a task that arrives while a stale one
    runs must wait for it, not race it); each answered task is followed by a Report of what the node's byte
    meter and missing log gained (``report``), and Bye is answered with the rest."""

    def __init__(self, node: NodeId, ctx: NodeContext, send: Callable[[Iterable[pb.Frame | bytes]], None], *,
                 chunk_bytes: int, hooks: TaskHooks = NO_HOOKS, peers: dict[NodeId, str] | None = None,
                 task_lock: AbstractContextManager | None = None, workers: DaemonPool | None = None) -> None:
        """``workers``: threads shared with other nodes of the process (a client host's ids) that run this node's
        tasks in turn (a :class:`~fedhop.transport.workers.SerialWork`), instead of a worker thread of its own."""
        self.node = node
        timing.set_node(node)
        self.ctx = ctx
        self.send = send
        self.chunk_bytes = chunk_bytes
        self.hooks = hooks
        self.peers = peers if peers is not None else {}  # edge id -> Edge address, from the parent's Ready
        self.task_lock = task_lock if task_lock is not None else contextlib.nullcontext()  # held while a handler runs
        self.started = threading.Event()
        self.cursor = ReportCursor()
        self._report_lock = threading.Lock()
        self._tasks: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()
        self._stopping = threading.Event()
        self._serial: SerialWork | None = (SerialWork(workers, self._handle, f"{node}-tasks") if workers is not None
                                           else None)
        # the node's compute speed from the run's [network] profile (1.0: as fast as this host)
        self.compute = compute_speed(ctx.spec.network_profile(), node)  # a trace's compute column: over time

    def on_frame(self, frame: Frame, asm: MessageAssembler) -> pb.Bye | None:
        """Handle one frame of the parent's stream; returns the parent's Bye when it comes."""
        if isinstance(frame, pb.Frame):
            body = frame.WhichOneof("body")
            if body is None:
                return None
            if body == "ready":
                self.peers.update(frame.ready.peers)
                self.started.set()
                return None
            if body == "bye":
                return frame.bye
            if body == "error":
                log.warning("%s: parent reports (call %d): %s", self.node, frame.call_id, frame.error.message)
                return None
            if body in ("hello", "welcome", "report"):
                self._complain(0, f"unexpected {body} frame from the parent; ignored")
                return None
        try:
            msg = asm.feed(frame)
        except FrameError as e:
            self._complain(e.call_id, str(e))
            return None
        if msg is not None:
            timing.event("task_in", at=self.node, call=msg.call_id)
            self._enqueue((msg, time.monotonic()))
        return None

    def _complain(self, call_id: int, message: str) -> None:
        log.warning("%s: %s", self.node, message)
        self.send([error_frame(call_id, pb.ERROR_CODE_BAD_REQUEST, f"{self.node}: {message}")])

    def _fail(self, call_id: int, code: int, message: str) -> None:
        log.warning("%s: call %d failed: %s", self.node, call_id, message)
        self.send([error_result_frame(call_id, code, message)])

    def posted(self, key: str) -> None:
        """A neighbour's post, held in the node's inbox under ``key`` (``ChildSession.deliver_post``): it runs in
        the task worker, in turn; a key queued twice runs once, and one no longer in the inbox (rolled back) not."""
        timing.event("post_in", at=self.node, key=key)
        self._enqueue((POSTED, key))

    def _enqueue(self, item: tuple[Any, Any]) -> None:
        if self._serial is not None:
            self._serial.put(item)
            return
        self._start_worker()
        self._tasks.put(item)

    def _start_worker(self) -> None:
        with self._worker_lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True, name=f"{self.node}-tasks")
                self._worker.start()

    def _work(self) -> None:
        while (item := self._tasks.get()) is not CLOSE:
            self._handle(item)
            item = None  # a task's bundle is not held while the worker waits for the next task (whose bundle
            # then arrives into memory of its own: two models at once)

    def _handle(self, item: tuple[Any, Any]) -> None:
        msg, received = item
        if msg is POSTED:
            self._run_post(received)
        else:
            self._run_task(msg, received)

    def _wait_parent(self) -> bool:
        """Wait while the session to the parent is down (a posted task's reports must reach it, and a parent that
        resumed from a checkpoint rolls this node back first); False when the node stops meanwhile."""
        up = self.hooks.parent_up
        if up is None or up.is_set():
            return not self._stopping.is_set()
        with self._waiting():
            while not up.is_set():
                if self._stopping.is_set():
                    return False
                up.wait(0.2)
        return not self._stopping.is_set()

    def _run_post(self, key: str) -> None:
        """Run a posted task at the post's round, as a task from the parent runs (its state saved after it, its
        Report sent), but nobody waits for an answer: what the handler returns goes nowhere. A handler that
        fails is logged, and named in this node's missing log. It runs only while the session to the parent
        works (:meth:`_wait_parent`)."""
        ctx = self.ctx
        held = ctx.inbox.get(key)
        if held is not None:
            gate(f"{self.node}-{post_of(held)[0].round}")  # test hook: hold this node mid-round (common/testhooks.py)
        if not self._wait_parent():
            return
        entry = ctx.inbox.pop(key, None)
        if entry is None:  # queued twice, or rolled back with the node's state
            return
        post, _ = post_of(entry)
        ctx.round = post.round
        if self.hooks.before_task is not None:
            self.hooks.before_task(post.round, 0.0)
        clock = timeline.recorder(self.node)
        began = time.perf_counter()
        try:
            timing.event("run", at=self.node, task=post.task)
            with self.task_lock:
                get_task(post.task)(ctx, post.bundle, dict(post.scalars))
        except NoAnswer:
            pass
        except Exception as e:
            log.exception("%s: posted task %s (from %s) failed", self.node, post.task, post.sender)
            missing = getattr(ctx.comm, "missing", None)
            if missing is not None:
                missing.add(ctx.round, self.node, self.node, post.task,
                            f"posted task failed: {type(e).__name__}: {e}")
        finally:
            clock.add(ctx.round, self.node, "busy", time.perf_counter() - began)
        if self.hooks.after_task is not None:
            self.hooks.after_task(ctx)
        self.send_report(ctx.round)

    def _run_task(self, msg: Message, received: float) -> int:
        ctx = self.ctx
        req = accept_request(msg, self.node, "its parent", ctx.device)
        if isinstance(req, Rejection):
            self._fail(msg.call_id, req.code, req.message)
            return ctx.round
        try:
            handler = get_task(req.name)
        except KeyError:
            self._fail(req.call_id, pb.ERROR_CODE_UNKNOWN_TASK, f"{self.node}: unknown task {req.name!r}")
            return ctx.round
        if req.round is not None:
            ctx.round = req.round
        gate(f"{self.node}-{ctx.round}")  # test hook: hold this node mid-round (common/testhooks.py)
        if self.hooks.before_task is not None:
            self.hooks.before_task(req.round, req.deadline_s - (time.monotonic() - received) if req.deadline_s else 0.0)
        clock = timeline.recorder(self.node)
        try:
            timing.event("run", at=self.node, call=req.call_id, task=req.name)
            with self.task_lock:
                began = time.perf_counter()
                try:
                    reply = handler(ctx, req.bundle, dict(req.args))
                finally:
                    handler_s = time.perf_counter() - began
                    clock.add(ctx.round, self.node, "busy", handler_s)
            slowed_s = self._slow_down(handler_s)  # outside the lock: other clients of a host may compute meanwhile
            if slowed_s:
                clock.add(ctx.round, self.node, "busy", slowed_s)  # emulated compute is compute in the timeline
            timing.event("ran", at=self.node, call=req.call_id)
            began = time.perf_counter()
            out = on_host(reply.bundle)
            frames = message_frames(result_frame(req.call_id, reply.scalars, has_bundle=bool(out)), out,
                                    self.chunk_bytes)
            clock.add(ctx.round, self.node, "encode", time.perf_counter() - began)
        except NoAnswer:  # this node chose not to answer (e.g. not available this round): no Result at all
            if self.hooks.after_task is not None:
                self.hooks.after_task(ctx)
            self.send_report(ctx.round)
            return ctx.round
        except Exception as e:  # the handler failed: the parent sees this node as missing for this call
            log.exception("%s: task %s failed", self.node, req.name)
            self.send_report(ctx.round)
            self._fail(req.call_id, pb.ERROR_CODE_INTERNAL, f"{self.node}: {req.name} raised {type(e).__name__}: {e}")
            return ctx.round
        if self.hooks.after_task is not None:  # the node's state after this task, saved before anyone hears of it
            self.hooks.after_task(ctx)
        # from the task's arrival to its result ready to send: the parent's round trip less this is transfer
        clock.add(ctx.round, self.node, "served", time.monotonic() - received)
        # the Report goes before the Result on the same stream: once the parent holds a round's results, it
        # holds their byte rows too, so its checkpoint of that round is complete
        self.send_report(ctx.round)
        self.send(frames)
        return ctx.round

    def _slow_down(self, handler_s: float) -> float:
        """Emulate a node ``compute`` times as fast as this host: after a handler that took ``handler_s``,
        wait out the difference to ``handler_s / compute`` (the result is unchanged, only later). Each task's
        times are a timing event ``compute`` (``handler_s``, ``slowed_s``). Returns the seconds waited."""
        factor = self.compute()
        extra = handler_s * (1.0 / factor - 1.0) if factor < 1.0 else 0.0
        timing.event("compute", at=self.node, handler_s=handler_s, slowed_s=extra, factor=factor)
        if extra > 0:
            t0 = time.perf_counter()
            with self._waiting():
                self._stopping.wait(extra)
            return time.perf_counter() - t0
        return 0.0

    def _waiting(self) -> AbstractContextManager:
        """Around a wait of the task worker: on shared workers, the others' tasks go on meanwhile."""
        return self._serial.pool.blocking() if self._serial is not None else contextlib.nullcontext()

    def _unreported(self) -> tuple[list[dict], list[dict]]:
        if self.hooks.report is None:
            return [], []
        try:
            rows, missing = self.hooks.report()
        except Exception:
            log.exception("%s: collecting the byte meter failed", self.node)
            return [], []
        return self.cursor.delta(rows, missing)

    def send_report(self, round_idx: int) -> None:
        """Report what the meter and missing log gained since the last report (nothing when nothing did), with the
        timing rows (common/timeline.py) added since. A node without a byte meter (a client) sends no Reports:
        its timing rows travel in its Bye, so frames and their counts per link stay as they were."""
        with self._report_lock:
            rows, missing = self._unreported()
            if rows or missing:  # timing rows ride along; alone they wait for the next Report or the Bye
                self.send([report_frame(rows, missing, round_idx, timeline.recorder(self.node).unreported())])

    def stop(self) -> None:
        """Let the task in progress finish (it may still answer), then stop the worker."""
        self._stopping.set()
        if self._serial is not None:
            self._serial.close(timeout=5)
        elif self._worker is not None:
            self._tasks.put(CLOSE)
            self._worker.join(timeout=5)

    def bye(self) -> pb.Frame:
        """This child's Bye: what it has not reported yet."""
        with self._report_lock:
            rows, missing = self._unreported()
            return bye_frame("bye", finished=True, rows=rows, missing=missing,
                             timeline=timeline.recorder(self.node).unreported())


def child_assembler(transport: TransportSpec) -> MessageAssembler:
    """A child's assembler of its parent's stream: Task messages only, within ``transport``'s caps."""
    def tasks_only(head: pb.Frame) -> str | None:
        body = head.WhichOneof("body")
        return None if body == "task" else f"the parent sent a {body} frame; a parent only sends Tasks"

    return MessageAssembler(transport.max_bundle_bytes, accept=tasks_only,
                            budget=InflightBudget(transport.max_open_bundles, transport.inflight_bytes()))


def hello_frame(node: NodeId, role: str, address: str, info: Mapping[str, Any], run_id: str) -> pb.Frame:
    """The Hello frame a child opens its session with (``run_id`` set when re-joining)."""
    hello = pb.Frame()
    hello.hello.protocol = PROTOCOL_VERSION
    hello.hello.node_id = node
    hello.hello.role = ROLES[role]
    hello.hello.address = address
    hello.hello.run_id = run_id
    put_scalars(hello.hello.info, info)
    return hello
