"""The wire level's pieces without sockets: tcp_info parsing, netlink replies, attribution of sockets to links,
and the probe's rows in a byte meter (transport/tcp_counters.py), all from fabricated kernel records."""

from __future__ import annotations

import socket
import struct

import pytest

from fedhop.common.wire.control import ReportCursor, meter_rows_from_pb, meter_rows_to_pb
from fedhop.common.wire.meter import WIRE_KIND, WIRE_PHASE, ByteMeter
from fedhop.transport.tcp_counters import (
    NLMSG_DONE,
    NLMSG_ERROR,
    SOCK_DIAG_BY_FAMILY,
    TcpInfo,
    WireDelta,
    WireProbe,
    attribute,
    diag_request,
    parse_diag_messages,
    parse_grpc_peer,
    parse_tcp_info,
)
from fedhop.v1 import fedhop_pb2 as pb

PS = ("127.0.0.1", 5000)


def info(remote: tuple[str, int], inode: int, acked: int, received: int, segs_out: int = 1, segs_in: int = 1,
         retrans: int = 0, local: tuple[str, int] = PS) -> TcpInfo:
    return TcpInfo(local, remote, inode, acked, received, segs_out, segs_in, retrans)


def tcp_info_bytes(acked: int, received: int, segs_out: int, segs_in: int, retrans: int, size: int = 232) -> bytes:
    buf = bytearray(size)
    struct.pack_into("=I", buf, 100, retrans)
    struct.pack_into("=QQ", buf, 120, acked, received)
    struct.pack_into("=II", buf, 136, segs_out, segs_in)
    return bytes(buf)


def diag_message(local: tuple[str, int], remote: tuple[str, int], inode: int, tcp_info: bytes) -> bytes:
    src = socket.inet_pton(socket.AF_INET, local[0]) + bytes(12)
    dst = socket.inet_pton(socket.AF_INET, remote[0]) + bytes(12)
    body = struct.pack("=BBBBHH16s16sI8sIIIII", socket.AF_INET, 1, 0, 0, socket.htons(local[1]),
                       socket.htons(remote[1]), src, dst, 0, bytes(8), 0, 0, 0, 1000, inode)
    rta = struct.pack("=HH", 4 + len(tcp_info), 2) + tcp_info
    rta += bytes((-len(rta)) % 4)
    body += rta
    return struct.pack("=IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, 2, 1, 0) + body


def test_grpc_peer_strings_become_addresses() -> None:
    assert parse_grpc_peer("ipv4:127.0.0.1:53122") == ("127.0.0.1", 53122)
    assert parse_grpc_peer("ipv6:[::1]:5000") == ("::1", 5000)
    assert parse_grpc_peer("ipv6:%5B::ffff:10.0.0.7%5D:41000") == ("10.0.0.7", 41000)
    assert parse_grpc_peer("unix:/tmp/sock") is None


def test_tcp_info_fields_and_too_old_a_kernel() -> None:
    assert parse_tcp_info(tcp_info_bytes(1000, 2000, 7, 9, 3)) == (1000, 2000, 7, 9, 3)
    assert parse_tcp_info(tcp_info_bytes(1, 2, 3, 4, 5)[:120]) is None  # no bytes_acked: no numbers at all


def test_netlink_reply_is_parsed_to_sockets_and_done() -> None:
    a = diag_message(PS, ("127.0.0.1", 41000), 77, tcp_info_bytes(5000, 300, 10, 6, 1))
    b = diag_message(PS, ("127.0.0.1", 41001), 78, tcp_info_bytes(10, 20, 1, 2, 0))
    done = struct.pack("=IHHII", 20, NLMSG_DONE, 2, 1, 0) + bytes(4)
    infos, finished = parse_diag_messages(a + b + done)
    assert finished
    assert infos == [info(("127.0.0.1", 41000), 77, 5000, 300, 10, 6, 1), info(("127.0.0.1", 41001), 78, 10, 20, 1, 2)]
    assert parse_diag_messages(a) == ([infos[0]], False)
    err = struct.pack("=IHHII", 20, NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -1)
    with pytest.raises(OSError):
        parse_diag_messages(err)
    req = diag_request(socket.AF_INET6, 2)
    assert len(req) == 16 + 56 and struct.unpack_from("=IH", req) == (72, SOCK_DIAG_BY_FAMILY)


def test_sockets_are_attributed_to_links_by_remote_address() -> None:
    peers = {("127.0.0.1", 41000): "client-0", ("127.0.0.1", 41001): "client-1"}
    last: dict = {}
    first = [info(("127.0.0.1", 41000), 1, 5000, 300, 10, 6, 2), info(("127.0.0.1", 41001), 2, 4000, 200, 8, 5),
             info(("10.9.9.9", 443), 3, 999, 999)]  # not a child: ignored
    assert attribute("ps", first, peers, last) == [
        WireDelta("client-0", "ps", 300, 6, 0), WireDelta("client-1", "ps", 200, 5, 0),
        WireDelta("ps", "client-0", 5000, 10, 2), WireDelta("ps", "client-1", 4000, 8, 0)]
    # the next read: only what changed since; client-1 closed (forgotten), client-0 has a second connection
    second = [info(("127.0.0.1", 41000), 1, 5600, 350, 12, 7, 2),
              info(("127.0.0.1", 41000), 4, 100, 50, 2, 2, local=("127.0.0.1", 5001))]
    assert attribute("ps", second, peers, last) == [WireDelta("client-0", "ps", 100, 3, 0),
                                                     WireDelta("ps", "client-0", 700, 4, 0)]
    assert set(last) == {(PS, ("127.0.0.1", 41000)), (("127.0.0.1", 5001), ("127.0.0.1", 41000))}
    # nothing moved: no rows; the same 4-tuple with a new inode is a new connection, counted from zero
    assert attribute("ps", second, peers, last) == []
    reused = [info(("127.0.0.1", 41000), 9, 40, 30, 1, 1)]
    assert attribute("ps", reused, peers, last) == [WireDelta("client-0", "ps", 30, 1, 0),
                                                     WireDelta("ps", "client-0", 40, 1, 0)]


class FakeCounters:
    def __init__(self, reads: list[list[TcpInfo]]) -> None:
        self.reads = reads

        self.asked: list[list[int]] = []  # the remote ports each read asked for

    def read(self, remote_ports: list[int] | tuple[int, ...] = ()) -> list[TcpInfo]:
        self.asked.append(list(remote_ports))
        return self.reads.pop(0)


def test_probe_reads_once_per_round_and_records_the_round_that_ended() -> None:
    meter = ByteMeter()
    c0 = ("127.0.0.1", 41000)
    reads = [[info(c0, 1, 100, 50)], [info(c0, 1, 1100, 550)], [info(c0, 1, 1300, 600)]]
    probe = WireProbe("ps", meter, lambda: {c0: "client-0"}, FakeCounters(reads))  # type: ignore[arg-type]
    probe.round_boundary(0)  # set-up traffic: round -1
    probe.round_boundary(0)  # the same round again: no read
    probe.round_boundary(1)  # round 0 ended
    probe.flush()  # the end: counted in the last round
    assert reads == []
    rows = [(r["src"], r["dst"], r["round"], r["wire_bytes"]) for r in meter.rows()]
    assert rows == [("client-0", "ps", -1, 50), ("client-0", "ps", 0, 500), ("client-0", "ps", 1, 50),
                    ("ps", "client-0", -1, 100), ("ps", "client-0", 0, 1000), ("ps", "client-0", 1, 200)]
    assert all(r["kind"] == WIRE_KIND and r["phase"] == WIRE_PHASE and r["messages"] == 0
               and r["payload_bytes"] == 0 == r["message_bytes"] for r in meter.rows())


def test_wire_rows_travel_in_reports_and_merge() -> None:
    meter = ByteMeter()
    meter.record("ps", "client-0", "fedavg.train", "request", 40, 60, 0)
    meter.record_wire("ps", "client-0", 0, 900, 4, 1)
    cursor = ReportCursor()
    rows, _ = cursor.delta(meter.rows(), [])
    f = pb.Frame()
    meter_rows_to_pb(rows, f.report.meter)
    back = meter_rows_from_pb(pb.Frame.FromString(f.SerializeToString()).report.meter)
    assert back == meter.rows()
    assert "wire_bytes" not in back[0] and back[1]["wire_bytes"] == 900 and back[1]["wire_retrans"] == 1
    meter.record_wire("ps", "client-0", 0, 100, 1, 0)
    rows, _ = cursor.delta(meter.rows(), [])
    assert rows == [{**meter.rows()[1], "wire_bytes": 100, "wire_segments": 1, "wire_retrans": 0}]
    parent = ByteMeter()
    parent.merge(back)
    parent.merge(rows)
    assert parent.rows() == meter.rows()
    assert parent.relabel_from(0) == 2 and parent.rows()[1]["wire_bytes"] == 1000


def test_probe_reads_the_connections_it_dialed_to_a_neighbour() -> None:
    meter = ByteMeter()
    child, neighbour = ("127.0.0.1", 41000), ("127.0.0.1", 6001)
    reads = [[info(child, 1, 10, 20, local=("127.0.0.1", 6000)),
              info(neighbour, 2, 5000, 40, local=("127.0.0.1", 42000))]]
    counters = FakeCounters(reads)
    probe = WireProbe("edge-0", meter, lambda: {child: "client-0"}, counters)  # type: ignore[arg-type]
    probe.dialed = lambda: {"edge-1": "127.0.0.1:6001", "edge-2": "no-such-host.invalid:1"}
    probe.flush()
    assert counters.asked == [[6001]]  # the kernel is asked for the connections to the neighbour's port too
    got = {(r["src"], r["dst"]): r["wire_bytes"] for r in meter.rows()}
    assert got == {("edge-0", "edge-1"): 5000, ("edge-1", "edge-0"): 40, ("edge-0", "client-0"): 10,
                   ("client-0", "edge-0"): 20}


def test_a_kernel_without_sock_diag_is_named_once_and_reads_nothing(monkeypatch, caplog) -> None:
    import fedhop.transport.tcp_counters as tc

    calls = []

    def refused(*args: object, **kwargs: object) -> list[TcpInfo]:
        calls.append(1)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tc, "dump_tcp_sockets", refused)
    counters = tc.TcpCounters("ps")
    with caplog.at_level("WARNING", logger="fedhop.wire"):
        assert counters.read() == [] and counters.read() == []
    assert not counters.available and calls == [1]
    lines = [r.getMessage() for r in caplog.records if r.name == "fedhop.wire"]
    assert len(lines) == 1 and "sock_diag" in lines[0] and "no wire level" in lines[0]
    meter = ByteMeter()
    WireProbe("ps", meter, dict, counters).flush()
    assert meter.rows() == []


# -- the kernel's filter program (INET_DIAG_REQ_BYTECODE) -------------------------------------------------------
# A transcription of linux/net/ipv4/inet_diag.c (inet_diag_bc_audit, valid_cc, inet_diag_bc_run) for the ops the
# builder may use, so the programs are checked against the kernel's rules, not against the builder itself.
# struct inet_diag_bc_op { unsigned char code; unsigned char yes; unsigned short no; } (linux/inet_diag.h)
BC_NOP, BC_JMP, BC_S_GE, BC_S_LE, BC_D_GE, BC_D_LE = 0, 1, 2, 3, 4, 5


def kernel_op(bc: bytes, at: int) -> tuple[int, int, int]:
    return struct.unpack_from("=BBH", bc, at)


def kernel_valid_cc(bc: bytes, cc: int) -> bool:
    """valid_cc(): the jump target ``cc`` bytes before the end lies on the chain of ``yes`` jumps."""
    at, length = 0, len(bc)
    while length >= 0:
        if cc > length:
            return False
        if cc == length:
            return True
        _, yes, _ = kernel_op(bc, at)
        if yes < 4 or yes & 3:
            return False
        length -= yes
        at += yes
    return False


def kernel_audit(bc: bytes) -> bool:
    """inet_diag_bc_audit(): True where the kernel accepts the program (else it answers EINVAL)."""
    at, length = 0, len(bc)
    while length > 0:
        min_len = 4
        code, yes, no = kernel_op(bc, at)
        if code in (BC_S_GE, BC_S_LE, BC_D_GE, BC_D_LE):
            min_len += 4  # valid_port_comparison(): the port is in a follow-on op
            if length < min_len:
                return False
        elif code not in (BC_JMP, BC_NOP):
            return False
        if code != BC_NOP:
            if no < min_len or no > length + 4 or no & 3:
                return False
            if no < length and not kernel_valid_cc(bc, length - no):
                return False
        if yes < min_len or yes > length + 4 or yes & 3:
            return False
        at += yes
        length -= yes
    return length == 0


def kernel_run(bc: bytes, sport: int, dport: int) -> bool:
    """inet_diag_bc_run(): whether a socket with these ports (host order) passes the filter."""
    at, length = 0, len(bc)
    while length > 0:
        code, yes_jump, no_jump = kernel_op(bc, at)
        if code == BC_NOP:
            ok = True
        elif code == BC_JMP:
            ok = False
        else:
            port = kernel_op(bc, at + 4)[2]  # op[1].no
            ok = {BC_S_GE: sport >= port, BC_S_LE: sport <= port, BC_D_GE: dport >= port, BC_D_LE: dport <= port}[code]
        jump = yes_jump if ok else no_jump
        length -= jump
        at += jump
    return length == 0


def test_port_filter_has_the_kernels_layout_for_one_local_port() -> None:
    from fedhop.transport.tcp_counters import port_filter

    # written out by hand from linux/inet_diag.h: {S_GE, yes 8, no 20} {port} {S_LE, yes 8, no 12} {port}: a failed
    # test jumps 4 bytes past the end (rejected), both passed run off the end exactly (accepted)
    assert port_filter([5000]) == struct.pack("=BBHBBHBBHBBH", BC_S_GE, 8, 20, 0, 0, 5000, BC_S_LE, 8, 12, 0, 0, 5000)
    assert port_filter([], [6001]) == struct.pack("=BBHBBHBBHBBH", BC_D_GE, 8, 20, 0, 0, 6001, BC_D_LE, 8, 12,
                                                  0, 0, 6001)
    assert port_filter() == b""
    with pytest.raises(ValueError):
        port_filter([70000])


@pytest.mark.parametrize("local, remote", [([5000], []), ([5000, 5001], []), ([443, 5000, 40000], [6001, 6002]),
                                           ([], [6001]), ([1, 65535], [0])])
def test_port_filter_passes_the_kernels_audit_and_accepts_exactly_its_ports(local: list[int],
                                                                           remote: list[int]) -> None:
    from fedhop.transport.tcp_counters import port_filter

    bc = port_filter(local, remote)
    assert kernel_audit(bc)
    ports = sorted({0, 1, 442, 443, 444, 4999, 5000, 5001, 5002, 6000, 6001, 6002, 6003, 39999, 40000, 65535,
                    *local, *remote})
    for sport in ports:
        for dport in ports:
            assert kernel_run(bc, sport, dport) == (sport in local or dport in remote), (sport, dport)


def test_the_kernels_audit_as_transcribed_refuses_a_broken_program() -> None:
    """The transcription can fail: a jump off the ``yes`` chain, a short port op and a misaligned jump."""
    good = struct.pack("=BBHBBH", BC_S_GE, 8, 12, 0, 0, 5000)
    assert kernel_audit(good)
    assert not kernel_audit(good[:4])  # the port's op is missing
    assert not kernel_audit(struct.pack("=BBHBBH", BC_S_GE, 8, 10, 0, 0, 5000))  # no & 3
    # the first test's reject lands on the second test's port op (not on the yes chain)
    off_chain = struct.pack("=BBHBBHBBHBBH", BC_S_GE, 8, 12, 0, 0, 5000, BC_S_LE, 8, 12, 0, 0, 5000)
    assert not kernel_audit(off_chain)


def test_diag_request_carries_the_filter_as_its_bytecode_attribute() -> None:
    from fedhop.transport.tcp_counters import port_filter

    bc = port_filter([5000], [6001])
    req = diag_request(socket.AF_INET, 3, bc, 1 << 10)
    length, mtype, flags, seq, _ = struct.unpack_from("=IHHII", req)
    assert (length, mtype, flags, seq) == (len(req), SOCK_DIAG_BY_FAMILY, 0x301, 3)
    family, proto, ext, states = struct.unpack_from("=BBBxI", req, 16)
    assert (family, proto, ext, states) == (socket.AF_INET, socket.IPPROTO_TCP, 1 << 1, 1 << 10)
    # struct nlattr after the 56-byte inet_diag_req_v2: len (header included), type INET_DIAG_REQ_BYTECODE = 1
    assert struct.unpack_from("=HH", req, 16 + 56) == (4 + len(bc), 1)
    assert req[16 + 56 + 4:] == bc and len(req) % 4 == 0
