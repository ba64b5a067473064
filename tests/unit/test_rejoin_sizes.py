"""A child that re-joins keeps its data sizes while its new session is between Hello and Ready: a round that
begins in that moment must not see its subtree as empty (the PS would then reject the re-joined edge's reply
as claiming more samples than its cluster has: seen once in test_ps_stalled_past_the_keepalive_keeps_its_federation)."""

from __future__ import annotations

from fedhop.transport.session import hello_frame
from fedhop.v1 import fedhop_pb2 as pb
from tests.unit.hostile import RUN_ID, configured_hub, drain, join, spec_for


def test_a_re_joining_child_keeps_its_sizes_until_its_new_ready() -> None:
    with configured_hub(spec_for(clients=2)) as (hub, _):
        old = join(hub, "client-0", size=11)
        join(hub, "client-1", size=7)
        assert hub.start() == {"client-0": 11, "client-1": 7}
        hub.lost(old, "stream broken")  # a Hello for a node whose session is alive is refused (issue 20)
        again = hub.open("ipv4:127.0.0.1:40001", None)
        assert hub.on_frame(again, hello_frame("client-0", "client", "", {}, RUN_ID))  # re-joins: Hello only
        assert hub.admit() == {"client-0": 11, "client-1": 7}
        ready = pb.Frame()
        ready.ready.data_sizes["client-0"] = 11
        assert hub.on_frame(again, ready)
        drain(again)
        assert hub.admit() == {"client-0": 11, "client-1": 7}


def test_a_late_child_has_no_size_before_its_first_ready() -> None:
    with configured_hub(spec_for(clients=2)) as (hub, _):
        join(hub, "client-0", size=11)
        hub.start()
        late = hub.open("ipv4:127.0.0.1:40002", None)
        assert hub.on_frame(late, hello_frame("client-1", "client", "", {}, ""))
        assert hub.admit() == {"client-0": 11}
