"""Asynchronous calls (``Comm.submit`` / ``collect``) in the in-process engine, and FedBuff / FedAsync on them:
the virtual clock's order (derived by hand below), replay, the API's refusals, and the two algorithms against
independent references (full batches, where asynchrony reduces to a known synchronous method)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhop.common.engine.api import NodeContext, Reply, task
from fedhop.common.engine.inprocess import InProcessEngine, ReplayError, parse_arrivals
from tests.specs import run_spec

DATA = {"dataset": "synthetic", "partition": "dirichlet", "train_limit": 240, "test_limit": 100}


def spec(algo: str, options: dict[str, Any], *, clients: int, rounds: int, **kw: Any):  # noqa: ANN201
    return run_spec(algo, options, clients=clients, edges=0, data=DATA, model={"name": "logreg"}, rounds=rounds,
                    seed=3, **kw)


def test_the_virtual_clock_orders_replies_by_compute_speed() -> None:
    """Two clients, both busy, one update per round; client-0 at half speed (a task takes 2 time units, client-1's
    1). t=0: both start. Round 1 takes client-1 (due 1, from round 1); it restarts, due 2. Round 2: client-0 and
    client-1 are both due at 2, client-0 was submitted first: client-0 (from round 1, staleness 1). Round 3:
    client-1 (from round 2, staleness 1); client-0 restarted at 2 is due at 4."""
    s = spec("fedbuff", {"concurrency": 2, "buffer": 1, "local_steps": 1}, clients=2, rounds=3,
             network={"nodes": {"client-0": {"compute": 0.5}}})
    res = InProcessEngine(s).run()
    assert [r["arrivals"] for r in res.rounds] == ["client-1:1", "client-0:1", "client-1:2"]
    assert [r["staleness_max"] for r in res.rounds] == [0, 1, 1]


def test_fedbuff_with_every_client_in_one_buffer_is_one_fedavg_step() -> None:
    """C = K = N, equal speeds, no staleness weighting, eta_g = 1, full batches: round 1 buffers every client's
    Delta_i = x0 - y_i from x0, so x1 = x0 - mean_i Delta_i = mean_i y_i: FedAvg with uniform weights."""
    n = 4
    opts = {"local_steps": 3, "lr": 0.1, "batch_size": 0}
    buff = InProcessEngine(spec("fedbuff", {**opts, "concurrency": n, "buffer": n, "staleness": "none"},
                                clients=n, rounds=1)).run()
    avg = InProcessEngine(spec("fedavg", {**opts, "weighting": "uniform"}, clients=n, rounds=1)).run()
    for k in avg.final:
        torch.testing.assert_close(buff.final[k], avg.final[k], rtol=1e-5, atol=1e-6)
    assert sorted(buff.rounds[0]["arrivals"].replace(":1", "").split(" | ")) == [f"client-{i}" for i in range(n)]


def test_fedasync_with_one_client_and_alpha_one_is_local_gd() -> None:
    """One client, alpha = 1: x^{t+1} = x_new, so T rounds are T x Q full-batch GD steps on the client's data,
    which FedAvg with one client and T rounds also computes."""
    opts = {"local_steps": 2, "lr": 0.1, "batch_size": 0}
    fa = InProcessEngine(spec("fedasync", {**opts, "concurrency": 1, "alpha": 1.0}, clients=1, rounds=3)).run()
    avg = InProcessEngine(spec("fedavg", opts, clients=1, rounds=3)).run()
    for k in avg.final:
        torch.testing.assert_close(fa.final[k], avg.final[k], rtol=1e-5, atol=1e-6)
    assert [r["staleness_max"] for r in fa.rounds] == [0, 0, 0]


def test_fedasync_discounts_stale_updates() -> None:
    s = spec("fedasync", {"concurrency": 3, "alpha": 0.5, "staleness_exponent": 1.0}, clients=3, rounds=4)
    res = InProcessEngine(s).run()
    for r in res.rounds:  # alpha_t = alpha / (staleness + 1)
        assert r["alpha_t"] == pytest.approx(0.5 / (r["staleness_max"] + 1))
    assert any(r["staleness_max"] > 0 for r in res.rounds)


def test_replay_follows_the_recorded_order_and_refuses_one_it_cannot_follow() -> None:
    s = spec("fedbuff", {"concurrency": 3, "buffer": 2, "local_steps": 2}, clients=4, rounds=3)
    first = InProcessEngine(s).run()
    again = InProcessEngine(s, replay=first.rounds).run()
    assert all(torch.equal(first.final[k], again.final[k]) for k in first.final)
    assert [r["arrivals"] for r in again.rounds] == [r["arrivals"] for r in first.rounds]
    # the same run with round 1's two updates taken the other way round: a different buffer order, another model
    swapped = [dict(r) for r in first.rounds]
    a, b = swapped[0]["arrivals"].split(" | ")
    swapped[0]["arrivals"] = f"{b} | {a}"
    other = InProcessEngine(s, replay=swapped).run()
    assert [r["arrivals"] for r in other.rounds][0] == swapped[0]["arrivals"]
    # a recorded reply from a client that has no task in flight cannot be followed
    idle = next(c for c in ("client-0", "client-1", "client-2", "client-3") if c not in first.rounds[0]["arrivals"]
                and c not in swapped[0]["arrivals"])
    bad = [dict(r) for r in first.rounds]
    bad[0]["arrivals"] = f"{idle}:1"
    with pytest.raises(ReplayError, match=idle):
        InProcessEngine(s, replay=bad).run()


def test_parse_arrivals() -> None:
    assert parse_arrivals("client-1:3 client-0:4:failed | client-2:4") == [
        [("client-1", True), ("client-0", False)], [("client-2", True)]]


# -- the API's refusals -------------------------------------------------------------------------------------------

@task("test_async.echo")
def _echo(ctx: NodeContext, bundle: dict, args: dict) -> Reply:
    return Reply(bundle, {"n": len(ctx.data)})


def _ps() -> NodeContext:
    engine = InProcessEngine(spec("fedavg", {}, clients=2, rounds=1))
    ps = engine.nodes["ps"]
    ps.reporter = lambda rnd, metrics: None
    return ps


def test_submit_only_to_a_child_and_one_task_at_a_time() -> None:
    ps = _ps()
    w = ps.initial_params()
    with pytest.raises(ValueError, match="only submit tasks to its children"):
        ps.comm.submit("ps", "test_async.echo", w)
    ps.comm.submit("client-0", "test_async.echo", w)
    assert ps.comm.in_flight() == ("client-0",)
    with pytest.raises(ValueError, match="still works on a task submitted in round 1"):
        ps.comm.submit("client-0", "test_async.echo", w)
    got = ps.comm.collect(5)  # fewer than asked: nothing else is in flight
    assert [(n, rnd) for n, _, rnd in got] == [("client-0", 0)] and ps.comm.in_flight() == ()
    with pytest.raises(ValueError, match="k >= 1"):
        ps.comm.collect(0)


def test_a_round_is_reported_after_its_last_collect() -> None:
    ps = _ps()
    ps.comm.submit("client-1", "test_async.echo", ps.initial_params())
    ps.report(x=1)
    with pytest.raises(RuntimeError, match="report a round after its last collect"):
        ps.comm.collect(1)
