"""Issue 20, "a 512 MiB reply is buffered before its shape is checked": a bundle header is checked against what
the caller expects (names in order, dtypes, shapes) as soon as it arrives, before anything is reserved or
allocated for the bundle; the check words its reasons as the engines' whole-bundle check does."""

from __future__ import annotations

import pytest
import torch

from fedhop.common.engine.base import check_bundle
from fedhop.common.wire.budget import InflightBudget
from fedhop.common.wire.framing import parse_frame, serialize_frame, unbatched
from fedhop.common.wire.messages import (
    CALL_ID_BASE,
    MessageAssembler,
    bundle_shapes,
    header_mismatch,
    message_frames,
    result_frame,
)

EXPECT = {"w": torch.zeros(4, 3), "b": torch.zeros(3)}


def frames_of(bundle: dict[str, torch.Tensor], cid: int = CALL_ID_BASE) -> list:
    """The frames of a Result message as the receiver handles them (a small one's Batch flattened)."""
    return [g for f in message_frames(result_frame(cid, {}, has_bundle=True), bundle, 1024)
            for g in unbatched(parse_frame(serialize_frame(f)))]


@pytest.mark.parametrize("bundle", [
    {"w": torch.zeros(4, 3)},
    {"b": torch.zeros(3), "w": torch.zeros(4, 3)},
    {"w": torch.zeros(3, 4), "b": torch.zeros(3)},
    {"w": torch.zeros(4, 3, dtype=torch.float64), "b": torch.zeros(3)},
    {"w": torch.zeros(4, 3), "b": torch.zeros(3)},
])
def test_the_header_check_says_what_the_whole_bundle_check_says(bundle) -> None:
    header = frames_of(bundle)[1].header
    assert header_mismatch(header, bundle_shapes(EXPECT)) == check_bundle(bundle, EXPECT)


def test_a_header_of_the_wrong_shape_fails_its_message_before_anything_is_reserved() -> None:
    budget = InflightBudget(4, 1 << 30)
    asm = MessageAssembler(1 << 30, budget=budget, expect=lambda cid: bundle_shapes(EXPECT))
    frames = frames_of({"w": torch.zeros(512, 1024), "b": torch.zeros(3)})  # 2 MiB announced
    assert asm.feed(frames[0]) is None
    msg = asm.feed(frames[1])  # the header: refused before any chunk
    assert msg is not None and msg.bundle == {}
    assert msg.error == ("bundle refused at its header, before its bytes were read: tensor 'w' has shape "
                         "(512, 1024), expected (4, 3)")
    assert asm.open_bundles == 0 and budget.reserve(1 << 30) is None  # nothing was held for it
    budget.release(1 << 30)
    assert all(asm.feed(parse_frame(f) if isinstance(f, bytes) else f) is None for f in frames[2:])  # dropped
    good = frames_of({"w": torch.ones(4, 3), "b": torch.ones(3)}, CALL_ID_BASE + 1)
    out = [asm.feed(parse_frame(f) if isinstance(f, bytes) else f) for f in good]
    assert out[-1] is not None and out[-1].error is None and torch.equal(out[-1].bundle["w"], torch.ones(4, 3))
