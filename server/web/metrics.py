"""/metrics: the run's numbers in the Prometheus exposition format, read from a RunStatus at scrape time.

A custom collector (prometheus_client's pattern for values that live elsewhere) registered on a registry of
its own, so two runs in one process (tests) never share series.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from fedhop.server.web.status import PHASES, RunStatus

# Round durations span milliseconds (toy runs) to many minutes (CIFAR over shaped links).
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
LINK_LABELS = ["src", "dst", "kind", "phase"]


class RunCollector(Collector):
    def __init__(self, status: RunStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        st = self.status.status()
        links = self.status.links()
        durations = self.status.round_durations()

        info = InfoMetricFamily("fedhop_run", "the run being served")
        info.add_metric([], {"run_id": st["run_id"] or "", "name": st["name"] or "",
                             "algorithm": st["algorithm"] or ""})
        yield info
        phase = GaugeMetricFamily("fedhop_run_phase", "1 for the run's current phase", labels=["phase"])
        for p in PHASES:
            phase.add_metric([p], 1.0 if st["phase"] == p else 0.0)
        yield phase
        yield CounterMetricFamily("fedhop_rounds_completed", "rounds completed (a resumed run counts the "
                                  "rounds before it resumed)", value=st["rounds_completed"])
        yield GaugeMetricFamily("fedhop_rounds_planned", "rounds in the spec", value=st["rounds_total"])
        nodes = st["nodes"]
        yield GaugeMetricFamily("fedhop_nodes_expected", "edges and clients in the topology",
                                value=nodes["expected"])
        yield GaugeMetricFamily("fedhop_nodes_connected", "edges and clients joined and not lost",
                                value=nodes["joined"])
        yield GaugeMetricFamily("fedhop_nodes_lost", "edges and clients lost", value=len(nodes["lost"]))
        for key in ("accuracy", "loss"):
            if key in st["last"]:
                yield GaugeMetricFamily(f"fedhop_test_{key}", f"test {key} at the last evaluated round",
                                        value=float(st["last"][key]))
        yield CounterMetricFamily("fedhop_missing_entries", "entries of the missing log",
                                  value=self.status.counts()["missing"])

        fams = {c: CounterMetricFamily(f"fedhop_link_{c}", f"{c.replace('_', ' ')} sent on a link, by message "
                                       "kind and phase", labels=LINK_LABELS)
                for c in ("messages", "payload_bytes", "message_bytes")}
        for row in links["by_kind"]:
            labels = [row[k] for k in LINK_LABELS]
            for c, fam in fams.items():
                fam.add_metric(labels, row[c])
        yield from fams.values()
        if "wire_bytes" in links["totals"]:
            wire = CounterMetricFamily("fedhop_link_wire_bytes", "kernel-counted bytes on a link",
                                       labels=["src", "dst"])
            for row in links["links"]:
                wire.add_metric([row["src"], row["dst"]], row["wire_bytes"])
            yield wire

        buckets = [(_le(b), sum(1 for d in durations if d <= b)) for b in DURATION_BUCKETS]
        buckets.append(("+Inf", len(durations)))
        yield HistogramMetricFamily("fedhop_round_duration_seconds", "wall-clock of each round at the PS",
                                    buckets=buckets, sum_value=math.fsum(durations))


def _le(b: float) -> str:
    return repr(float(b))


def make_registry(status: RunStatus) -> CollectorRegistry:
    """A registry of its own holding the run's collector (never the process-global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(status))
    return registry
