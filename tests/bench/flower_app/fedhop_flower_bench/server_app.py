"""ServerApp: Flower's FedAvg over every SuperNode, no federated evaluation; the global model is evaluated
centrally on the test split before the first round and after each round (as fedhop does), and the time of
each of those evaluations is appended to ``timing-file`` (JSON lines), from which the benchmark reads the
round times."""

from __future__ import annotations

import json
import time

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedhop_flower_bench.task import evaluate, make_model, split

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    n, hidden, seed = int(cfg["num-partitions"]), int(cfg["hidden"]), int(cfg["seed"])
    timing = str(cfg["timing-file"])
    _, (xte, yte) = split(seed, float(cfg["test-fraction"]))
    model = make_model(hidden, seed)

    def central_eval(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        t = time.time()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = evaluate(model, xte, yte)
        if timing:
            with open(timing, "a") as f:
                f.write(json.dumps({"round": server_round, "t": t, "loss": loss, "accuracy": acc}) + "\n")
        return MetricRecord({"loss": loss, "accuracy": acc})

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=int(cfg["num-server-rounds"]), train_config=ConfigRecord({}),
                   evaluate_fn=central_eval)
