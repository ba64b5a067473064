"""ClientApp: one local epoch of mini-batch SGD on this SuperNode's partition, from the received model."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedhop_flower_bench.task import make_model, partition, train_epochs

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg, node = context.run_config, context.node_config
    k, n = int(node["partition-id"]), int(node["num-partitions"])
    x, y = partition(int(cfg["seed"]), float(cfg["test-fraction"]), k, n)
    model = make_model(int(cfg["hidden"]), int(cfg["seed"]))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    rnd = int(msg.content["config"]["server-round"]) if "config" in msg.content else 0
    train_epochs(model, x, y, int(cfg["local-epochs"]), int(cfg["batch-size"]), float(cfg["lr"]),
                 seed=int(cfg["seed"]) * 1000 + k * 100 + rnd)
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(x)})})
    return Message(content=content, reply_to=msg)
