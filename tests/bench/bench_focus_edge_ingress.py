"""FOCUS through an edge tier vs flat: PS ingress bytes (from the byte meter) and exactness. Prints a table.

    .venv/bin/python tests/bench/bench_focus_edge_ingress.py                    # 16 clients, 4 edges, 20 rounds
    .venv/bin/python tests/bench/bench_focus_edge_ingress.py --clients 32 --edges 4 --rounds 50

Each row runs the same spec twice on the in-process engine, flat (topology.edges = 0) and through the edges
(each edge pre-sums its clients' pushes and pushes one vector), and reports the payload bytes the PS received
(pushes; the pulls it sent are shown too), the saving 1 - tier / flat, and the largest relative difference of
the server model between the two runs over all rounds (the sums associate differently: ~1e-16, not 0). The
networked engine meters the same bytes per link and kind (tests/integration/test_focus_modes.py).
"""

from __future__ import annotations

import argparse

import numpy as np

from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import RunSpec
from fedhop.common.wire.bundle import flat

MODES = {
    "full (server)": {"participation": {"kind": "full"}},
    "bernoulli Fig. 9 (server)": {"participation": {"kind": "bernoulli"}},
    "uniform m=N/4 (server)": "uniform",
    "markov (client-decided)": {"participation": {"kind": "markov"}, "decided_by": "client"},
}


def spec(opts: dict, clients: int, edges: int, rounds: int, seed: int) -> RunSpec:
    return RunSpec.parse({
        "algorithm": {"name": "focus", "options": {"lr": 0.002, "local_steps": 3, **opts}},
        "topology": {"clients": clients, "edges": edges},
        "data": {"dataset": "digits", "partition": "dirichlet", "dirichlet_lambda": 0.5},
        "model": {"name": "mlp", "hidden": [32], "dtype": "float64"},
        "rounds": rounds, "seed": seed, "device": "cpu", "eval_every": 1,
    })


def run(s: RunSpec) -> tuple[list[np.ndarray], list[dict]]:
    eng = InProcessEngine(s)
    models: list[np.ndarray] = []
    real = eng.ws.evaluate
    eng.ws.evaluate = lambda params, data=None: models.append(flat(params).numpy().copy()) or real(params)
    res = eng.run()
    return models, res.links


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--edges", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(f"FOCUS flat vs {a.edges} edges: {a.clients} clients, {a.rounds} rounds, digits MLP 64-32-10 float64")
    print(f"{'participation':<26} {'PS in flat':>12} {'PS in tier':>12} {'saving':>7} "
          f"{'PS out flat':>12} {'PS out tier':>12} {'max rel diff':>13}")
    for name, opts in MODES.items():
        if opts == "uniform":
            opts = {"participation": {"kind": "uniform", "m": max(1, a.clients // 4)}}
        f_models, f_links = run(spec(opts, a.clients, 0, a.rounds, a.seed))
        t_models, t_links = run(spec(opts, a.clients, a.edges, a.rounds, a.seed))
        ps_in = [sum(r["payload_bytes"] for r in links if r["dst"] == "ps") for links in (f_links, t_links)]
        ps_out = [sum(r["payload_bytes"] for r in links if r["src"] == "ps") for links in (f_links, t_links)]
        diff = max(float(np.linalg.norm(x - y) / np.linalg.norm(y)) for x, y in zip(t_models, f_models, strict=True))
        print(f"{name:<26} {ps_in[0]:>12,} {ps_in[1]:>12,} {1 - ps_in[1] / ps_in[0]:>7.1%} "
              f"{ps_out[0]:>12,} {ps_out[1]:>12,} {diff:>13.1e}")


if __name__ == "__main__":
    main()
