"""The fold's set-up shared by a scatter's replies (issue 19, per-client cost): ``WeightedMean.sink`` builds one
:class:`~fedhop.common.wire.fold.FoldPlan` per layout and aggregate, not one per reply, and a streamed reply's
finiteness is read from what its sink saw (``FoldedBundle.non_finite``), not tested again by ``check_bundle``.
No sockets: the decoder is fed the encoder's chunks directly."""

from __future__ import annotations

import pytest
import torch

from fedhop.common.algorithms.aggregate import WeightedMean
from fedhop.common.engine.api import Reply
from fedhop.common.engine.base import check_bundle
from fedhop.common.wire import fold as fold_mod
from fedhop.common.wire.bundle import clone, non_finite
from fedhop.common.wire.codec import BundleDecoder, encode_views
from fedhop.common.wire.fold import AxpySink, FoldedBundle, FoldPlan


def bundles(k: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(20, 70, generator=g), "b": torch.randn(70, generator=g),
             "d": torch.randn(9, generator=g, dtype=torch.float64)} for _ in range(k)]


def fold_streamed(mean: WeightedMean, i: int, bundle: dict[str, torch.Tensor], chunk: int) -> FoldedBundle:
    header, chunks = encode_views(bundle, chunk)
    sink = mean.sink(f"c{i}", {}, header)
    assert sink is not None
    dec = BundleDecoder(header, sink=sink)
    for c in chunks:
        dec.feed(c)
    got = dec.finish()
    assert isinstance(got, FoldedBundle)
    return got


def test_a_scatter_builds_two_plans_not_one_per_reply(monkeypatch) -> None:
    made: list[bool] = []
    real = FoldPlan.of.__func__  # type: ignore[attr-defined]

    def counting(cls, layout, acc=None):
        made.append(acc is not None)
        return real(cls, layout, acc)

    monkeypatch.setattr(FoldPlan, "of", classmethod(counting))
    bs = bundles(6)
    mean = WeightedMean(lambda node, r: 1.0, 6)
    plans = []
    for i, b in enumerate(bs):
        got = fold_streamed(mean, i, b, 1000)
        plans.append(got.sink.plan)
        mean(f"c{i}", Reply(got, {}))
    assert made == [False, True]  # the first reply's (a fresh buffer), then one for the aggregate
    assert all(p is plans[1] for p in plans[1:]) and plans[0] is not plans[1]
    plain = WeightedMean(lambda node, r: 1.0, 6)
    for i, b in enumerate(bs):
        plain(f"c{i}", Reply(clone(b), {}))
    want, got_mean = plain.result(), mean.result()
    assert all(torch.equal(want[k], got_mean[k]) for k in want)


def test_another_aggregate_or_layout_gets_a_plan_of_its_own() -> None:
    bs = bundles(3)
    mean = WeightedMean(lambda node, r: 1.0, 3)
    mean("c0", Reply(fold_streamed(mean, 0, bs[0], 64), {}))
    p1 = fold_streamed(mean, 1, bs[1], 64)
    assert p1.sink.plan.acc is not None and p1.sink.plan.acc[0] is mean._acc["w"]  # noqa: SLF001
    p1.sink.abort()
    mean._acc["w"] = mean._acc["w"].clone()  # noqa: SLF001  (another tensor in the aggregate: its views differ)
    p2 = fold_streamed(mean, 1, bs[1], 64)
    assert p2.sink.plan is not p1.sink.plan and p2.sink.plan.acc[0] is mean._acc["w"]  # noqa: SLF001
    p2.sink.abort()
    other = {"w": torch.randn(20, 70), "b": torch.randn(71), "d": torch.randn(9, dtype=torch.float64)}
    header, _ = encode_views(other, 64)
    assert mean.sink("c2", {}, header) is None  # not the aggregate's layout: decoded whole, as before


def test_a_plan_for_no_aggregate_is_refused_for_a_sink_into_one() -> None:
    bs = bundles(1)
    header, _ = encode_views(bs[0], 64)
    plan = FoldPlan.of(fold_mod.bundle_layout(header))
    with pytest.raises(ValueError, match="fold plan made for no aggregate"):
        AxpySink(header, 1.0, clone(bs[0]), fold_mod.UndoLog(), plan)


@pytest.mark.parametrize("chunk", [1, 8, 300, 1 << 20])
@pytest.mark.parametrize("where", ["first", "last", "both"])
@pytest.mark.parametrize("first_reply", [True, False])
def test_the_sink_names_exactly_the_non_finite_tensors_the_plain_check_names(chunk, where, first_reply) -> None:
    bs = bundles(2, seed=1)
    bad = bs[1]
    if where in ("first", "both"):
        bad["w"][0, 0] = float("nan")
    if where in ("last", "both"):
        bad["d"][-1] = float("-inf")  # the last element of the last tensor: the stream's final piece
    mean = WeightedMean(lambda node, r: 1.0, 2)
    if not first_reply:
        mean("c0", Reply(fold_streamed(mean, 0, bs[0], chunk), {}))
    got = fold_streamed(mean, 1, bad, chunk)
    assert list(got.non_finite) == non_finite(bad) == non_finite(dict(got))  # the sink's list, the stand-ins'
    assert check_bundle(got, bad) == check_bundle(bad, bad) is not None
    clean = fold_streamed(WeightedMean(lambda node, r: 1.0, 1), 0, bs[0], chunk)
    assert clean.non_finite == () and check_bundle(clean, bs[0]) is None


def test_check_bundle_trusts_the_sinks_list_not_the_stand_ins() -> None:
    """The proof that the stand-ins are not tested again: a FoldedBundle whose list is empty passes even with a
    NaN stand-in (and the other way round), so the list is what decides."""
    bs = bundles(1)
    got = fold_streamed(WeightedMean(lambda node, r: 1.0, 1), 0, bs[0], 64)
    nan_stand_ins = {k: torch.full((), float("nan"), dtype=v.dtype).expand(v.shape) for k, v in got.items()}
    assert check_bundle(FoldedBundle(nan_stand_ins, got.sink), bs[0]) is None
    assert check_bundle(FoldedBundle(dict(got), got.sink, ("b",)), bs[0]) == "non-finite values (NaN/Inf) in ['b']"
