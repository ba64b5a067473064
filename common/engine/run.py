"""One run, the same for both engines: everything around the round loop that is not a node or a link.

An engine builds the nodes and carries the messages; a :class:`Run` owns the rest, once for both:

* the run's lifecycle events (:class:`~fedhop.common.engine.events.RunEvents`), the one progress channel: the
  progress bar, the live page's RunStatus, /metrics and the reproductions subscribe to ``run.events``;
* the round recorder (``ctx.report``: each round's metrics, appended to the ``rounds.jsonl`` journal);
* the commit after each round: the PS's checkpoint (the algorithm's state S, the byte meter, the missing log,
  the rounds so far, the PS's record of its children's last usable replies and, in the in-process engine,
  every other node's snapshot), then the meter rows and the new missing entries as events;
* the result (:class:`~fedhop.common.engine.results.RunResult`) and ``run_finished``.

Both engines go through the same steps::

    run = Run(spec, topology, engine="inprocess", meter=meter, missing=missing, events=events, ...)
    run.start(resumed_at=start.next_round)   # run_started
    run.joined(node, role); run.ready(child, data_sizes); run.lost(node, why)   # as nodes come and go
    outcome = run.drive(algo, ps_ctx, start) # round_started / round_ended, commit, links / missing per round
    result = run.finish(outcome)             # the last links / missing, run_finished

The networked engine's ``ParentHub`` reports joins, readiness and drops through its callback slots today
(``server/main.py`` points them at :meth:`Run.joined`, :meth:`Run.ready` and :meth:`Run.lost`); once the hub
takes one listener object, the Run is that listener.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhop.common import timeline as timelines
from fedhop.common.engine.api import Algorithm, NodeContext, NodeId
from fedhop.common.engine.base import MissingLog
from fedhop.common.engine.checkpoint import CheckpointStore
from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.loop import RoundFailed, Start, drive
from fedhop.common.engine.meter_files import MeterFiles
from fedhop.common.engine.results import RoundRecorder, RunResult, attach_cumulative_bytes
from fedhop.common.engine.run_checkpoint import RunCheckpoint, commit_due, save
from fedhop.common.engine.snapshot import NodeSnapshot
from fedhop.common.engine.spill import spill_bytes
from fedhop.common.spec import RunSpec
from fedhop.common.topology import Topology
from fedhop.common.wire.bundle import Bundle
from fedhop.common.wire.meter import ByteMeter

log = logging.getLogger("fedhop.run")


def new_run_id(spec: RunSpec) -> str:
    """A fresh run id: the spec's name and 8 random hex digits."""
    return f"{spec.name}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Outcome:
    """How the round loop ended: the final model (empty unless it finished) and the driver's wall-clock time.

    ``interrupted``: Ctrl-C during the rounds; ``failed``: a round without enough participants (after its
    retries). Either way the rounds done are in the Run's recorder."""

    final: Bundle
    wall_s: float
    interrupted: bool = False
    failed: RoundFailed | None = None

    @property
    def finished(self) -> bool:
        return not self.interrupted and self.failed is None


class Run:
    """One run's events, round recorder, checkpoint commit, byte meter, missing log and result.

    ``meter`` and ``missing``: the engine's (already holding a resumed run's rows and entries; those are not
    sent again as events). ``records``: a resumed run's rounds so far. ``journal``: the JSON-lines file each
    round is appended to. ``store``: where the PS's checkpoints go (None: no checkpoints). ``snapshots()``: every
    other node's snapshot for the checkpoint (the in-process engine, which holds them all). ``after_commit(t)``:
    called after round t's commit and its events (a test's crash, the PS's gate before the next round)."""

    def __init__(self, spec: RunSpec, topology: Topology, *, engine: str, meter: ByteMeter, missing: MissingLog,
                 events: RunEvents | None = None, run_id: str | None = None,
                 records: Sequence[dict[str, Any]] = (), journal: Path | None = None,
                 store: CheckpointStore | None = None,
                 snapshots: Callable[[], dict[NodeId, NodeSnapshot]] | None = None,
                 after_commit: Callable[[int], None] | None = None,
                 timeline: timelines.Timeline | None = None) -> None:
        self.spec = spec
        self.topology = topology
        self.engine = engine
        self.meter = meter
        self.missing = missing
        self.events = events if events is not None else RunEvents()
        self.run_id = run_id or new_run_id(spec)
        self.store = store
        self._records = list(records)
        self._journal = journal
        self._snapshots = snapshots
        self._after_commit = after_commit
        self._sent_missing = len(missing.entries)  # a resumed run's entries came with its checkpoint
        self._meter_files = MeterFiles(meter)  # the checkpoints' meter rows, a file per round written as it changes
        self._links_seen: dict[int, int] = {}  # per round: the meter's version of it the last links event carried
        self._ctx: NodeContext | None = None
        self._started_at: float | None = None  # set by start (epoch seconds), with the round it resumed at
        self._resumed_at = 0
        self.recorder: RoundRecorder | None = None  # made when the rounds start (its clock is the driver's)
        # every node's timing rows: the PS's own and what its children reported (a fresh one for this run)
        self.timeline = timeline if timeline is not None else timelines.reset(topology.server)

    # -- the run's life ------------------------------------------------------------------------------------
    def start(self, resumed_at: int = 0) -> None:
        """``run_started``: the run's id, spec, nodes and the round it starts at."""
        self._started_at, self._resumed_at = time.time(), resumed_at
        self.events.emit("run_started", run_id=self.run_id, spec=self.spec.model_dump(mode="json"),
                         nodes=list(self.topology.all_nodes()), resumed_at=resumed_at)

    def joined(self, node: NodeId, role: str) -> None:
        """A node joined (or re-joined) the run."""
        self.events.emit("node_joined", node=node, role=role)

    def ready(self, child: NodeId, data_sizes: Mapping[NodeId, int]) -> None:
        """A child of the PS is ready; ``data_sizes`` names its clients (an edge's cluster, or the client
        itself): the clients behind it have joined."""
        for c in data_sizes:
            if c != child:
                self.events.emit("node_joined", node=c, role="client")
        self.events.emit("node_ready", node=child, data_sizes=dict(data_sizes))

    def lost(self, node: NodeId, reason: str) -> None:
        self.events.emit("node_lost", node=node, reason=reason)

    def drive(self, algo: Algorithm, ctx: NodeContext, start: Start | None = None, *,
              partial: bool = False) -> Outcome:
        """Run the round loop on the PS context ``ctx`` from ``start`` (default: a fresh run); the context's
        reporter becomes the Run's recorder.

        ``partial``: Ctrl-C and a failed round end the loop with an :class:`Outcome` that says so (the rounds
        done stay in the recorder: the networked engine still collects its children's meters and writes
        them). Without it they propagate, as every other exception does, after ``run_finished``."""
        self._ctx = ctx
        self.recorder = ctx.reporter = RoundRecorder(records=self._records, journal=self._journal)
        t0 = time.perf_counter()
        unsubscribe = self.events.subscribe(self._round_time)  # while this run's rounds go (events may be shared)
        try:
            final, _ = drive(algo, ctx, start or Start(), self.commit, events=self.events,
                             on_redo=lambda t, _attempt: self.recorder.discard(t),  # a redone round counts once
                             spill_bytes=spill_bytes(self.spec.transport, self.engine))
        except (KeyboardInterrupt, RoundFailed) as e:
            if not partial:
                self._failed(t0, e)
                raise
            wall = time.perf_counter() - t0
            if isinstance(e, RoundFailed):
                return Outcome({}, wall, failed=e)
            return Outcome({}, wall, interrupted=True)
        except BaseException as e:
            self._failed(t0, e)
            raise
        finally:
            unsubscribe()
        return Outcome(final, time.perf_counter() - t0)

    def commit(self, t: int, state: Any) -> None:
        """After round ``t`` (0-based; -1 = set-up): the checkpoint when one is due, then the meter rows and the
        new missing entries as events, then ``after_commit(t)``. A checkpoint that cannot be written (a full
        or read-only disk) is logged, and training goes on."""
        ctx, recorder = self._ctx, self.recorder
        assert ctx is not None and recorder is not None, "commit is called by the round loop of Run.drive"
        store = self.store
        if store is not None and commit_due(self.spec, t):
            nodes = self._snapshots() if self._snapshots is not None else {}
            try:  # the meter's rows go to their round files: the rounds changed since the last checkpoint
                save(store, t, RunCheckpoint(state, [], list(self.missing.entries),
                                             list(recorder.records), dict(ctx.comm.last_ok), self.run_id,
                                             nodes=nodes), self.spec, rows=self._meter_files)
            except OSError as e:  # a full or read-only disk: training goes on, and says what it lacks
                last = store.tags()[-1] + 1 if store.tags() else None
                log.error("ps: the checkpoint of round %d could not be written to %s (%s); the run goes on "
                          "without it (last checkpoint: %s)", t + 1, store.folder, e.strerror or e,
                          f"round {last}" if last else "none")
        self._progress()  # every row (the meter rebuilds only the rows changed since its last read)
        self.events.emit("round_timeline", round=t, rows=self.round_timeline(t))
        if self._after_commit is not None:
            self._after_commit(t)

    def finish(self, outcome: Outcome, *, sort_missing: bool = False) -> RunResult:
        """The result: the rounds with their cumulative bytes, the meter rows, the missing log, the final model;
        the last ``links`` / ``missing`` events, then ``run_finished``. ``sort_missing``: order the missing
        log by (round, reporter, node) in topology order (the networked engine's, merged from every process).
        The final model's tensors are the round loop's own, not a copy: the loop is over, nothing changes them
        (a copy was one model more at the PS's peak, issue 19)."""
        recorder = self.recorder
        assert recorder is not None, "finish follows drive"
        links = self._progress()
        raw = self.timeline.rows()
        if self.spec.network is not None and not any(r["phase"] == "p_round" for r in raw):
            raw += self._predicted(raw, links)  # a networked run: its prediction beside what it measured
        entries = list(self.missing.entries)
        if sort_missing:
            order = {n: i for i, n in enumerate(self.topology.all_nodes())}
            entries.sort(key=lambda e: (e["round"], order.get(e["by"], -1), order.get(e["node"], -1)))
        result = RunResult(spec=self.spec, engine=self.engine,
                           rounds=attach_cumulative_bytes(recorder.records, links), links=links, missing=entries,
                           final=dict(outcome.final), wall_s=outcome.wall_s, interrupted=not outcome.finished,
                           timeline=timelines.derive(raw), started_at=self._started_at,
                           resumed_at=self._resumed_at)
        self.events.emit("run_finished", ok=outcome.finished, wall_s=outcome.wall_s,
                         error=str(outcome.failed) if outcome.failed is not None else None)
        return result

    def round_timeline(self, t: int, links: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Round ``t``'s rows of ``timeline.csv`` so far (common/timeline.py's :func:`derive`); with a
        ``[network]`` table, a networked run's prediction of the round from what it holds so far (``links``: the
        meter's rows when the caller has them, else the round's are read now)."""
        raw = self.timeline.rows(t)
        if self.spec.network is not None and not any(r["phase"] == "p_round" for r in raw):
            from fedhop.common.virtual_clock import predict_rounds

            topo = self.topology
            rows = [m for m in links if m["round"] == t] if links is not None else self.meter.rows_of_round(t)
            raw += predict_rounds(timelines.derive(raw), rows,
                                  self.spec.network, {n: list(topo.children(n)) for n in topo.all_nodes()},
                                  topo.server)
        return timelines.derive(raw)

    # -- helpers -------------------------------------------------------------------------------------------
    def _predicted(self, raw: list[dict[str, Any]], links: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ``[network]`` profile's prediction of each round and link (common/virtual_clock.py), from the
        compute times measured and the messages counted; each round's record gets its ``predicted_round_s``."""
        from fedhop.common.virtual_clock import predict_rounds

        assert self.spec.network is not None and self.recorder is not None
        topo = self.topology
        rows = predict_rounds(timelines.derive(raw), links, self.spec.network,
                              {n: list(topo.children(n)) for n in topo.all_nodes()}, topo.server)
        predicted = {int(r["round"]) + 1: float(r["seconds"]) for r in rows if r["phase"] == "p_round"}
        for rec in self.recorder.records:
            if int(rec.get("round", 0)) in predicted:
                rec["predicted_round_s"] = round(predicted[int(rec["round"])], 6)
        return rows

    def _round_time(self, kind: str, data: dict[str, Any]) -> None:
        """The PS's share of the timeline: each round's duration (its step, waits inside)."""
        if kind == "round_ended":
            ps = self.topology.server
            self.timeline.add(data["round"], ps, "round", data["duration_s"])
            self.timeline.add(data["round"], ps, "busy", data["duration_s"])

    def _progress(self) -> list[dict[str, Any]]:
        """``links`` (every meter row so far, the rounds whose rows changed since the last ``links`` with those
        rows, and the totals) and one ``missing`` per entry not sent yet; returns the rows."""
        view = self.meter.view(self._links_seen)
        self._links_seen.update((r, version) for r, (version, _) in view.changed.items())
        t = view.totals
        self.events.emit("links", rows=view.rows, rounds={r: in_round for r, (_, in_round) in view.changed.items()},
                         totals={"messages": t.messages, "payload_bytes": t.payload_bytes,
                                 "message_bytes": t.message_bytes})
        entries = self.missing.entries
        for entry in entries[self._sent_missing:]:
            self.events.emit("missing", entry=dict(entry))
        self._sent_missing = len(entries)
        return view.rows

    def _failed(self, t0: float, e: BaseException) -> None:
        self.events.emit("run_finished", ok=False, wall_s=time.perf_counter() - t0,
                         error=f"{type(e).__name__}: {e}")
