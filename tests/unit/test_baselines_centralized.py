"""Centralized SGD (FedCluster's baseline, docs/specs/fedcluster.md 2.4 / 4.6): one trainer holding the union of the
device data; bit for bit a plain torch SGD loop written here, on a pool checked against the partition."""

from __future__ import annotations

import pytest
import torch

from fedhop.common.algorithms.centralized import distinct_indices
from fedhop.common.data.build import build_federated_data
from fedhop.common.data_spec import DataSpec
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.engine.workspace import derive_seed
from fedhop.common.spec import RunSpec, SpecError
from tests.specs import run_spec

DATA = {"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.5, "union_of": 5}


def spec(rounds: int = 3, iters: int = 7, batch: int = 16, lr: float = 0.05, seed: int = 1, **over) -> RunSpec:
    return run_spec("centralized-sgd", {"lr": lr, "iters_per_round": iters, "batch_size": batch}, clients=1,
                    data=DATA, model={"name": "mlp", "hidden": [8]}, rounds=rounds, seed=seed, **over)


def distinct_batch(n: int, b: int, gen: torch.Generator) -> list[int]:
    """The documented draw: b uniform indices, then redraw every repeat of an earlier value, until distinct."""
    idx = torch.randint(n, (b,), generator=gen).tolist()
    while True:
        seen: set[int] = set()
        dup = []
        for j, v in enumerate(idx):
            if v in seen:
                dup.append(j)
            seen.add(v)
        if not dup:
            return idx
        for j, v in zip(dup, torch.randint(n, (len(dup),), generator=gen).tolist(), strict=True):
            idx[j] = v


def test_distinct_indices_are_distinct_and_uniform():
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(12)
    for _ in range(3000):
        idx = distinct_indices(12, 5, gen)
        assert len(set(idx.tolist())) == 5
        counts[idx] += 1
    # each index appears with probability 5/12 per draw: 1250 expected, std ~27
    assert (counts - 1250).abs().max() < 150


def test_pool_is_the_union_of_the_device_partition():
    eng = InProcessEngine(spec())
    parts = build_federated_data(DataSpec.model_validate({**DATA, "union_of": None}), 5, 1)
    pool = eng.ws.client_data("client-0")
    assert torch.equal(pool.x, torch.cat([c.x for c in parts.clients]))
    assert torch.equal(pool.y, torch.cat([c.y for c in parts.clients]))
    assert torch.equal(eng.ws.test.x, parts.test.x)


def test_bit_identical_to_a_plain_torch_sgd_loop():
    rounds, iters, batch, lr, seed = 3, 7, 16, 0.05, 1
    eng = InProcessEngine(spec(rounds, iters, batch, lr, seed))
    pool = eng.ws.client_data("client-0")
    x, y = pool.x, pool.y
    net = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10))
    init = list(eng.ws.initial_params().values())
    with torch.no_grad():
        for p, v in zip(net.parameters(), init, strict=True):
            p.copy_(v)
    for t in range(rounds):
        # ctx.rng("centralized.sgd", round) of the trainer: the engine's per-node stream (seed, node, keys)
        gen = torch.Generator()
        gen.manual_seed(derive_seed(seed, "client-0", "centralized.sgd", t))
        for _ in range(iters):
            idx = distinct_batch(len(y), batch, gen)
            net.zero_grad()
            torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            with torch.no_grad():
                for p in net.parameters():
                    p -= lr * p.grad
    final = eng.run().final
    for p, got in zip(net.parameters(), final.values(), strict=True):
        assert torch.equal(p.detach(), got)


def test_payload_is_the_model_down_and_up_once_a_round():
    res = InProcessEngine(spec(rounds=2)).run()
    d = 64 * 8 + 8 + 8 * 10 + 10
    rows = [r for r in res.links if r["kind"] == "centralized.train"]
    assert len(rows) == 2 * 2 and all(r["payload_bytes"] == 4 * d for r in rows)


def test_more_than_one_client_is_refused_before_the_run():
    with pytest.raises(SpecError, match="topology.clients"):
        RunSpec.parse({"algorithm": {"name": "centralized-sgd"}, "topology": {"clients": 3}, "rounds": 1})


def test_union_of_needs_one_client():
    with pytest.raises(ValueError, match="union_of"):
        build_federated_data(DataSpec.model_validate(DATA), 2, 0)
