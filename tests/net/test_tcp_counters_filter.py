"""The wire level's kernel filter on loopback (transport/tcp_counters.py): a read asks the kernel only for the
sockets on the ports this process listens on (and the dialed nodes' ports), and gets the same counters for
this node's links as the dump of every socket of the machine did."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from fedhop.transport.tcp_counters import TcpCounters, TcpInfo, attribute, dump_tcp_sockets, own_socket_inodes


def sock_diag_works() -> bool:
    counters = TcpCounters("probe")
    counters.read()
    return counters.available


pytestmark = pytest.mark.skipif(not sock_diag_works(), reason="this kernel does not answer sock_diag to this user")


def _address(s: socket.socket) -> tuple[str, int]:
    host, port = s.getsockname()[:2]
    return host, port


@pytest.fixture
def links() -> Iterator[tuple[socket.socket, list[tuple[socket.socket, socket.socket]]]]:
    """A listener and three connections to it (client end, accepted end), each with bytes both ways."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    pairs = []
    for i in range(3):
        c = socket.create_connection(_address(srv))
        a, _ = srv.accept()
        c.sendall(b"u" * (1000 + i))
        a.sendall(b"d" * (300 + i))
        assert len(a.recv(1000 + i, socket.MSG_WAITALL)) == 1000 + i
        assert len(c.recv(300 + i, socket.MSG_WAITALL)) == 300 + i
        pairs.append((c, a))
    yield srv, pairs
    for c, a in pairs:
        c.close()
        a.close()
    srv.close()


def _settled(pairs: list[tuple[socket.socket, socket.socket]]) -> list[TcpInfo]:
    """This process's sockets from an unfiltered dump (the old read), once every byte sent was acknowledged."""
    want = {_address(c): 300 + i for i, (c, _) in enumerate(pairs)}  # the accepted end's remote address
    deadline = time.monotonic() + 5
    while True:
        mine = own_socket_inodes()
        infos = [t for t in dump_tcp_sockets() if t.inode in mine]
        acked = {t.remote: t.bytes_acked for t in infos if t.remote in want}
        if all(acked.get(a) == n for a, n in want.items()) or time.monotonic() > deadline:
            return infos


def test_a_read_gets_the_accepted_connections_with_the_same_counters(links) -> None:
    srv, pairs = links
    everything = _settled(pairs)
    port = _address(srv)[1]
    counters = TcpCounters("ps")
    got = counters.read()
    assert counters.available and port in counters.listening
    # only sockets on this process's listening ports (an earlier test of the same worker may have left a listener)
    assert all(t.local[1] in counters.listening for t in got)
    here = [t for t in got if t.local[1] == port]
    # the accepted ends (and the listener), not the client ends this process also holds (remote port = the port)
    assert {t.remote for t in here if t.remote[1]} == {_address(c) for c, _ in pairs}
    assert not [t for t in got if t.remote[1] == port]  # the client ends: on no listening port, left out
    assert len([t for t in everything if t.remote[1] == port]) == 3  # they were there to be left out
    # exactly the numbers of the unfiltered dump, and the same rows once attributed
    assert sorted(here, key=lambda t: t.inode) == sorted([t for t in everything if t.local[1] == port],
                                                         key=lambda t: t.inode)
    peers = {_address(c): f"client-{i}" for i, (c, _) in enumerate(pairs)}
    rows = attribute("ps", here, peers, {})
    assert rows == attribute("ps", [t for t in everything if t.local[1] == port], peers, {})
    assert [(r.src, r.dst, r.wire_bytes) for r in rows] == [
        ("client-0", "ps", 1000), ("client-1", "ps", 1001), ("client-2", "ps", 1002),
        ("ps", "client-0", 300), ("ps", "client-1", 301), ("ps", "client-2", 302)]


def test_the_dialed_ports_and_a_closed_listeners_connections_are_read(links) -> None:
    srv, pairs = links
    _settled(pairs)
    port = _address(srv)[1]
    counters = TcpCounters("edge-0")
    assert {t.local for t in counters.read([port]) if t.remote[1] == port} == {_address(c) for c, _ in pairs}
    srv.close()  # connections accepted on a port outlive its listener: still asked for
    left = counters.read()
    assert {t.remote for t in left if t.local[1] == port} == {_address(c) for c, _ in pairs}
