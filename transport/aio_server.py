"""A gRPC server whose streams cost no thread each: ``grpc.aio`` on one event-loop thread, behind the face of a
``grpc.Server`` (add handlers and ports, ``start``, ``stop``), so that a node starts and stops it as any other.

A synchronous ``grpc.server`` holds a worker thread for every open stream, and ``Parent.Session`` adds a reader
thread: a PS with 1,000 children ran 2,015 threads, and 10,000 children would need 20,000 (issue 19). Here a
session is two coroutines (``transport/parent.py``'s :class:`~fedhop.transport.parent.AsyncParentServicer`);
the protocol's work on a frame runs in a small pool of its own (:data:`SESSION_WORKERS` threads). Handlers
that are plain functions (health, a token refusal) run in ``migration_thread_pool`` as before. The PS
(``server/main.py``) and every edge (``edge/node.py``: its children's sessions and its ``Edge`` service, whose
handlers are coroutines, ``transport/peer.py``) serve on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc

from fedhop.transport.channels import server_settings
from fedhop.transport.credentials import PLAINTEXT, Security, handler_like

T = TypeVar("T")
log = logging.getLogger("fedhop.channels")

SESSION_WORKERS = 16  # threads that run the session protocol's work on frames, whatever the number of sessions
SYNC_WORKERS = 32  # threads for handlers that are plain functions (health checks and their Watch streams)
TRANSFER_WORKERS = 256  # threads that read bundle payloads from bulk lanes (one per payload in flight; lane.py)


class _SyncInterceptor(grpc.aio.ServerInterceptor):
    """A synchronous ``grpc.ServerInterceptor`` (the token gate) on an aio server: it sees the handler the rest
    of the chain resolved and returns it or a refusal."""

    def __init__(self, inner: grpc.ServerInterceptor) -> None:
        self.inner = inner

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        out = self.inner.intercept_service(lambda _details: handler, details)
        if out is None or out is handler:
            return out
        return _async_refusal(out)


class _Aborted(Exception):
    pass


class _AbortContext:
    """What a synchronous refusal handler sees of an aio call: its peer, and an ``abort`` that is recorded (an
    aio context's ``abort`` is a coroutine: called from a plain function it would never run, and the call
    would hang instead of being refused)."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def peer(self) -> str:
        return self._context.peer()

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted(details)


def _async_refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A synchronous handler that refuses its call (``credentials._refusal``), as a coroutine of the same kind."""
    fn = (handler.stream_stream or handler.stream_unary or handler.unary_stream or handler.unary_unary)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        shim = _AbortContext(context)
        with contextlib.suppress(_Aborted):
            fn(request, shim)
        code, details = shim.aborted or (grpc.StatusCode.UNAUTHENTICATED, "refused")
        await context.abort(code, details)

    return handler_like(handler, refuse)


class LoopServer:
    """A ``grpc.aio`` server on an event loop of its own thread, driven from synchronous code."""

    def __init__(self, options: Sequence[tuple[str, Any]], interceptors: Sequence[grpc.ServerInterceptor] = (),
                 session_workers: int = SESSION_WORKERS, sync_workers: int = SYNC_WORKERS) -> None:
        self.loop = asyncio.new_event_loop()
        self.sessions = futures.ThreadPoolExecutor(session_workers, thread_name_prefix="session")
        # a payload read from a bulk lane holds its thread for the whole transfer (seconds on a slow link): not
        # one of the few session workers, which every session's frames need
        self.transfers = futures.ThreadPoolExecutor(TRANSFER_WORKERS, thread_name_prefix="lane")
        self._sync = futures.ThreadPoolExecutor(sync_workers, thread_name_prefix="grpc")
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-aio", daemon=True)
        self._thread.start()
        wrapped = [_SyncInterceptor(i) for i in interceptors]

        async def make() -> grpc.aio.Server:
            return grpc.aio.server(migration_thread_pool=self._sync, options=list(options), interceptors=wrapped)

        self._server = self._run(make())
        self._stopped = threading.Event()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _in_loop(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return self._run(call())

    # -- grpc.Server's face -----------------------------------------------------------------------------------
    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._in_loop(lambda: self._server.add_generic_rpc_handlers(tuple(handlers)))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._in_loop(lambda: self._server.add_registered_method_handlers(service, handlers))

    def add_insecure_port(self, address: str) -> int:
        return self._in_loop(lambda: self._server.add_insecure_port(address))

    def add_secure_port(self, address: str, credentials: grpc.ServerCredentials) -> int:
        return self._in_loop(lambda: self._server.add_secure_port(address, credentials))

    def start(self) -> None:
        self._run(self._server.start())

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving (open streams get ``grace`` seconds), then the loop and the pools; the returned event is
        set once all of it is done. Safe to call more than once."""
        if self._stopped.is_set() or not self._thread.is_alive():
            return self._stopped

        async def stop() -> None:
            await self._server.stop(grace)

        def done(_: Any) -> None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.sessions.shutdown(wait=False, cancel_futures=True)
            self.transfers.shutdown(wait=False, cancel_futures=True)
            self._sync.shutdown(wait=False, cancel_futures=True)
            self._stopped.set()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).add_done_callback(done)
        return self._stopped

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


def make_loop_server(security: Security = PLAINTEXT, handshake_timeout_s: float | None = None) -> LoopServer:
    """:func:`~fedhop.transport.channels.make_server`'s options and token gate, on a :class:`LoopServer`."""
    options, interceptors = server_settings(security, handshake_timeout_s)
    return LoopServer(options, interceptors)

