"""An edge says Ready to the PS only once it serves its neighbours (edge/node.py ``_TellParent``): a child's Ready
that changes the edge's sizes before then (after the hub's start, while the edge's heap settles) must not reach
the PS, which would start a round whose hand-off reaches the edge before it is in the run."""

from __future__ import annotations

from fedhop.edge.node import _TellParent


class Session:
    def __init__(self) -> None:
        self.sent: list[dict[str, int]] = []

    def send_ready(self, sizes: dict[str, int]) -> None:
        self.sent.append(dict(sizes))


def test_no_ready_before_the_edge_serves_then_every_change() -> None:
    session, sizes = Session(), {"client-0": 10}
    tell = _TellParent(session, lambda: sizes)  # type: ignore[arg-type]
    tell.sizes_changed()  # a client's Ready after the hub's start, before the edge serves its neighbours
    assert session.sent == []
    sizes["client-1"] = 5
    tell.announce()  # the edge serves: one Ready, with the sizes as they are now
    assert session.sent == [{"client-0": 10, "client-1": 5}]
    sizes["client-2"] = 7  # a late client
    tell.sizes_changed()
    assert session.sent[-1] == {"client-0": 10, "client-1": 5, "client-2": 7} and len(session.sent) == 2
