"""Explicit state, proven: every algorithm, stopped after a round (as if the process died) and resumed from its
checkpoint in a fresh engine, ends bit-identical to the uninterrupted run with the same per-link bytes. Any
state an algorithm kept outside its explicit state (a local variable, an RNG position, a participation
chain) would make the resumed run differ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedhop.common.algorithms  # noqa: F401  (registers every algorithm)
from fedhop.common.engine.api import ALGORITHMS
from fedhop.common.engine.checkpoint import CheckpointStore, read_checkpoint
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import RunSpec
from tests.specs import DIGITS, run_spec

FLAT = dict(clients=4, edges=0)
EDGES = dict(clients=6, edges=3, edge_graph="complete")
MARKOV = {"kind": "markov", "p_stay": 0.5}
CASES = {
    "fedavg": (FLAT, {"local_steps": 2}),
    "fedavg-edges": (EDGES, {"local_steps": 2}),
    "fedavg-markov": (FLAT, {"local_steps": 2, "participation": MARKOV}),
    "hierfavg": (EDGES, {"local_steps": 2, "edge_rounds": 2}),
    "fedchs": (EDGES, {"K": 4}),
    # the model in a post between two edges at the crash: a queued post is its receiver's state, checkpointed
    "fedchs-exact": (EDGES, {"K": 4, "flow": "exact"}),
    "hier-local-qsgd": (EDGES, {"local_steps": 2, "edge_rounds": 2}),
    "wrwgd": (FLAT, {"K": 3}),
    "dpsgd": (FLAT, {"local_steps": 2}),  # every client's own model (its node state) over a ring of peers
    "fedcluster": (EDGES, {"local_steps": 2, "participation": 1.0}),
    "focus": (FLAT, {"lr": 0.05, "participation": {"kind": "bernoulli", "p": [0.9, 0.5, 0.5, 0.2]}}),
    "focus-matched-markov": (FLAT, {"lr": 0.05, "init": "matched", "participation": MARKOV}),
    "sg-focus": (FLAT, {"lr": 0.05}),
    # each client's own Markov availability chain, through edges
    "focus-client-decided-edges": (EDGES, {"lr": 0.05, "decided_by": "client", "participation": MARKOV}),
    "fedau": (FLAT, {"participation": {"kind": "bernoulli", "p": [0.9, 0.5, 0.5, 0.2]}}),
    "scaffold": (FLAT, {"participation": {"kind": "uniform", "m": 2}}),
    "mifa": (FLAT, {"participation": {"kind": "uniform", "m": 2}}),
    "fgdro-cvar": (FLAT, {"K": 2, "local_steps": 2}),
    "fgdro-kl": (FLAT, {"local_steps": 2, "u_init": "first_batch", "v_init": "mean_exp_u"}),
    "fgdro-kl-adam": (FLAT, {"local_steps": 2}),
    "local-adam": (FLAT, {"local_steps": 2}),
    "fedadam": (FLAT, {"local_steps": 2}),
    "drfa": (FLAT, {"local_steps": 2, "clients_per_round": 2}),
    "dr-dsgd": (FLAT, {"local_steps": 2}),
    "proxskip": (FLAT, {"local_steps": 2, "participation": {"kind": "uniform", "m": 2}}),
    "centralized-sgd": (dict(clients=1, edges=0), {"iters_per_round": 3, "batch_size": 8}),
    "fedavg-qsgd": (FLAT, {"local_steps": 2, "upload_levels": 7}),
    "drfa-prox": (FLAT, {"local_steps": 2, "clients_per_round": 2}),
    "drfa-prox-snapshot-entropic": (FLAT, {"local_steps": 2, "loss_at": "snapshot", "prox": "entropic"}),
    # asynchronous: the tasks in flight at the crash are lost (as over the network: a resumed PS has none out)
    "fedbuff": (FLAT, {"local_steps": 2, "concurrency": 3, "buffer": 2}),
    "fedasync": (FLAT, {"local_steps": 2, "concurrency": 3}),
}
IN_FLIGHT_LOST = {"fedbuff", "fedasync"}


def spec_for(case: str, rounds: int = 5) -> RunSpec:
    topo, opts = CASES[case]
    name = next(a for a in sorted(ALGORITHMS, key=len, reverse=True) if case.startswith(a))
    return run_spec(name, opts, **topo, name=case, rounds=rounds, seed=3, data=DIGITS,
                    model={"name": "mlp", "hidden": [8]})


class Crash(Exception):
    pass


def test_every_algorithm_has_a_case() -> None:
    covered = {next(a for a in sorted(ALGORITHMS, key=len, reverse=True) if c.startswith(a)) for c in CASES}
    assert covered == set(ALGORITHMS)


@pytest.mark.parametrize("case", list(CASES))
def test_resume_is_bit_identical(case: str, tmp_path: Path) -> None:
    spec = spec_for(case)
    whole = InProcessEngine(spec).run()

    def crash_after_round_2(t: int) -> None:
        if t == 2:
            raise Crash

    with pytest.raises(Crash):
        InProcessEngine(spec).run(checkpoints=tmp_path, after_commit=crash_after_round_2)
    resumed = InProcessEngine(spec).run(checkpoints=tmp_path, resume=True)
    if case in IN_FLIGHT_LOST:
        # the rounds before the crash are the uninterrupted run's; after it, the PS hands out tasks afresh (nothing
        # in flight survives a crash), so the run differs from the uninterrupted one but not from itself
        untimed = [{k: v for k, v in r.items() if k not in ("elapsed_s", "round_s")} for r in resumed.rounds]
        assert untimed[:3] == [{k: v for k, v in r.items() if k not in ("elapsed_s", "round_s")}
                               for r in whole.rounds[:3]]
        assert len(resumed.rounds) == spec.rounds and resumed.rounds[3]["staleness_max"] == 0
        again = InProcessEngine(spec).run(checkpoints=tmp_path, resume=True)
        assert all(torch.equal(again.final[k], v) for k, v in resumed.final.items())
        return

    assert list(resumed.final) == list(whole.final)
    for k, v in whole.final.items():
        assert torch.equal(resumed.final[k], v), f"{case}: {k} differs after resume"
    assert resumed.links == whole.links
    untimed = [{k: v for k, v in r.items() if k not in ("elapsed_s", "round_s")} for r in whole.rounds]
    assert [{k: v for k, v in r.items() if k not in ("elapsed_s", "round_s")} for r in resumed.rounds] == untimed
    assert resumed.missing == whole.missing


def test_checkpoints_keep_the_last_two_and_are_not_pickle(tmp_path: Path) -> None:
    spec = spec_for("focus", rounds=5)
    InProcessEngine(spec).run(checkpoints=tmp_path)
    store = CheckpointStore(tmp_path)
    assert store.tags() == [3, 4]
    raw = (tmp_path / "ckpt_00000004.fhck").read_bytes()
    assert raw.startswith(b"FEDHOPCKPT1\n") and b"\x80\x04\x95" not in raw[:64]  # no pickle protocol header
    meta, state = read_checkpoint(tmp_path / "ckpt_00000004.fhck")
    assert meta["next_round"] == 5 and meta["tag"] == 4
    assert set(state.nodes) == {f"client-{i}" for i in range(4)}


def test_truncated_checkpoint_falls_back_to_the_previous(tmp_path: Path, caplog) -> None:
    spec = spec_for("scaffold", rounds=5)
    whole = InProcessEngine(spec).run()

    def crash(t: int) -> None:
        if t == 3:
            raise Crash

    with pytest.raises(Crash):
        InProcessEngine(spec).run(checkpoints=tmp_path, after_commit=crash)
    newest = tmp_path / "ckpt_00000003.fhck"
    newest.write_bytes(newest.read_bytes()[:-100])  # a crash while writing (or a bad disk) cut it short
    resumed = InProcessEngine(spec).run(checkpoints=tmp_path, resume=True)
    assert any("ckpt_00000003.fhck" in r.message and "truncated" in r.message for r in caplog.records)
    for k, v in whole.final.items():
        assert torch.equal(resumed.final[k], v)


def test_corrupted_checkpoint_is_named(tmp_path: Path) -> None:
    spec = spec_for("fedavg", rounds=2)
    InProcessEngine(spec).run(checkpoints=tmp_path)
    f = tmp_path / "ckpt_00000001.fhck"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF  # flip a tensor byte: the payload checksum must catch it
    f.write_bytes(bytes(data))
    from fedhop.common.engine.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="ckpt_00000001.fhck"):
        read_checkpoint(f)
