"""Hostile peers against a real PS process (issue 9), several attacks in one federation: 20 TCP connections
that never speak and 20 sessions that never say Hello, opened before the honest clients start (more than the
PS's worker threads); a client that joins properly, never answers a task, and sends replies with 15 GiB bundle
headers and chunks for calls the PS never sent it. The honest run must start and finish, and every attack must
be logged by the PS."""

from __future__ import annotations

import queue
import socket
import threading
from pathlib import Path

import grpc

from fedhop.common.wire.framing import chunk_frame_bytes, parse_frame_lenient, serialize_frame
from fedhop.common.wire.messages import result_frame
from fedhop.transport.health import Probe, probe
from fedhop.transport.session import hello_frame
from fedhop.v1 import fedhop_pb2 as pb
from tests.integration.netutil import Federation, load_result, small_spec
from tests.waiting import exited, wait_until

SESSION = "/fedhop.v1.Parent/Session"
IDLE = 20
GiB = 1 << 30


def _requests(q: queue.Queue):
    while (item := q.get()) is not None:
        yield item


class FakeChild:
    """A raw ``Parent.Session`` stream driven frame by frame; ``frames`` collects what the parent sends."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.q: queue.Queue = queue.Queue()
        self.frames: queue.Queue = queue.Queue()
        self.ended = threading.Event()
        call = channel.stream_stream(SESSION, request_serializer=serialize_frame,
                                     response_deserializer=parse_frame_lenient)
        self.responses = call(_requests(self.q))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for f in self.responses:
                self.frames.put(f)
        except grpc.RpcError:
            pass
        self.ended.set()

    def send(self, frame: pb.Frame | bytes) -> None:
        self.q.put(frame)

    def next_body(self, body: str, timeout: float = 120.0) -> pb.Frame:
        while True:
            f = self.frames.get(timeout=timeout)
            if isinstance(f, pb.Frame) and f.WhichOneof("body") == body:
                return f

    def close(self) -> None:
        self.q.put(None)
        self.responses.cancel()


def forged_reply(cid: int) -> list[pb.Frame | bytes]:
    n = 15 * GiB
    header = pb.BundleHeader(chunk_bytes=1 << 20, checksum_algorithm="none", total_bytes=n,
                             tensors=[pb.TensorSpec(name="w", dtype="uint8", shape=[n], nbytes=n)])
    return [result_frame(cid, {"n": 10}, has_bundle=True), pb.Frame(call_id=cid, header=header),
            chunk_frame_bytes(cid, 0, bytes(1 << 20))]


def test_idle_connections_forged_bundles_and_a_silent_client_do_not_stop_the_run(tmp_path: Path) -> None:
    spec = small_spec("fedavg", clients=3, rounds=2,
                      transport={"handshake_timeout_s": 2.0, "round_deadline_s": 4.0, "rpc_timeout_s": 5.0})
    fed = Federation(spec, tmp_path, hold=("client-0", "client-1", "client-2"))
    sockets: list[socket.socket] = []
    channels: list[grpc.Channel] = []
    try:
        # the PS serves its health service from the moment it listens (server/main.py)
        wait_until(lambda: probe(fed.addr["ps"], 1.0).outcome == Probe.SERVING, "the PS to listen", timeout=120,
                   stop_if=exited(fed.ps, "the PS"), details=fed.all_logs)
        addr = fed.addr["ps"]
        for _ in range(IDLE):  # TCP connections that never send a byte
            sockets.append(socket.create_connection(("127.0.0.1", fed.port)))
        channels = [grpc.insecure_channel(addr) for _ in range(4)]
        idle = [FakeChild(channels[k % 4]) for k in range(IDLE)]  # sessions that never say Hello
        fed.start_node("client-0")
        fed.start_node("client-1")
        silent = FakeChild(grpc.insecure_channel(addr))
        silent.send(hello_frame("client-2", "client", "", {}, ""))
        silent.next_body("welcome")
        ready = pb.Frame()
        ready.ready.data_sizes["client-2"] = 50
        silent.send(ready)
        t = silent.next_body("task")  # never answered; replies for calls never sent instead
        for k in range(4):
            for f in forged_reply(t.call_id + 1000 + k):
                silent.send(f)
        silent.next_body("bye", timeout=240)
        silent.close()
        assert fed.wait(240) == 0, fed.all_logs()
        for s in sockets:  # the PS closed every connection that never spoke (gRPC's handshake timeout)
            s.settimeout(30)
            while s.recv(4096):
                pass
        assert all(c.ended.wait(30) for c in idle)
    finally:
        for s in sockets:
            s.close()
        for ch in channels:
            ch.close()
        fed.close()
    log = fed.ps_log()
    # each within transport.handshake_timeout_s, or sooner while many waited (issue 20: transport/session/liveness.py)
    assert log.count(": no Hello within ") >= IDLE, log[-3000:]
    assert log.count("which is not pending for it") >= 4
    res, _ = load_result(fed.out)
    assert len(res["rounds"]) == spec.rounds
    missing = [(m["round"], m["node"]) for m in res["missing"]]
    assert missing == [(1, "client-2"), (2, "client-2")], res["missing"]
    assert all("no reply within the deadline" in m["reason"] for m in res["missing"])
