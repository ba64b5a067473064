"""A TCP proxy that delays what it forwards: the testbed's link delay where ``netem`` is missing.

It runs inside a listening node's namespace (the PS or an edge), on the node's testbed address, and forwards
every connection to the node's gRPC server on 127.0.0.1. Each chunk read from either side is written to the
other ``delay_ms`` after it was read, the delay chosen by the connecting peer's address; a peer not listed is
forwarded without delay.

What it models: a fixed one-way latency added per direction to every byte of a connection, so a request
answered at once sees its round-trip time grow by twice the delay, and each message arrives ``delay`` later.
What it does not model: the kernel's TCP sees the proxy, not the far end, so congestion control, slow start
and the bandwidth-delay product do not feel the delay (a window-limited bulk transfer is not slowed by it);
no jitter, loss or reordering; and the proxy buffers up to a few MiB per direction, so the sender's flow
control is decoupled from the receiver by that much.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import socket
import sys

CHUNK = 64 << 10
QUEUE_CHUNKS = 64  # at most ~4 MiB in flight per direction

log = logging.getLogger("fedhop.delay_proxy")


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)

    async def read() -> None:
        while data := await reader.read(CHUNK):
            await q.put((loop.time() + delay_s, data))
        await q.put(None)

    async def write() -> None:
        while (item := await q.get()) is not None:
            due, data = item
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    with contextlib.suppress(ConnectionError, OSError):
        await asyncio.gather(read(), write())


async def _handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, target: tuple[str, int],
                  delays: dict[str, float]) -> None:
    peer = client_w.get_extra_info("peername")[0]
    delay_s = delays.get(peer, 0.0) / 1000.0
    try:
        server_r, server_w = await asyncio.open_connection(*target)
    except OSError as e:
        log.warning("cannot reach %s:%d for %s: %s", *target, peer, e)
        client_w.close()
        return
    try:
        await asyncio.gather(_pump(client_r, server_w, delay_s), _pump(server_r, client_w, delay_s))
    finally:
        for w in (client_w, server_w):
            w.close()


async def serve(listen: tuple[str, int] | socket.socket, target: tuple[str, int], delays: dict[str, float]) -> None:
    """Forward connections accepted on ``listen`` (an address, or a listening socket, which may belong to
    another network namespace than this process) to ``target``."""
    handle = functools.partial(_handle, target=target, delays=delays)
    if isinstance(listen, socket.socket):
        server = await asyncio.start_server(handle, sock=listen)
    else:
        server = await asyncio.start_server(handle, *listen)
    log.info("delay proxy %s -> %s:%d, delays %s", server.sockets[0].getsockname(), *target, delays)
    async with server:
        await server.serve_forever()


def _hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {s!r}")
    return host, int(port)


def _delay(s: str) -> tuple[str, float]:
    addr, _, ms = s.partition("=")
    try:
        value = float(ms)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ADDRESS=MS, got {s!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"delay must be >= 0 ms, got {s!r}")
    return addr, value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedhop.deploy.delay_proxy", description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", type=_hostport, help="HOST:PORT to accept connections on")
    where.add_argument("--listen-fd", type=int, metavar="FD",
                       help="accept on this inherited listening socket (e.g. one made in another network namespace)")
    p.add_argument("--target", type=_hostport, required=True, help="HOST:PORT to forward them to")
    p.add_argument("--delay", type=_delay, action="append", default=[], help="PEER_ADDRESS=MS (repeatable)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        listen = socket.socket(fileno=a.listen_fd) if a.listen_fd is not None else a.listen
        asyncio.run(serve(listen, a.target, dict(a.delay)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
