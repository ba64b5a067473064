"""The round's starting model in a file-backed mapping (common/engine/spill.py, issue 19): the same tensor objects
keep the same bits at the same alignment, the anonymous copy is freed, a drop takes the mapping's pages out of the
process's resident memory (read from /proc/self/smaps) and a later read gives the same bytes back; a round redone
after the drop (the in-process engine's fault plan, the loop spilling as the networked PS does) trains the same
bits as a run that never spilled."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhop.common.engine import results
from fedhop.common.engine import run as run_module
from fedhop.common.engine import spill as spill_module
from fedhop.common.engine.api import get_algorithm
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.engine.spill import PAGE, Spill, Spiller, spill_state, spiller, state_tensors
from fedhop.common.wire import codec
from tests.smaps import mapped_rss
from tests.specs import DIGITS, FailsFirstAttempt, run_spec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not spill_module.CAN_DROP,
                                reason="reads /proc/self/smaps; needs madvise(MADV_DONTNEED)")


@dataclass
class State:  # what FedAvg's ServerState holds: a model dict beside other fields
    model: dict[str, torch.Tensor]
    step: int = 0


def aggregate_like(n: int, seed: int = 0) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """A model laid out as the streamed fold's aggregate: views of one numpy buffer, at an offset off the page."""
    buf = np.empty(4 * n + 64 + 8, dtype=np.uint8)
    base = torch.from_numpy(buf)[72:]
    flat = base.view(torch.float32)
    flat.copy_(torch.randn(n, generator=torch.Generator().manual_seed(seed)))
    return {"w": flat[:n - 10].view(-1, 10), "b": flat[n - 10:]}, buf


def resident(spill: Spill) -> int:
    """The mapping's resident bytes (its Rss line in /proc/self/smaps)."""
    return mapped_rss(spill.address)




def test_spilled_state_keeps_its_objects_bits_and_alignment() -> None:
    model, buf = aggregate_like(300_000)
    before = {k: v.clone() for k, v in model.items()}
    objects = {k: id(v) for k, v in model.items()}
    aligned = {k: v.data_ptr() % PAGE for k, v in model.items()}
    old = model["w"].untyped_storage().data_ptr()
    state = State(model)
    spill = spill_state(state, 1)
    assert spill is not None and spill.nbytes == 4 * 300_000 and spill.tensors == 3  # the two views and their base
    assert {k: id(v) for k, v in model.items()} == objects
    assert {k: v.data_ptr() % PAGE for k, v in model.items()} == aligned
    assert all(torch.equal(model[k], before[k]) for k in model)
    storage = model["w"].untyped_storage()
    assert storage.data_ptr() != old and storage.data_ptr() == model["b"].untyped_storage().data_ptr()
    assert storage.data_ptr() == spill.address  # both views point into the mapping, as they shared one buffer
    assert model["w"]._base is not None and model["w"]._base.untyped_storage().data_ptr() == spill.address
    model["w"]._base[-1] = 7.0  # still the base's views: a write into the base is the view's
    assert model["b"][-1].item() == 7.0
    del buf


def test_a_drop_takes_the_pages_out_and_a_read_brings_the_same_bytes() -> None:
    model, buf = aggregate_like(2_000_000)  # 7.6 MiB
    before = {k: v.clone() for k, v in model.items()}
    del buf
    spill = spill_state(State(model), 1 << 20)
    assert spill is not None
    assert resident(spill) == 0  # written by pwrite: in the page cache, not yet in this process's pages
    assert all(torch.equal(model[k], before[k]) for k in model)  # read: faulted in
    assert resident(spill) >= spill.nbytes - PAGE
    spill.drop()
    assert resident(spill) == 0
    assert all(torch.equal(model[k], before[k]) for k in model)  # faulted back from the page cache
    spill.drop()
    assert resident(spill) == 0


def test_below_the_threshold_or_zero_nothing_moves() -> None:
    model, buf = aggregate_like(1000)
    ptr = model["w"].data_ptr()
    assert spill_state(State(model), 4001 * 4) is None
    assert spill_state(State(model), 0) is None
    assert model["w"].data_ptr() == ptr
    del buf


def test_a_state_kept_from_the_last_round_stays_in_its_mapping() -> None:
    """A round that ends without a usable reply keeps its starting model: the next round's spill leaves those
    tensors where they are (a request of the round before may still be reading them) and drops that mapping."""
    model, buf = aggregate_like(300_000)
    del buf
    spiller = Spiller(1)
    first = spiller.spill(State(model))
    assert first is not None
    ptr = model["w"].data_ptr()
    assert spiller.spill(State(model)) is first and model["w"].data_ptr() == ptr
    fresh, buf = aggregate_like(300_000, seed=1)
    second = spiller.spill(State({**fresh, "old": model["w"]}))  # a new tensor beside one of the kept model
    assert second is not None and second is not first and model["w"].data_ptr() == ptr
    assert fresh["w"].untyped_storage().data_ptr() == second.address
    second.drop()
    assert first.drops == 1 and resident(first) == 0
    del model, fresh, buf
    assert not first.alive  # its tensors gone: the mapping went with them


def test_state_tensors_walks_the_containers_a_checkpoint_saves() -> None:
    a, b, c = torch.ones(2), torch.zeros(3), torch.full((1,), 2.0)
    value = State({"a": a, "again": a}, step=3), [b, (c,)], {"n": 1}
    found = state_tensors(value)
    assert len(found) == 3 and {id(t) for t in found} == {id(a), id(b), id(c)}  # ``a`` once


def test_a_round_redone_after_the_drop_trains_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 2 loses client-0 on its first attempt and is redone from its starting model, whose pages were dropped
    by then; the run spills every round (as the networked PS does) and must end bit for bit where a run that
    never spilled ends."""
    spec = run_spec("fedavg", {"local_steps": 2}, clients=4, edges=0, name="spill", rounds=3, seed=5, data=DIGITS,
                    model={"name": "mlp", "hidden": [8]},
                    transport={"min_participants": 4, "round_retries": 1})
    fault = FailsFirstAttempt()  # client-0 in round 2
    clean = InProcessEngine(spec, faults=FaultPlan(fault)).run()
    assert fault.calls == 2
    spills: list[Spill] = []

    def recorded(state: object, min_bytes: int, previous: Spill | None = None) -> Spill | None:
        s = spill_state(state, min_bytes, previous)
        if s is not None:
            spills.append(s)
        return s

    monkeypatch.setattr(spill_module, "spill_state", recorded)
    drive = run_module.drive
    monkeypatch.setattr(run_module, "drive", lambda *a, **kw: drive(*a, **{**kw, "spill_bytes": 1}))
    fault = FailsFirstAttempt()
    spilled = InProcessEngine(spec, faults=FaultPlan(fault)).run()
    assert fault.calls == 2  # the redo happened here too
    assert len(spills) == 3 and all(s.drops > 0 for s in spills)  # every round spilled, and dropped its pages
    assert spilled.final.keys() == clean.final.keys()
    assert all(torch.equal(spilled.final[k], clean.final[k]) for k in clean.final)
    assert [r.get("loss") for r in spilled.rounds] == [r.get("loss") for r in clean.rounds]


def test_the_final_model_leaves_memory_once_model_pt_is_written(tmp_path: Path) -> None:
    """The run's end: model.pt is written from the resident model, then its pages go (the files after it, plots
    with matplotlib, are not written beside it); the result keeps the same tensors and bits."""
    model, buf = aggregate_like(500_000)
    del buf
    want = {k: v.clone() for k, v in model.items()}
    ptr = model["w"].untyped_storage().data_ptr()
    results._save_model(model, tmp_path / "small.pt", min_bytes=4 * 500_000 + 1)  # below the threshold: kept
    assert model["w"].untyped_storage().data_ptr() == ptr
    results._save_model(model, tmp_path / "model.pt", min_bytes=1)
    moved = model["w"].untyped_storage().data_ptr()
    assert moved != ptr and moved == model["b"].untyped_storage().data_ptr()
    assert mapped_rss(moved) == 0
    saved = torch.load(tmp_path / "model.pt")
    assert all(torch.equal(saved[k], want[k]) and torch.equal(model[k], want[k]) for k in want)


def test_a_spill_that_cannot_be_written_leaves_the_state_as_it_was(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """No temporary file (a full or read-only $TMPDIR): the round goes on with its model in memory, and says so."""
    model, buf = aggregate_like(1000)
    ptr = model["w"].data_ptr()

    def full(*a: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill_module.tempfile, "mkstemp", full)
    with caplog.at_level("WARNING", logger="fedhop.engine"):
        assert spill_state(State(model), 1) is None
    assert model["w"].data_ptr() == ptr
    assert any("stays in memory" in r.message and "No space left" in r.message for r in caplog.records)
    del buf


@pytest.mark.skipif(codec._MADV_HUGEPAGE is None, reason="huge decode buffers are pooled only where THP can be advised")
def test_the_buffer_a_spill_frees_is_not_kept_by_the_decode_pool(monkeypatch) -> None:
    """A state decoded into a huge codec buffer (a fold's aggregate, a received model): once spilled, the buffer is
    freed, and the codec's pool of freed decode buffers (codec.POOL_KEEP) must not keep it resident: that is the
    model the spill gives back. A drop empties the pool too (a buffer freed late, e.g. by a snapshot let go)."""
    monkeypatch.setattr(codec, "POOL_KEEP", 2)
    codec.release_pool()
    n = codec._HUGE_BUFFER_BYTES // 4
    state = {"w": torch.from_numpy(codec.allocate(4 * n)).view(torch.float32)}
    state["w"].copy_(torch.arange(n, dtype=torch.float32))
    s = Spiller(1).spill(state)
    assert s is not None and codec._pool == []
    assert torch.equal(state["w"], torch.arange(n, dtype=torch.float32))
    late = codec.allocate(4 * n)
    del late  # freed after the spill: pooled ...
    assert len(codec._pool) == 1
    s.drop()  # ... until the drop
    assert codec._pool == []


def test_only_an_algorithm_that_replaces_its_tensors_spills() -> None:
    """``spill.spiller``, the rule of the PS's round loop and of an edge's scatters: FedAvg / HierFAVG
    (``round_replaces_tensors``) spill from the threshold on; an algorithm whose rounds write tensors in place
    (Fed-CHS) never; a threshold of 0 never."""
    for name, moves in (("fedavg", True), ("hierfavg", True), ("fedchs", False)):
        model, buf = aggregate_like(1000, seed=3)
        ptr = model["w"].data_ptr()
        s = spiller(get_algorithm(name), 1).spill({"model": model})
        assert (s is not None) is moves, name
        assert (model["w"].data_ptr() != ptr) is moves, name
        del buf
    model, buf = aggregate_like(1000, seed=3)
    assert spiller(get_algorithm("fedavg"), 0).spill({"model": model}) is None
