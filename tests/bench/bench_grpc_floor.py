"""The floor of a round over gRPC in Python: bare ``grpc.aio``, no fedhop code, the same messages as a FedAvg
client-round of fedhop, in ms per client and round (issue 19).

A server process (``grpc.aio`` on one event loop, as fedhop's PS: ``transport/aio_server.py``) holds one
bidirectional stream per client, N streams; this process runs the N clients on one asyncio loop (as the
``--fleet`` of ``bench_many_clients.py``: instant clients, no training), each on a connection of its own (as a
client host's ids; ``--streams-per-connection`` shares them). Each round the server sends every stream 3
messages (fedhop's Task, bundle header and payload chunk: ``--sizes``) and each client answers with 3 (Result,
header, chunk); the round ends when the server has read every client's 3. The handler is fedhop's shape: an
async generator that yields what a round sends, a reader task per stream that counts what arrives. Messages
are bytes (no protobuf), so this is gRPC-in-Python's own cost per message: what a design that sends ~6 gRPC
messages per client and round cannot go below.

``--fedhop`` runs, in the same invocation and after each floor run, ``bench_many_clients.py``'s fleet (``fedhop
server`` + the same number of instant fedhop clients in this process, FedAvg, MLP 20-16-10): fedhop's PS cost
per client and round, against the floor's.

    python tests/bench/bench_grpc_floor.py --clients 1000 --rounds 3 [--repeat 3] [--fedhop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SERVICE, METHOD = "floor.Floor", "Session"
PATH = f"/{SERVICE}/{METHOD}"
HELLO = b"hello"
# fedhop's messages of a FedAvg client-round on MLP 20-16-10 (506 float32 parameters): a Task frame, a bundle
# header frame and one chunk of ~2 KiB, each way (sizes of the serialized pb.Frame, rounded)
DEFAULT_SIZES = (100, 300, 2100)
OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


# -- the server (a process of its own) -------------------------------------------------------------------------

async def serve(port: int, clients: int, rounds: int, sizes: tuple[int, ...]) -> list[float]:
    """Serve ``clients`` streams for ``rounds`` rounds; the seconds each round took."""
    import grpc

    out = [os.urandom(n) for n in sizes]
    joined = asyncio.Event()
    round_go = [asyncio.Event() for _ in range(rounds + 1)]  # round_go[rounds]: the end (close every stream)
    state = {"joined": 0, "done": 0}
    round_done = asyncio.Event()

    async def read(requests: Any) -> None:
        got = 0
        async for _ in requests:
            got += 1
            if got == 1:  # the hello
                state["joined"] += 1
                if state["joined"] == clients:
                    joined.set()
            elif (got - 1) % len(sizes) == 0:  # a client's whole answer of the round
                state["done"] += 1
                if state["done"] == clients:
                    round_done.set()

    async def session(requests: Any, context: Any) -> Any:
        reader = asyncio.create_task(read(requests))
        try:
            for r in range(rounds + 1):
                await round_go[r].wait()
                if r == rounds:
                    return
                for m in out:
                    yield m
        finally:
            if not reader.done():
                reader.cancel()

    server = grpc.aio.server(options=OPTIONS)
    handler = grpc.stream_stream_rpc_method_handler(session)  # bytes in, bytes out
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("listening", flush=True)
    await joined.wait()
    times = []
    for r in range(rounds):
        state["done"] = 0
        round_done.clear()
        t0 = time.perf_counter()
        round_go[r].set()
        await round_done.wait()
        times.append(time.perf_counter() - t0)
    round_go[rounds].set()
    await server.stop(5)
    return times


# -- the clients (this process) ------------------------------------------------------------------------------

async def clients_run(addr: str, clients: int, rounds: int, sizes: tuple[int, ...], per_connection: int) -> None:
    import grpc

    answer = [os.urandom(n) for n in sizes]
    channels = [grpc.aio.insecure_channel(addr, options=[*OPTIONS, ("grpc.use_local_subchannel_pool", 1)])
                for _ in range(-(-clients // per_connection))]
    slots = asyncio.Semaphore(16)  # streams opened at once (a client host joins 8 ids at a time)

    async def one(channel: Any) -> None:
        q: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def requests() -> Any:
            while (m := await q.get()) is not None:
                yield m

        async with slots:
            call = channel.stream_stream(PATH)(requests())
            await q.put(HELLO)
            await call.wait_for_connection()
        got = 0
        async for _ in call:
            got += 1
            if got % len(sizes) == 0:
                for m in answer:
                    await q.put(m)
        await q.put(None)

    await asyncio.gather(*(one(channels[i // per_connection]) for i in range(clients)))
    for ch in channels:
        await ch.close()


def floor_run(clients: int, rounds: int, sizes: tuple[int, ...], per_connection: int) -> list[float]:
    """One run: the server in a child process, the clients here; the server's round times."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--clients", str(clients),
                               "--rounds", str(rounds), "--sizes", *map(str, sizes)],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    if server.stdout.readline().strip() != "listening":
        raise SystemExit("the floor's server did not start")
    asyncio.run(clients_run(f"127.0.0.1:{port}", clients, rounds, sizes, per_connection))
    out, _ = server.communicate(timeout=60)
    return json.loads(out.strip().splitlines()[-1])


def fedhop_run(clients: int, rounds: int) -> float:
    """fedhop's PS with instant clients (``bench_many_clients.py --fleet``): its mean round, in seconds."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_many_clients import run_fleet

    with tempfile.TemporaryDirectory(prefix="floor-fedhop-") as tmp:
        row = run_fleet(clients, rounds, Path(tmp))
    if not row.ok:
        raise SystemExit("fedhop's fleet run failed")
    return row.mean_round_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES),
                    help="the bytes of each message a round sends each way (default: fedhop's FedAvg MLP round)")
    ap.add_argument("--streams-per-connection", type=int, default=1)
    ap.add_argument("--fedhop", action="store_true", help="also run fedhop's fleet (the PS alone) after each run")
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the server process
    a = ap.parse_args()
    sizes = tuple(a.sizes)
    if a.serve is not None:
        print(json.dumps(asyncio.run(serve(a.serve, a.clients[0], a.rounds, sizes))), flush=True)
        return
    print(f"bare grpc.aio floor: {len(sizes)} messages each way per client-round ({', '.join(map(str, sizes))} B), "
          f"{a.streams_per_connection} stream(s) per connection, {a.rounds} rounds, {os.cpu_count()} cores")
    print("| clients | run | floor: mean round | floor: ms per client-round | fedhop fleet: mean round "
          "| fedhop: ms per client-round | fedhop / floor | load (1 min) before / after |")
    print("|---|---|---|---|---|---|---|---|")
    for n in a.clients:
        floors, fedhops = [], []
        for i in range(a.repeat):
            load0 = os.getloadavg()[0]
            times = floor_run(n, a.rounds, sizes, a.streams_per_connection)
            floor = statistics.mean(times)
            floors.append(floor)
            fed = fedhop_run(n, a.rounds) if a.fedhop else float("nan")
            fedhops.append(fed)
            print(f"| {n:,} | {i + 1} | {floor:.3f} s | {1e3 * floor / n:.3f} ms | {fed:.3f} s | "
                  f"{1e3 * fed / n:.3f} ms | {fed / floor:.1f}x | {load0:.1f} / {os.getloadavg()[0]:.1f} |",
                  flush=True)
        if a.repeat > 1:
            f, g = statistics.median(floors), statistics.median(fedhops)
            print(f"| {n:,} | median | {f:.3f} s | {1e3 * f / n:.3f} ms | {g:.3f} s | {1e3 * g / n:.3f} ms | "
                  f"{g / f:.1f}x | |", flush=True)


if __name__ == "__main__":
    main()
