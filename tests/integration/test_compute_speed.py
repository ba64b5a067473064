"""Compute heterogeneity (``[network.nodes.<id>] compute``): a client at a quarter of the speed takes 4x its own
measured handler time per task, and the math is unchanged (the final model is bit-identical to the unshaped run).

The times are the node's own: the timing events ``compute`` (``handler_s``: what the handler took,
``slowed_s``: what the node waited out after it) and ``run`` / ``ran`` (the task's start and its end, the
wait included), written by every process under ``FEDHOP_TIMERS`` (common/timing.py).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhop.common.spec import RunSpec
from tests.integration.netutil import launch_here, load_result, small_spec

SLOW = "client-1"


def _spec(network: dict[str, Any] | None) -> RunSpec:
    spec = small_spec("fedavg", clients=2, rounds=3, options={"local_steps": 120})
    raw = spec.model_dump(mode="json", exclude_none=True)
    if network is not None:
        raw["network"] = network
    return RunSpec.parse(raw)


def _events(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()
            if line.strip()]


def _task_times(events: list[dict[str, Any]], node: str) -> tuple[list[float], list[float], list[float]]:
    """(handler seconds, waited-out seconds, run -> ran seconds) of ``node``'s tasks, in order."""
    mine = [e for e in events if e.get("at") == node]
    compute = [e for e in mine if e["kind"] == "compute"]
    runs = {e["call"]: e["t"] for e in mine if e["kind"] == "run"}
    spans = [e["t"] - runs[e["call"]] for e in mine if e["kind"] == "ran" and e["call"] in runs]
    return [e["handler_s"] for e in compute], [e["slowed_s"] for e in compute], spans


@pytest.mark.serial  # the two runs' handler times are compared: no other test's load in between (make test: -n 2)
def test_a_quarter_speed_client_takes_four_times_as_long_with_the_same_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = {}
    for name, network in (("plain", None), ("slow", {"nodes": {SLOW: {"compute": 0.25}}})):
        timers = tmp_path / f"timers-{name}"
        monkeypatch.setenv("FEDHOP_TIMERS", str(timers))
        (tmp_path / name).mkdir()
        out = launch_here(_spec(network), tmp_path / name, clients_per_process=1)  # forked children read it
        runs[name] = (load_result(out), _events(timers))
    (_, plain_final), plain_events = runs["plain"]
    (_, slow_final), events = runs["slow"]
    assert list(slow_final) == list(plain_final)
    for k, v in plain_final.items():
        assert torch.equal(slow_final[k], v), f"tensor {k} differs: compute speed changed the math"

    fast_handler, fast_waited, _ = _task_times(events, "client-0")
    slow_handler, slow_waited, slow_spans = _task_times(events, SLOW)
    assert fast_handler and slow_handler, f"no compute events: {sorted({e.get('at') for e in events})}"
    assert all(w == 0 for w in fast_waited)  # the unshaped client waits for nothing
    for h, w in zip(slow_handler, slow_waited, strict=True):
        assert w == pytest.approx(3 * h)  # 1 / 0.25 - 1 times its own handler time
    # each task took handler / 0.25 from start to end (the wait is real: the node's own clock says so)
    assert len(slow_spans) == len(slow_handler)
    assert all(span >= 0.95 * 4 * h for span, h in zip(slow_spans, slow_handler, strict=True)), slow_spans
    # ~4x the same client's handler time on the same job unshaped (tolerance for a loaded 2-core machine)
    plain_handler, plain_waited, _ = _task_times(plain_events, SLOW)
    assert plain_handler and all(w == 0 for w in plain_waited)
    slow_total = [h + w for h, w in zip(slow_handler, slow_waited, strict=True)]
    ratio = statistics.median(slow_total) / statistics.median(plain_handler)
    print(f"per-task time of {SLOW}: compute 0.25 / unshaped = {ratio:.2f} (handler s: slow {slow_handler}, "
          f"unshaped {plain_handler}, client-0 {fast_handler})")
    assert ratio > 2.5, (slow_handler, plain_handler)
