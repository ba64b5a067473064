"""A scatter's model is encoded once, not once per call (issue 19: ``message_frames`` per call was a fifth of the
PS's loop at 10,000 clients); the bytes every child gets and every meter row stay what they were."""

from __future__ import annotations

import torch

from fedhop.common.engine.api import meter_kind
from fedhop.common.wire.codec import decode
from fedhop.common.wire.framing import ChunkFrame, parse_frame, serialize_frame, unbatched
from fedhop.common.wire.messages import message_bytes, message_frames, on_host, task_frame
from fedhop.transport.session import ChildLink, ParentHub
from tests.unit.hostile import configured_hub, drain, join, spec_for

TASK = "fedavg.train"


def _sent(link: ChildLink) -> list[bytes]:
    """The frames queued on ``link``, serialized as the servicer sends them (each message metered once taken)."""
    out: list[bytes] = []
    while (item := link.poll()) is not None:
        out += [serialize_frame(f) for f in link.sent_frames(item)]
    return out


def _decoded(frames: list[bytes]) -> dict[str, torch.Tensor]:
    # the Task frame, then the header and the chunks (a small message's in one Batch)
    parsed = [g for f in frames for g in unbatched(parse_frame(f))][1:]
    header = parsed[0].header
    chunks = [c if isinstance(c, ChunkFrame) else c.chunk for c in parsed[1:]]
    return decode(header, iter(chunks))


def _call(hub: ParentHub, node: str, bundle: dict[str, torch.Tensor]) -> int:
    call = hub.call(node, TASK, bundle, {"lr": 0.1}, 0, 30.0)
    assert not hasattr(call, "reason"), call
    return call.call_id  # type: ignore[union-attr]


def test_the_calls_of_one_scatter_encode_its_bundle_once_and_send_the_same_bytes() -> None:
    model = {"w": torch.arange(3000, dtype=torch.float32).reshape(30, 100), "b": torch.ones(10, dtype=torch.float64)}
    spec = spec_for(clients=4, chunk_bytes=4096)
    with configured_hub(spec) as (hub, _):
        links = {f"client-{k}": join(hub, f"client-{k}", peer=f"ipv4:127.0.0.1:{40000 + k}") for k in range(4)}
        hub.start()
        for link in links.values():
            drain(link)
        snapshot = on_host(model)  # a scatter's calls share one snapshot (NetComm._exchange*)
        ids = {node: _call(hub, node, snapshot) for node in links}
        assert hub.calls.encodings == 1
        chunk = spec.transport.chunk_bytes
        for node, link in links.items():
            head = task_frame(ids[node], TASK, {"lr": 0.1}, deadline_s=30.0, has_bundle=True, round_idx=0)
            fresh = [serialize_frame(f) for f in message_frames(head, model, chunk)]  # encoded for this call alone
            assert _sent(link) == fresh
        want = message_bytes(TASK, "request", model, {"lr": 0.1}, chunk)  # what the in-process engine counts
        rows = [r for r in hub.meter.rows() if r["kind"] == meter_kind(TASK, "request")]
        assert sorted(r["dst"] for r in rows) == sorted(links)
        assert {(r["messages"], r["message_bytes"], r["payload_bytes"]) for r in rows} == \
               {(1, want, 3000 * 4 + 10 * 8)}
        hub.calls.forget_encoded()  # the scatter's calls are queued: the memo lets the model go
        _call(hub, "client-0", snapshot)
        assert hub.calls.encodings == 2


def test_a_tensor_changed_in_place_between_two_calls_is_encoded_again() -> None:
    with configured_hub(spec_for(clients=3)) as (hub, _):
        a, b = join(hub, "client-0"), join(hub, "client-1", peer="ipv4:127.0.0.1:40001")
        c = join(hub, "client-2", peer="ipv4:127.0.0.1:40002")
        hub.start()
        for link in (a, b, c):
            drain(link)
        bundle = {"w": torch.zeros(50), "v": torch.arange(7)}
        _call(hub, "client-0", bundle)
        to_a = _sent(a)  # sent before the change (a bundle is not changed in place while its message is queued)
        bundle["w"].add_(1.0)  # same mapping, same tensor object, same storage: only its version moved
        _call(hub, "client-1", bundle)
        assert hub.calls.encodings == 2
        bundle["v"] = torch.arange(7)  # an equal tensor, but another one: encoded again
        _call(hub, "client-2", bundle)
        assert hub.calls.encodings == 3
        assert torch.equal(_decoded(to_a)["w"], torch.zeros(50))
        assert torch.equal(_decoded(_sent(b))["w"], torch.ones(50))  # not the bytes or checksum of the first
        assert torch.equal(_decoded(_sent(c))["v"], torch.arange(7))


def test_a_task_frame_copied_from_the_last_call_is_the_one_built_for_its_own_args() -> None:
    """The Task frame is copied from the previous call's while task, args, deadline and round are the same
    (``CallTable._task_frame``); args equal in Python but not on the wire (1, 1.0, True) get their own."""
    spec = spec_for(clients=6)
    cases = [({"x": 1}, 0, 30.0), ({"x": 1}, 0, 30.0), ({"x": True}, 0, 30.0), ({"x": 1.0}, 0, 30.0),
             ({"x": 1.0}, 1, 30.0), ({"x": 1.0}, 1, 20.0)]
    with configured_hub(spec) as (hub, _):
        links = [join(hub, f"client-{k}", peer=f"ipv4:127.0.0.1:{40000 + k}") for k in range(len(cases))]
        hub.start()
        for link in links:
            drain(link)
        for k, (args, rnd, deadline) in enumerate(cases):
            call = hub.call(f"client-{k}", TASK, {}, args, rnd, deadline)
            assert not hasattr(call, "reason"), call
            want = task_frame(call.call_id, TASK, args, deadline_s=deadline, has_bundle=False, round_idx=rnd)
            assert _sent(links[k]) == [serialize_frame(want)], (k, args)
