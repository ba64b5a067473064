"""Issue 20's session findings, driven without sockets: no refusal tells a newcomer the run id; a second Hello
for a connected node is refused whatever it carries (the run id included); a node declares only its own data
size, once, bounded (under TLS too); bundle headers of calls never sent (or closed) are refused at once and
their chunks dropped unread."""

from __future__ import annotations

import logging

import pytest

from fedhop.common.engine.base import Failure
from fedhop.common.wire.messages import CALL_ID_BASE, result_frame
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.session import hello_frame
from fedhop.v1 import fedhop_pb2 as pb
from tests.unit.hostile import RUN_ID, configured_hub, drain, errors, join, spec_for

GiB = 1 << 30


def header_claiming(nbytes: int) -> pb.BundleHeader:
    return pb.BundleHeader(chunk_bytes=1 << 20, checksum_algorithm="none", total_bytes=nbytes,
                           tensors=[pb.TensorSpec(name="w", dtype="uint8", shape=[nbytes], nbytes=nbytes)])


def ready(sizes: dict[str, int]) -> pb.Frame:
    f = pb.Frame()
    f.ready.SetInParent()
    for k, v in sizes.items():
        f.ready.data_sizes[k] = v
    return f


# -- session hijack on plaintext ---------------------------------------------------------------------------------


def test_no_refusal_tells_a_newcomer_the_run_id(caplog) -> None:
    caplog.set_level(logging.WARNING, "fedhop.session")
    with configured_hub(spec_for(clients=3, late_join="refuse")) as (hub, _):
        join(hub, "client-0")
        said: list[tuple[int, str]] = []
        hub.start()
        for hello in (hello_frame("client-1", "client", "", {}, "guess"),  # a wrong run id
                      hello_frame("client-2", "client", "", {}, ""),  # a late joiner, refused by the spec
                      hello_frame("client-0", "client", "", {}, "")):  # a connected id
            link = hub.open("ipv4:10.6.6.6:6666")
            assert not hub.on_frame(link, hello)
            said += [(f.error.code, f.error.message) for f in drain(link)[0] if f.WhichOneof("body") == "error"]
        assert [c for c, _ in said] == [pb.ERROR_CODE_RUN_MISMATCH, pb.ERROR_CODE_LATE_JOIN_REFUSED,
                                        pb.ERROR_CODE_ALREADY_CONNECTED]
        assert not any(RUN_ID in m for _, m in said), said
        assert f"(it runs {RUN_ID!r})" in caplog.text and f"(run {RUN_ID!r})" in caplog.text  # the log has it


def test_a_second_hello_for_a_connected_id_is_refused_even_with_the_run_id(caplog) -> None:
    """The hijack: a newcomer that says Hello with the run id for a connected node must not take its place."""
    caplog.set_level(logging.WARNING, "fedhop.session")
    with configured_hub(spec_for(clients=2)) as (hub, _):
        owner = join(hub, "client-0", peer="ipv4:127.0.0.1:40000")
        join(hub, "client-1", peer="ipv4:127.0.0.1:40001")
        hub.start()
        drain(owner)
        thief = hub.open("ipv4:127.0.0.1:50000")
        assert not hub.on_frame(thief, hello_frame("client-0", "client", "", {}, RUN_ID))
        frames, closed = drain(thief)
        assert closed and not thief.alive
        assert [f.WhichOneof("body") for f in frames] == ["error"]  # no Welcome: neither the spec nor the model
        assert frames[0].error.code == pb.ERROR_CODE_ALREADY_CONNECTED
        assert hub.roster.links["client-0"] is owner and owner.alive and not owner.superseded
        assert "rejected ipv4:127.0.0.1:50000: duplicate Hello: client-0 is already connected (from " \
               "ipv4:127.0.0.1:40000)" in caplog.text
        call = hub.call("client-0", "fedavg.train", {}, {}, 0, 30.0)  # the owner still gets its tasks
        assert not isinstance(call, Failure)
        assert [f.WhichOneof("body") for f in drain(owner)[0]] == ["task"] and drain(thief) == ([], False)


def test_a_child_whose_session_ended_still_rejoins_with_the_run_id() -> None:
    with configured_hub(spec_for(clients=2)) as (hub, _):
        old = join(hub, "client-0")
        hub.start()
        hub.lost(old, "stream broken")
        back = hub.open("ipv4:127.0.0.1:40002")
        assert hub.on_frame(back, hello_frame("client-0", "client", "", {}, RUN_ID))
        assert hub.roster.links["client-0"] is back
        assert [f.WhichOneof("body") for f in drain(back)[0]] == ["welcome"]


# -- data sizes: own, once, bounded ------------------------------------------------------------------------------


@pytest.mark.parametrize("security", ["plaintext", "tls"])
def test_a_client_declares_only_its_own_size_once_and_bounded(security: str, caplog) -> None:
    caplog.set_level(logging.WARNING, "fedhop.session")
    sec = Security("tls", "ps") if security == "tls" else PLAINTEXT
    with configured_hub(spec_for(clients=3, max_data_size=1000), security=sec) as (hub, _):
        links = {}
        for i, c in enumerate(("client-0", "client-1", "client-2")):
            links[c] = hub.open(f"ipv4:127.0.0.1:{41000 + i}", c if security == "tls" else None)
            assert hub.on_frame(links[c], hello_frame(c, "client", "", {}, ""))
            drain(links[c])
        refused = {
            "client-0": ({"client-0": 10**12}, "client-0 declared 1000000000000 samples for client-0, outside "
                                               "[0, transport.max_data_size = 1000]"),
            "client-1": ({"client-1": 10, "client-2": 1}, "client-1 declared a data size for 'client-2', which "
                                                          "is not itself"),
        }
        for c, (sizes, why) in refused.items():
            hub.on_frame(links[c], ready(sizes))
            assert errors(drain(links[c])[0]) == [f"Ready refused: {why}"]
            assert not links[c].ready.is_set() and why in caplog.text
        hub.on_frame(links["client-2"], ready({"client-2": 30}))
        assert links["client-2"].ready.is_set() and hub.data_sizes() == {"client-2": 30}
        hub.on_frame(links["client-2"], ready({"client-2": 31}))  # a change: refused, the first size kept
        assert errors(drain(links["client-2"])[0]) == [
            "Ready refused: client-2 declared 31 samples for client-2, which was declared with 30 before"]
        assert hub.data_sizes() == {"client-2": 30}
        hub.lost(links["client-2"], "restarted")  # once means once: a new session does not reset it
        again = hub.open("ipv4:127.0.0.1:41009", "client-2" if security == "tls" else None)
        assert hub.on_frame(again, hello_frame("client-2", "client", "", {}, RUN_ID))
        hub.on_frame(again, ready({"client-2": 1}))
        assert "which was declared with 30 before" in errors(drain(again)[0])[-1] and not again.ready.is_set()
        hub.on_frame(again, ready({"client-2": 30}))  # the same size again is fine
        assert again.ready.is_set() and hub.data_sizes() == {"client-2": 30}


def test_an_edge_declares_only_its_clusters_sizes() -> None:
    with configured_hub(spec_for(clients=4, edges=2)) as (hub, topo):
        edge = topo.edges[0]
        mine, other = topo.cluster(edge)[0], topo.cluster(topo.edges[1])[0]
        link = hub.open("ipv4:127.0.0.1:42000")
        assert hub.on_frame(link, hello_frame(edge, "edge", "127.0.0.1:1", {}, ""))
        drain(link)
        hub.on_frame(link, ready({mine: 5, other: 1}))
        assert errors(drain(link)[0]) == [f"Ready refused: {edge} declared a data size for {other!r}, which is not "
                                          "a client of its cluster"]
        assert not link.ready.is_set()
        hub.on_frame(link, ready({mine: 5}))
        assert link.ready.is_set() and hub.data_sizes() == {mine: 5}


# -- bundle headers of calls never sent ----------------------------------------------------------------------------


def test_a_header_for_a_call_never_sent_is_refused_at_once_and_its_chunks_dropped(allocations, caplog) -> None:
    """Without a Result frame first, or after a refused one: the header is refused (one error frame and one log
    line per call), before anything is reserved; its chunks are dropped unread, without a word each."""
    caplog.set_level(logging.WARNING, "fedhop.session")
    with configured_hub(spec_for()) as (hub, _):
        link = join(hub, "client-0")
        bare, after_head = CALL_ID_BASE + 77, CALL_ID_BASE + 78
        for cid in (bare, after_head):
            if cid == after_head:
                assert hub.on_frame(link, result_frame(cid, {}, has_bundle=True))
            assert hub.on_frame(link, pb.Frame(call_id=cid, header=header_claiming(15 * GiB)))
            for k in range(3):
                assert hub.on_frame(link, pb.Frame(call_id=cid, chunk=pb.Chunk(offset=k, data=b"x" * 1024)))
        frames, closed = drain(link)
        assert not closed and link.alive  # the session goes on: only the forged calls are refused
        assert [(f.call_id, f.error.message) for f in frames] == [
            (bare, f"client-0: bundle header for call {bare}, which announced no bundle"),
            (after_head, f"client-0: client-0 answered call {after_head}, which is not pending for it"),
            (after_head, f"client-0: bundle header for call {after_head} refused (client-0 answered call "
                         f"{after_head}, which is not pending for it); its chunks are dropped unread"),
        ]
        assert caplog.text.count("bundle header for call") == 2 and "no open bundle" not in caplog.text
        assert allocations == [] and link.asm.open_bundles == 0 and link.asm.budget.in_flight == (0, 0)


def test_a_header_for_a_closed_call_is_refused() -> None:
    with configured_hub(spec_for()) as (hub, _):
        link = join(hub, "client-0")
        hub.start()
        call = hub.call("client-0", "fedavg.train", {}, {}, 0, 30.0)
        assert not isinstance(call, Failure)
        drain(link)
        hub.on_frame(link, result_frame(call.call_id, {"n": 10}, has_bundle=False))
        assert call.done.is_set()
        hub.on_frame(link, pb.Frame(call_id=call.call_id, header=header_claiming(GiB)))
        hub.on_frame(link, pb.Frame(call_id=call.call_id, chunk=pb.Chunk(offset=0, data=b"x")))
        assert errors(drain(link)[0]) == [f"client-0: bundle header for call {call.call_id}, which announced no "
                                          "bundle"]
        assert link.asm.open_bundles == 0
