"""A TCP proxy that delays what it forwards: the testbed's link delay where ``netem`` is missing.

It runs inside a listening node's namespace (the PS or an edge), on the node's testbed address, and forwards
every connection to the node's gRPC server on 127.0.0.1. Each chunk read from either side is written to the
other ``delay_ms`` after it was read, the delay chosen by the connecting peer's address; a peer not listed is
forwarded without delay. Each direction has its own delay and jitter: ``peer -> node`` (what the connecting peer
sends) and ``node -> peer``. With jitter ``j``, each chunk is held ``delay + u`` with ``u`` uniform in
``[-j, +j]`` from a random generator seeded by ``--seed``, the peer and the direction (so two runs draw the
same sequence per connection order); a chunk never overtakes the one before it (a TCP stream stays in order),
so a late chunk also holds back those behind it.

With ``--control FILE`` the table can change while connections are open (a trace replayed, a peer whose address
became known): the file holds ``{"ADDRESS": "MS[~JITTER][,MS[~JITTER]]", ...}`` (the ``--delay`` syntax) and
replaces the whole table whenever its modification time changes (checked every 50 ms); each chunk is held by the
table of the moment it is read.

What it models: a fixed one-way latency added per direction to every byte of a connection, so a request
answered at once sees its round-trip time grow by twice the delay, and each message arrives ``delay`` later.
What it does not model: the kernel's TCP sees the proxy, not the far end, so congestion control, slow start
and the bandwidth-delay product do not feel the delay (a window-limited bulk transfer is not slowed by it);
no loss or reordering (loss is a packet filter rule, deploy/loss.py); and the proxy buffers up to a few MiB
per direction, so the sender's flow control is decoupled from the receiver by that much.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import random
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHUNK = 64 << 10
QUEUE_CHUNKS = 64  # at most ~4 MiB in flight per direction
CONTROL_POLL_S = 0.05

log = logging.getLogger("fedhop.delay_proxy")


@dataclass(frozen=True)
class Hold:
    """How long one direction holds each chunk: ``delay_ms`` +- uniform ``jitter_ms``."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0

    def __str__(self) -> str:
        return f"{self.delay_ms:g}" + (f"~{self.jitter_ms:g}" if self.jitter_ms else "")


@dataclass(frozen=True)
class PeerDelay:
    """The two directions of the links of one peer address: ``inbound`` peer -> node, ``outbound`` node -> peer."""

    inbound: Hold
    outbound: Hold

    def __str__(self) -> str:
        return str(self.inbound) if self.inbound == self.outbound else f"{self.inbound},{self.outbound}"


def next_due(prev_due: float, now: float, hold: Hold, rng: random.Random) -> float:
    """When a chunk read at ``now`` (seconds) is written: ``now`` + delay + jitter, never before the chunk
    ahead of it (due at ``prev_due``): the stream keeps its order."""
    jitter = rng.uniform(-hold.jitter_ms, hold.jitter_ms) if hold.jitter_ms else 0.0
    return max(prev_due, now + max(0.0, hold.delay_ms + jitter) / 1000.0)


def due_times(arrivals: list[float], hold: Hold, rng: random.Random) -> list[float]:
    """:func:`next_due` of each chunk read at ``arrivals``, in order."""
    out: list[float] = []
    for t in arrivals:
        out.append(next_due(out[-1] if out else float("-inf"), t, hold, rng))
    return out


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: Callable[[], Hold],
                rng: random.Random) -> None:
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)

    async def read() -> None:
        due = float("-inf")
        while data := await reader.read(CHUNK):
            due = next_due(due, loop.time(), hold(), rng)
            await q.put((due, data))
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
                  delays: dict[str, PeerDelay], seed: int, counter: list[int]) -> None:
    peer = client_w.get_extra_info("peername")[0]
    none = PeerDelay(Hold(), Hold())
    counter[0] += 1
    base = f"{seed}:{peer}:{counter[0]}"
    rng_in, rng_out = random.Random(base + ":in"), random.Random(base + ":out")
    try:
        server_r, server_w = await asyncio.open_connection(*target)
    except OSError as e:
        log.warning("cannot reach %s:%d for %s: %s", *target, peer, e)
        client_w.close()
        return
    try:
        await asyncio.gather(_pump(client_r, server_w, lambda: delays.get(peer, none).inbound, rng_in),
                             _pump(server_r, client_w, lambda: delays.get(peer, none).outbound, rng_out))
    finally:
        for w in (client_w, server_w):
            w.close()


def read_control(path: Path) -> dict[str, PeerDelay]:
    """The table of a ``--control`` file (``{"ADDRESS": "MS[~JITTER][,MS[~JITTER]]"}``); ValueError if malformed."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object ADDRESS -> delay")
    try:
        return dict(_delay(f"{a}={v}") for a, v in raw.items())
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"{path}: {e}") from None


async def _follow(path: Path, table: dict[str, PeerDelay]) -> None:
    """Replace ``table``'s contents with the control file's whenever the file changes."""
    seen = None
    while True:
        with contextlib.suppress(FileNotFoundError):
            mtime = path.stat().st_mtime_ns
            if mtime != seen:
                seen = mtime
                try:
                    new = read_control(path)
                except (ValueError, OSError) as e:
                    log.error("control file ignored: %s", e)
                else:
                    table.clear()
                    table.update(new)
                    log.info("delays now %s", {a: str(d) for a, d in table.items()})
        await asyncio.sleep(CONTROL_POLL_S)


async def serve(listen: tuple[str, int] | socket.socket, target: tuple[str, int],
                delays: dict[str, PeerDelay] | dict[str, float], seed: int = 0, control: Path | None = None) -> None:
    """Forward connections accepted on ``listen`` (an address, or a listening socket, which may belong to
    another network namespace than this process) to ``target``; ``delays`` maps a peer address to its
    :class:`PeerDelay` (or to one delay in ms, both directions, no jitter). ``control``: a file whose table
    replaces ``delays`` whenever it changes (see the module docstring)."""
    table = {a: d if isinstance(d, PeerDelay) else PeerDelay(Hold(float(d)), Hold(float(d)))
             for a, d in delays.items()}
    follow = asyncio.ensure_future(_follow(control, table)) if control is not None else None  # noqa: F841
    handle = functools.partial(_handle, target=target, delays=table, seed=seed, counter=[0])
    if isinstance(listen, socket.socket):
        server = await asyncio.start_server(handle, sock=listen)
    else:
        server = await asyncio.start_server(handle, *listen)
    log.info("delay proxy %s -> %s:%d, delays %s", server.sockets[0].getsockname(), *target,
             {a: str(d) for a, d in table.items()})
    async with server:
        await server.serve_forever()


async def _serve_all(listens: list, target: tuple[str, int], delays: dict[str, PeerDelay], seed: int,
                     control: Path | None) -> None:
    await asyncio.gather(*(serve(lst, target, delays, seed, control) for lst in listens))


def _hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {s!r}")
    return host, int(port)


def _hold(text: str, whole: str) -> Hold:
    ms, _, jitter = text.partition("~")
    try:
        hold = Hold(float(ms), float(jitter or 0))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ADDRESS=MS[~JITTER][,MS[~JITTER]], got {whole!r}") from None
    if hold.delay_ms < 0:
        raise argparse.ArgumentTypeError(f"delay must be >= 0 ms, got {whole!r}")
    if hold.jitter_ms < 0:
        raise argparse.ArgumentTypeError(f"jitter must be >= 0 ms, got {whole!r}")
    if hold.jitter_ms > hold.delay_ms:
        raise argparse.ArgumentTypeError(f"jitter must not exceed the delay, got {whole!r}")
    return hold


def _delay(s: str) -> tuple[str, PeerDelay]:
    """``ADDRESS=MS[~JITTER][,MS[~JITTER]]``: the first peer -> node, the second (default: the same) node -> peer."""
    addr, _, rest = s.partition("=")
    inbound, _, outbound = rest.partition(",")
    hin = _hold(inbound, s)
    return addr, PeerDelay(hin, _hold(outbound, s) if outbound else hin)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedhop.deploy.delay_proxy", description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", type=_hostport, action="append",
                       help="HOST:PORT to accept connections on (repeatable: one table for all)")
    where.add_argument("--listen-fd", type=int, metavar="FD",
                       help="accept on this inherited listening socket (e.g. one made in another network namespace)")
    p.add_argument("--target", type=_hostport, required=True, help="HOST:PORT to forward them to")
    p.add_argument("--delay", type=_delay, action="append", default=[],
                   help="PEER_ADDRESS=MS[~JITTER][,MS[~JITTER]] (repeatable): peer -> node, then node -> peer")
    p.add_argument("--seed", type=int, default=0, help="seed of the jitter's random draws")
    p.add_argument("--control", type=Path, metavar="FILE",
                   help="JSON file ADDRESS -> MS[~JITTER][,MS[~JITTER]] that replaces the table whenever it changes")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        listens = [socket.socket(fileno=a.listen_fd)] if a.listen_fd is not None else a.listen
        asyncio.run(_serve_all(listens, a.target, dict(a.delay), a.seed, a.control))
    return 0


if __name__ == "__main__":
    sys.exit(main())
