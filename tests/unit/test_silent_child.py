"""A child that never answers is dropped (issue 9): after ``transport.drop_after_missed`` consecutive rounds
without any reply its parent closes the session, frees what it holds and goes on; the child may re-join.
Driven without sockets: a configured ParentHub and a NetComm, as in test_hostile_session.py."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from fedhop.common.spec import RunSpec, SpecError, TransportSpec
from fedhop.common.topology import Topology
from fedhop.common.wire.messages import error_result_frame, result_frame
from fedhop.transport.netcomm import NetComm
from fedhop.transport.session import QUIET, ChildLink, HubListener, ParentHub, hello_frame
from fedhop.v1 import fedhop_pb2 as pb
from tests.unit.hostile import RUN_ID, configured_hub, drain, errors, join, spec_for

SILENT_PEER = "ipv4:10.1.2.3:5555"


class Responder:
    """Answers every Task queued on the given links (an honest child), until stopped."""

    def __init__(self, hub: ParentHub, *links: ChildLink) -> None:
        self.hub, self.links = hub, list(links)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for link in list(self.links):
                for f in drain(link)[0]:
                    if f.WhichOneof("body") == "task":
                        self.hub.on_frame(link, result_frame(f.call_id, {"n": 10}, has_bundle=False))
            self._stop.wait(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class LostChildren(HubListener):
    """Records the hub's ``child_lost`` news."""

    def __init__(self) -> None:
        self.lost: list[tuple[str, str]] = []

    def child_lost(self, node: str, why: str) -> None:
        self.lost.append((node, why))


@contextmanager
def federation(spec: RunSpec, listener: HubListener = QUIET) -> Iterator[tuple[ParentHub, NetComm, ChildLink,
                                                                                Responder, threading.Event]]:
    """A PS hub with client-0 (silent, its stream's cancel recorded) and client-1 (answers every task)."""
    with configured_hub(spec, listener=listener) as (hub, topo):
        silent, honest = join(hub, "client-0", peer=SILENT_PEER), join(hub, "client-1", peer="ipv4:127.0.0.1:2")
        cancelled = threading.Event()
        silent.cancel = cancelled.set
        comm = netcomm(hub, topo, spec)
        responder = Responder(hub, honest)
        try:
            yield hub, comm, silent, responder, cancelled
        finally:
            responder.stop()


def netcomm(hub: ParentHub, topo: Topology, spec: RunSpec) -> NetComm:
    sizes = hub.start()
    comm = NetComm(topo.server, topo, hub.missing, hub, spec)
    comm.bind(SimpleNamespace(sizes=sizes, round=0, device=torch.device("cpu"), spec=spec))
    return comm


def scatter(comm: NetComm, round_idx: int, **kw) -> list[str]:
    comm.ctx.round = round_idx
    return list(comm.scatter(["client-0", "client-1"], "fedavg.train", **kw))


def missing_of(hub: ParentHub, node: str) -> list[tuple[int, str]]:
    return [(e["round"], e["reason"]) for e in hub.missing.entries if e["node"] == node]


def tasks(frames: list[pb.Frame]) -> list[pb.Frame]:
    return [f for f in frames if f.WhichOneof("body") == "task"]


def test_a_silent_child_is_dropped_after_n_missed_rounds_and_the_run_goes_on(caplog) -> None:
    caplog.set_level(logging.INFO, "fedhop.session")
    spec = spec_for(clients=2, round_deadline_s=0.2, drop_after_missed=2)
    listener = LostChildren()
    with federation(spec, listener) as (hub, comm, silent, _, cancelled):
        lost = listener.lost
        assert scatter(comm, 0) == ["client-1"]
        assert silent.alive and "dropped" not in caplog.text
        queued = silent._q.qsize()
        assert queued >= 1  # the task of round 1, never taken by a peer that reads nothing

        assert scatter(comm, 1) == ["client-1"]
        assert not silent.alive
        why = "no reply in 2 consecutive rounds (transport.drop_after_missed = 2)"
        assert (f"ps: dropped client-0 ({SILENT_PEER}): {why}; the last: no reply within the deadline of 0.2s; its "
                f"session is closed, it may re-join") in caplog.text
        assert cancelled.wait(5.0), "the dropped session's stream was not cancelled"
        frames, closed = drain(silent)
        assert tasks(frames) == [] and closed  # the tasks queued for it were discarded, then the stream ended
        assert errors(frames) == [f"ps closed this session: {why}"]
        assert lost == [("client-0", f"dropped: {why}")]

        assert scatter(comm, 2) == ["client-1"]  # the run goes on with the honest child
        hub.lost(silent, "stream broken (CANCELLED)")  # what the servicer's reader says once the stream ends
    reasons = missing_of(hub, "client-0")
    assert [r for r, _ in reasons] == [1, 2, 3]
    assert all("no reply within the deadline of 0.2s" in why for _, why in reasons[:2])
    assert reasons[2][1] == f"client-0 is not connected (dropped: {why})"
    assert missing_of(hub, "client-1") == []
    assert lost == [("client-0", f"dropped: {why}")]  # the stream's end is not a second loss
    assert "lost client-0" not in caplog.text


def test_a_dropped_child_rejoins_and_takes_part_again(caplog) -> None:
    caplog.set_level(logging.INFO, "fedhop.session")
    spec = spec_for(clients=2, round_deadline_s=0.2, drop_after_missed=1)
    with federation(spec) as (hub, comm, silent, responder, _):
        assert scatter(comm, 0) == ["client-1"]
        assert not silent.alive and "dropped client-0" in caplog.text
        old_call = next(c for c in hub.calls.expired.values() if c.node == "client-0" and c.round == 0)
        assert scatter(comm, 1) == ["client-1"]

        back = hub.open("ipv4:10.1.2.3:6666")  # the stopped process resumed: its stream ended, it re-joins
        assert hub.on_frame(back, hello_frame("client-0", "client", "", {}, RUN_ID))
        ready = pb.Frame()
        ready.ready.data_sizes["client-0"] = 10
        assert hub.on_frame(back, ready)
        assert "client-0 re-joined from ipv4:10.1.2.3:6666" in caplog.text
        # the task of round 1 it had received before it stopped: its late reply is counted and dropped
        assert hub.on_frame(back, result_frame(old_call.call_id, {"n": 10}, has_bundle=False))
        assert "late reply from client-0 to fedavg.train (round 1) dropped" in caplog.text
        assert [f.WhichOneof("body") for f in drain(back)[0]] == ["welcome", "ready"]  # no complaint about it

        responder.links.append(back)
        assert scatter(comm, 2) == ["client-0", "client-1"]
        assert back.alive and back.missed == 0
    assert [r for r, _ in missing_of(hub, "client-0")] == [1, 2]
    replies = {(r["src"], r["round"]) for r in hub.meter.rows() if r["phase"] == "reply"}
    assert ("client-0", 0) in replies and ("client-0", 2) in replies


def test_any_whole_reply_resets_the_count_and_half_a_reply_does_not() -> None:
    spec = spec_for(clients=2, round_deadline_s=0.2, drop_after_missed=2)
    with federation(spec) as (hub, comm, silent, _, _):
        def last_call_id() -> int:
            return tasks(drain(silent)[0])[-1].call_id

        scatter(comm, 0)  # missed 1
        hub.on_frame(silent, result_frame(last_call_id(), {"n": 10}, has_bundle=False))  # late, but whole
        assert silent.missed == 0
        scatter(comm, 1)  # missed 1
        hub.on_frame(silent, error_result_frame(last_call_id(), pb.ERROR_CODE_INTERNAL, "failed"))  # an answer
        assert silent.missed == 0
        scatter(comm, 2)  # missed 1
        cid = last_call_id()
        hub.on_frame(silent, result_frame(cid, {"n": 10}, has_bundle=True))  # a bundle that never comes
        hub.on_frame(silent, pb.Frame(call_id=cid, header=pb.BundleHeader(
            chunk_bytes=4096, checksum_algorithm="none", total_bytes=4096,
            tensors=[pb.TensorSpec(name="w", dtype="uint8", shape=[4096], nbytes=4096)])))
        assert silent.alive and silent.asm.open_bundles == 1
        scatter(comm, 3)  # missed 2: dropped
        assert not silent.alive and silent.dropped
        assert silent.asm.open_bundles == 0  # the half-sent bundle it held is freed


def test_a_round_counts_once_and_an_optional_target_that_stays_silent_never_counts() -> None:
    spec = spec_for(clients=2, round_deadline_s=0.1, drop_after_missed=2)
    with federation(spec) as (_, comm, silent, _, _):
        scatter(comm, 0)
        scatter(comm, 0)  # a second task in the same round: still one missed round
        assert silent.alive and silent.missed == 1
        for r in (1, 2, 3):  # FOCUS's calls: a client that is not available this round stays silent
            scatter(comm, r, optional=True)
        assert silent.alive and silent.missed == 1


def test_zero_never_drops() -> None:
    spec = spec_for(clients=2, round_deadline_s=0.1, drop_after_missed=0)
    with federation(spec) as (hub, comm, silent, _, _):
        for r in range(3):
            scatter(comm, r)
        assert silent.alive
    assert len(missing_of(hub, "client-0")) == 3


def test_drop_after_missed_is_validated_and_explained() -> None:
    with pytest.raises(SpecError, match="drop_after_missed"):
        spec_for(drop_after_missed=-1)
    assert TransportSpec().drop_after_missed == 3
    assert "0 = never" in (TransportSpec.model_fields["drop_after_missed"].description or "")

