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

    def read(self) -> list[TcpInfo]:
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
    probe = WireProbe("edge-0", meter, lambda: {child: "client-0"}, FakeCounters(reads))  # type: ignore[arg-type]
    probe.dialed = lambda: {"edge-1": "127.0.0.1:6001", "edge-2": "no-such-host.invalid:1"}
    probe.flush()
    got = {(r["src"], r["dst"]): r["wire_bytes"] for r in meter.rows()}
    assert got == {("edge-0", "edge-1"): 5000, ("edge-1", "edge-0"): 40, ("edge-0", "client-0"): 10,
                   ("client-0", "edge-0"): 20}


def test_a_kernel_without_sock_diag_is_named_once_and_reads_nothing(monkeypatch, caplog) -> None:
    import fedhop.transport.tcp_counters as tc

    calls = []

    def refused() -> list[TcpInfo]:
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
