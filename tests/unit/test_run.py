"""One Run for both engines (common/engine/run.py): the in-process engine emits the run's lifecycle events in
order through one subscriber list, the events carry what the progress bar and the live page need, resume and
failures are told (the live page's /api serving a ``fedhop simulate`` run is in tests/net/test_run.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from fedhop.common.engine import results
from fedhop.common.engine.events import KINDS, RunEvents, readiness, round_records
from fedhop.common.engine.inprocess import FaultPlan, InProcessEngine
from fedhop.common.engine.loop import RoundFailed
from fedhop.common.engine.results import RoundRecorder
from fedhop.common.spec import RunSpec
from fedhop.common.wire.meter import RoundRows
from tests.specs import DIGITS, FailsFirstAttempt, run_spec

UNTIMED = ("elapsed_s", "round_s")


def spec(rounds: int = 3, clients: int = 4, edges: int = 2, **extra: Any) -> RunSpec:
    return run_spec("fedavg", {"local_steps": 2}, clients=clients, edges=edges, name="run-events", rounds=rounds,
                    seed=5, data=DIGITS, model={"name": "mlp", "hidden": [8]}, **extra)


class Recorder:
    """A listener that keeps every event."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        self.seen.append((kind, data))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.seen]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for k, d in self.seen if k == kind]


def untimed(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k not in UNTIMED and not k.startswith("cum_")}


def test_inprocess_run_emits_the_lifecycle_in_order() -> None:
    events, got = RunEvents(), Recorder()
    events.subscribe(got)
    s = spec()
    result = InProcessEngine(s).run(events=events, run_id="r-7")

    # the start: the run, then each child of the PS joins, the clients behind it, and it is ready
    assert got.kinds()[:10] == ["run_started",
                                "node_joined", "node_joined", "node_joined", "node_ready",
                                "node_joined", "node_joined", "node_joined", "node_ready", "round_started"]
    started = got.seen[0][1]
    assert started["run_id"] == "r-7" and started["resumed_at"] == 0
    assert started["nodes"] == ["ps", "edge-0", "edge-1", "client-0", "client-1", "client-2", "client-3"]
    assert RunSpec.model_validate(started["spec"]) == s
    assert [d["node"] for d in got.of("node_joined")] == ["edge-0", "client-0", "client-1", "edge-1", "client-2",
                                                          "client-3"]
    sizes = InProcessEngine(s).client_sizes
    assert [(d["node"], d["data_sizes"]) for d in got.of("node_ready")] == [
        ("edge-0", {c: sizes[c] for c in ("client-0", "client-1")}),
        ("edge-1", {c: sizes[c] for c in ("client-2", "client-3")})]

    # every round: started, ended, then the commit's links (no fault: no missing entries); then the end
    rounds = got.kinds()[9:]
    assert rounds == ["round_started", "round_ended", "links", "round_timeline"] * 3 + ["links", "run_finished"]
    assert [d["round"] for d in got.of("round_started")] == [0, 1, 2]
    ended = got.of("round_ended")
    assert [d["round"] for d in ended] == [0, 1, 2] and all(d["duration_s"] > 0 for d in ended)
    assert [untimed(d["record"]) for d in ended] == [untimed(r) for r in result.rounds]
    assert got.of("links")[-1]["rows"] == result.links
    # each round's timeline: every node computed, the PS waited, every link carried, within the round's time
    timed = got.of("round_timeline")
    assert [d["round"] for d in timed] == [0, 1, 2]
    for d, end in zip(timed, ended, strict=True):
        rows = d["rows"]
        assert {r["node"] for r in rows if r["phase"] == "compute"} == set(started["nodes"])
        assert {(r["node"], r["peer"]) for r in rows if r["phase"] == "transfer"} == {
            ("ps", "edge-0"), ("ps", "edge-1"), ("edge-0", "client-0"), ("edge-0", "client-1"),
            ("edge-1", "client-2"), ("edge-1", "client-3")}
        assert all(r["round"] == d["round"] and r["seconds"] >= 0 for r in rows)
        for node in started["nodes"]:  # a node's own phases add up to at most the round (transfer is in wait)
            own = sum(r["seconds"] for r in rows if r["node"] == node and r["phase"] in ("compute", "encode", "wait"))
            assert own <= end["duration_s"] + 1e-6, (node, own, end["duration_s"])
        assert all(r["seconds"] <= end["duration_s"] + 1e-6 for r in rows if r["phase"] == "transfer")
    assert result.timeline == [r for d in timed for r in d["rows"]]
    assert got.of("run_finished") == [{"ok": True, "wall_s": result.wall_s, "error": None}]
    assert set(got.kinds()) <= set(KINDS)


def test_each_links_event_carries_the_rounds_it_changed_and_the_totals() -> None:
    """After each commit ``links`` has every row, the rounds whose rows changed since the last ``links`` (what the
    live page's process is sent) and the totals; applied in order they rebuild every row each time."""
    events, got = RunEvents(), Recorder()
    events.subscribe(got)
    result = InProcessEngine(spec(rounds=4)).run(events=events)
    copy = RoundRows()
    links = got.of("links")
    for i, d in enumerate(links):
        assert copy.apply(d["rounds"]) == d["rows"]
        assert d["totals"] == {k: sum(r[k] for r in d["rows"]) for k in ("messages", "payload_bytes",
                                                                         "message_bytes")}
        if i < 4:  # after round i's commit: that round only
            assert set(d["rounds"]) == {i}
    assert set(links[0]["rounds"]) == {0} and links[-1]["rows"] == result.links
    assert set(links[-1]["rounds"]) <= {-1, 3}  # the end: only what the final step added


def test_missing_entries_follow_the_commit_of_their_round() -> None:
    events, got = RunEvents(), Recorder()
    events.subscribe(got)
    faults = FaultPlan(lambda node, task, rnd: node == "client-1" and rnd == 1)
    result = InProcessEngine(spec(edges=0), faults=faults).run(events=events)
    assert result.missing and [d["entry"] for d in got.of("missing")] == result.missing
    kinds = got.kinds()
    second_links = [i for i, k in enumerate(kinds) if k == "links"][1]
    assert kinds[second_links + 1:second_links + 1 + len(result.missing)] == ["missing"] * len(result.missing)
    assert all(e["round"] == 2 for e in result.missing)


def test_one_subscriber_list_is_the_only_progress_channel() -> None:
    assert not hasattr(results, "round_observers")
    assert "on_round" not in RoundRecorder.__dataclass_fields__
    events = RunEvents()
    bar_rounds: list[dict[str, Any]] = []
    ready: list[tuple[str, int]] = []
    events.subscribe(round_records(bar_rounds.append))
    events.subscribe(readiness(lambda child, sizes: ready.append((child, len(sizes)))))

    def broken(kind: str, data: dict[str, Any]) -> None:
        raise RuntimeError("a listener that fails")

    events.subscribe(broken)  # logged, never reaches the run
    late = Recorder()
    unsubscribe = events.subscribe(late)
    unsubscribe()
    result = InProcessEngine(spec()).run(events=events)
    assert [r["round"] for r in bar_rounds] == [1, 2, 3]
    assert [untimed(r) for r in bar_rounds] == [untimed(r) for r in result.rounds]
    assert ready == [("edge-0", 2), ("edge-1", 2)]
    assert late.seen == []


def test_resumed_run_starts_where_its_checkpoint_ends(tmp_path: Path) -> None:
    s = spec(rounds=4, edges=0)

    def crash(t: int) -> None:
        if t == 1:
            raise KeyError("crash after round 2")

    first = Recorder()
    events = RunEvents()
    events.subscribe(first)
    with pytest.raises(KeyError):
        InProcessEngine(s).run(events=events, run_id="keep-me", checkpoints=tmp_path, after_commit=crash)
    finished = first.of("run_finished")
    assert len(finished) == 1 and not finished[0]["ok"] and "crash after round 2" in finished[0]["error"]

    again = Recorder()
    events = RunEvents()
    events.subscribe(again)
    result = InProcessEngine(s).run(events=events, checkpoints=tmp_path, resume=True)
    started = again.of("run_started")[0]
    assert started["run_id"] == "keep-me" and started["resumed_at"] == 2
    assert [d["round"] for d in again.of("round_ended")] == [2, 3]
    assert [r["round"] for r in result.rounds] == [1, 2, 3, 4]


def test_failed_round_is_told_and_raised() -> None:
    s = spec(edges=0, transport={"min_participants": 4, "round_retries": 0})
    faults = FaultPlan(lambda node, task, rnd: node == "client-0" and rnd == 1)
    events, got = RunEvents(), Recorder()
    events.subscribe(got)
    with pytest.raises(RoundFailed):
        InProcessEngine(s, faults=faults).run(events=events)
    (finished,) = got.of("run_finished")
    assert finished["ok"] is False and "RoundFailed" in finished["error"]
    assert [d["round"] for d in got.of("round_ended")] == [0]


def test_unwritable_checkpoint_is_logged_and_the_run_goes_on(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the checkpoints should go")
    s = spec(rounds=2, edges=0)
    with caplog.at_level(logging.ERROR, logger="fedhop.run"):
        result = InProcessEngine(s).run(checkpoints=blocker / "ckpt")
    assert len(result.rounds) == 2
    assert any("the checkpoint of round 1 could not be written" in r.message for r in caplog.records)


def test_runs_sharing_one_event_stream_time_only_their_own_rounds() -> None:
    """A reproduction makes several runs on one RunEvents: each Run's timeline has its own rounds only."""
    events, got = RunEvents(), Recorder()
    events.subscribe(got)
    first = InProcessEngine(spec(rounds=2)).run(events=events)
    second = InProcessEngine(spec(rounds=2)).run(events=events)
    for result in (first, second):
        assert sorted(r["round"] for r in result.timeline if r["phase"] == "round") == [0, 1]
    durations = [d["duration_s"] for d in got.of("round_ended")]
    assert [r["seconds"] for r in second.timeline if r["phase"] == "round"] == pytest.approx(durations[2:])


def test_a_redone_round_is_one_round_of_the_run(tmp_path: Path) -> None:
    """Round 2's first attempt loses client-0 (too few usable replies for min_participants = 4), so the engine
    redoes it from its starting state: the run has each round once, in its records, its journal and its events'
    records, and the kept round 2 is the attempt that stood."""
    fault = FailsFirstAttempt()  # client-0 in round 2
    s = spec(edges=0, transport={"min_participants": 4, "round_retries": 1})
    journal = tmp_path / "rounds.jsonl"
    result = InProcessEngine(s, faults=FaultPlan(fault)).run(journal)
    assert fault.calls == 2  # the fault struck, and round 2 ran again
    assert [r["round"] for r in result.rounds] == [1, 2, 3]
    assert [json.loads(line)["round"] for line in journal.read_text().splitlines()] == [1, 2, 3]
    clean = InProcessEngine(spec(edges=0)).run()
    assert [untimed(r) for r in result.rounds] == [untimed(r) for r in clean.rounds]  # round 2 is the redo


def test_round_recorder_discards_a_redone_round(tmp_path: Path) -> None:
    rec = RoundRecorder(journal=tmp_path / "j.jsonl")
    rec(0, {"loss": 1.0})
    rec(1, {"loss": 0.9})  # an attempt that will be redone
    rec.discard(1)
    rec(1, {"loss": 0.5})
    assert [(r["round"], r["loss"]) for r in rec.records] == [(1, 1.0), (2, 0.5)]
    assert [json.loads(line)["loss"] for line in (tmp_path / "j.jsonl").read_text().splitlines()] == [1.0, 0.5]
    rec.discard(7)  # nothing reported for that round: nothing changes
    assert len(rec.records) == 2


def test_each_commit_writes_the_meter_rows_of_its_round_not_of_the_run(tmp_path: Path) -> None:
    """Issue 19: a checkpoint used to carry every meter row of the run so far in its state (walked node by node,
    growing with rounds x clients); now each commit writes the rows of the rounds that changed, one file each,
    and the checkpoint lists them: reading it back gives every row."""
    from fedhop.common.engine import meter_files
    from fedhop.common.engine.checkpoint import CheckpointStore, read_checkpoint
    from fedhop.common.engine.run_checkpoint import load_latest

    seen: set[str] = set()
    new_rounds: list[tuple[int, set[int]]] = []

    def after(t: int) -> None:
        nonlocal seen
        now = {p.name for p in (tmp_path / meter_files.FOLDER).iterdir()}
        new_rounds.append((t, {int(n.split("_")[1]) for n in now - seen}))
        seen = now

    result = InProcessEngine(spec(rounds=4, edges=0)).run(checkpoints=tmp_path, after_commit=after)
    assert [(t, rounds) for t, rounds in new_rounds if t >= 0] == [(t, {t}) for t in range(4)]
    store = CheckpointStore(tmp_path)
    meta, saved = read_checkpoint(store.path(store.tags()[-1]))
    assert saved.meter == [] and len(meta[meter_files.META_KEY]) == len({r["round"] for r in result.links})
    assert load_latest(store)[1].meter == result.links
