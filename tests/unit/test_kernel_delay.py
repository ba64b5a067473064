"""deploy/kernel_delay.py without a kernel: its netlink messages, its hold table and control file, and the holding
loop's schedule driven by a fake socket and clock (the real queue is exercised as root in
tests/testbed/test_link_profile.py)."""

from __future__ import annotations

import argparse
import random
import socket
import struct
from pathlib import Path

import pytest

from fedhop.deploy import kernel_delay as kd
from fedhop.deploy.container_net import listen_openly
from fedhop.deploy.delay_proxy import Hold


def _packet(queue: int, pid: int) -> bytes:
    """A queued packet as the kernel sends it: nlmsghdr, nfgenmsg, NFQA_PACKET_HDR (id, hw protocol, hook)."""
    attrs = kd.attr(kd.NFQA_PACKET_HDR, struct.pack("!IHB", pid, 0x0800, 0))
    return kd.message(kd.NFQNL_MSG_PACKET, queue, attrs)


def test_messages_are_laid_out_as_nfnetlink_queue_expects() -> None:
    m = kd.verdict_batch(4201, 77)
    length, kind, flags = struct.unpack_from("=IHH", m)
    assert length == len(m) == 16 + 4 + 12 and kind == (3 << 8) | 3 and flags == kd.NLM_F_REQUEST
    assert struct.unpack_from("!BBH", m, 16) == (socket.AF_UNSPEC, 0, 4201)  # the queue, big-endian
    assert struct.unpack_from("=HH", m, 20) == (12, kd.NFQA_VERDICT_HDR)
    assert struct.unpack_from("!II", m, 24) == (kd.NF_ACCEPT, 77)
    bind, params = kd.bind_messages(4200, seq=9)
    assert struct.unpack_from("=I", bind, 8)[0] == 9 and struct.unpack_from("=I", params, 8)[0] == 10
    assert struct.unpack_from("=H", bind, 6)[0] & kd.NLM_F_ACK
    assert kd.attr(1, b"abcde") == struct.pack("=HH", 9, 1) + b"abcde\0\0\0"  # padded to 4 bytes


def test_parse_reads_packet_ids_and_acknowledgements() -> None:
    ack = struct.pack("=IHHII", 36, kd.NLMSG_ERROR, 0, 5, 0) + struct.pack("=i", -1) + b"\0" * 16
    buf = _packet(4200, 3) + _packet(4201, 8) + ack
    packets, acks = kd.parse(buf)
    assert packets == [(4200, 3), (4201, 8)]
    assert acks == [(5, 1)]  # EPERM
    assert kd.parse(b"") == ([], [])


def test_holds_and_the_control_file(tmp_path: Path) -> None:
    assert kd.parse_hold("50") == Hold(50.0, 0.0) and kd.parse_hold("50~10") == Hold(50.0, 10.0)
    for bad in ("x", "10~20", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            kd.parse_hold(bad)
    f = tmp_path / "c.json"
    kd.write_control(f, {"10.0.0.2": Hold(40, 30), "10.0.0.1": Hold(0, 0)})
    assert f.read_text() == '{"10.0.0.1": "0", "10.0.0.2": "40~30"}'
    assert kd.read_control(f) == {"10.0.0.1": Hold(), "10.0.0.2": Hold(40.0, 30.0)}
    f.write_text('["10.0.0.1"]')
    with pytest.raises(ValueError, match="expected an object"):
        kd.read_control(f)
    assert kd.rule("10.0.0.2", 4200) == ["PREROUTING", "-s", "10.0.0.2/32", "-j", "NFQUEUE", "--queue-num", "4200",
                                          "--queue-bypass"]


class FakeSocket:
    def __init__(self) -> None:
        self.inbox: list[bytes] = []
        self.sent: list[bytes] = []

    def recv(self, n: int, flags: int = 0) -> bytes:
        if not self.inbox:
            raise BlockingIOError
        return self.inbox.pop(0)

    def send(self, m: bytes) -> int:
        self.sent.append(m)
        return len(m)


def test_the_loop_releases_each_packet_after_its_hold_in_order() -> None:
    """Packets of one direction held 50 ms +- 20 ms: each is released at its due time, never before the one
    ahead of it (one batch verdict per release), the draws those of the seeded generator."""
    now = [100.0]
    loop = kd.KernelDelay.__new__(kd.KernelDelay)
    loop.seed, loop.clock, loop.dirs, loop.by_queue, loop._stop = 5, lambda: now[0], {}, {}, False
    loop.sock = FakeSocket()
    d = kd.Direction("10.0.0.2", 4200, Hold(50, 20), random.Random("5:10.0.0.2:kernel"))
    loop.dirs[d.addr], loop.by_queue[d.queue] = d, d
    loop.sock.inbox = [_packet(4200, 1) + _packet(4200, 2)]
    loop._receive()
    now[0] = 100.001
    loop.sock.inbox = [_packet(4200, 3), _packet(9999, 1)]  # and a packet of a queue not ours: released at once
    loop._receive()
    assert [struct.unpack_from("!HII", m, 18)[0::2] for m in loop.sock.sent] == [(9999, 1)]
    rng = random.Random("5:10.0.0.2:kernel")
    due, expect = float("-inf"), []
    for t in (100.0, 100.0, 100.001):
        due = max(due, t + (50 + rng.uniform(-20, 20)) / 1000)
        expect.append(due)
    assert [x for x, _ in d.held] == pytest.approx(expect)
    loop.sock.sent.clear()
    now[0] = expect[1] - 1e-6  # the first is due, not the second
    nxt = loop._release()
    released = [struct.unpack_from("!II", m, 24)[1] for m in loop.sock.sent]
    assert nxt == pytest.approx(expect[1])
    assert released == ([1] if expect[0] < expect[1] else [])
    now[0] = expect[2]
    assert loop._release() == float("inf") and [struct.unpack_from("!II", m, 24)[1] for m in loop.sock.sent][-1] == 3
    assert d.packets == 3 and not d.held


def test_a_container_role_behind_no_proxy_listens_on_the_network() -> None:
    role = ["edge", "--id", "edge-0", "--listen", "127.0.0.1:50061", "--advertise", "edge-0:50061"]
    assert listen_openly(role, 50061) == ["edge", "--id", "edge-0", "--listen", "0.0.0.0:50061", "--advertise",
                                          "edge-0:50061"]
    assert listen_openly(role, 50051) == role


def test_a_control_file_change_re_holds_the_known_directions(tmp_path: Path) -> None:
    """A trace step rewrites the control file: the next poll gives each known direction its new hold, and one the
    file no longer lists holds nothing (its rule stays for a later step)."""
    loop = kd.KernelDelay.__new__(kd.KernelDelay)
    loop.seed, loop.dirs, loop.by_queue = 0, {}, {}
    for i, addr in enumerate(("10.0.0.2", "10.0.0.3")):
        d = kd.Direction(addr, 4200 + i, Hold(40, 0), random.Random(i))
        loop.dirs[addr], loop.by_queue[d.queue] = d, d
    control = tmp_path / "kdelay.json"
    kd.write_control(control, {"10.0.0.2": Hold(200, 20)})
    seen = loop._follow(control, None)
    assert loop.dirs["10.0.0.2"].hold == Hold(200, 20) and loop.dirs["10.0.0.3"].hold == Hold()
    assert loop._follow(control, seen) == seen  # unchanged: not read again
    control.write_text("{not json")
    control.touch()
    loop._follow(control, None)  # a broken file is logged and ignored
    assert loop.dirs["10.0.0.2"].hold == Hold(200, 20)
