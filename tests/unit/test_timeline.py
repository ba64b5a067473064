"""The timeline's aggregation (common/timeline.py): raw rows in, timeline.csv's phases out; no sockets."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fedhop.common import timeline
from fedhop.common.timeline import Timeline, derive, per_round, read_csv, slowest, write_csv
from fedhop.common.wire.control import bye_frame, report_frame, timeline_from_pb
from fedhop.report import slowest_line
from fedhop.v1 import fedhop_pb2 as pb


def raw(*rows: tuple[int, str, str, str, float]) -> list[dict]:
    return [{"round": r, "node": n, "peer": p, "phase": ph, "seconds": s} for r, n, p, ph, s in rows]


def by_key(rows: list[dict]) -> dict[tuple[int, str, str, str], float]:
    return {(r["round"], r["node"], r["peer"], r["phase"]): r["seconds"] for r in rows}


def test_timeline_sums_per_key_and_round() -> None:
    t = Timeline()
    t.add(0, "c0", "busy", 1.0)
    t.add(0, "c0", "busy", 0.5)
    t.add(0, "e0", "rtt", 2.0, peer="c0")
    t.add(0, "c0", "busy", -3.0)  # a clock difference below 0 counts as 0
    t.add(1, "c0", "busy", 4.0)
    assert by_key(t.rows()) == {(0, "c0", "", "busy"): 1.5, (0, "e0", "c0", "rtt"): 2.0, (1, "c0", "", "busy"): 4.0}
    assert by_key(t.rows(1)) == {(1, "c0", "", "busy"): 4.0} and t.rows(7) == []
    with pytest.raises(ValueError, match="reports to no one"):
        t.unreported()


def test_a_childs_timeline_reports_only_what_is_new_and_keeps_nothing() -> None:
    t = Timeline(keep=False)
    t.add(0, "c0", "busy", 1.0)
    t.add(0, "c0", "busy", 0.5)
    t.add(0, "e0", "rtt", 2.0, peer="c0")
    assert by_key(t.unreported()) == {(0, "c0", "", "busy"): 1.5, (0, "e0", "c0", "rtt"): 2.0}
    assert t.unreported() == [] and t.rows() == []
    t.add(0, "c0", "busy", 0.25)
    t.add(1, "c0", "busy", 1.0)
    assert by_key(t.unreported()) == {(0, "c0", "", "busy"): 0.25, (1, "c0", "", "busy"): 1.0}


def test_merging_reports_rebuilds_the_childs_timeline() -> None:
    child, parent = Timeline(keep=False), Timeline()
    child.add(0, "c0", "busy", 1.0)
    parent.merge(child.unreported())
    child.add(0, "c0", "busy", 2.0)
    child.add(1, "c0", "served", 0.5)
    parent.merge(child.unreported())
    assert by_key(parent.rows()) == {(0, "c0", "", "busy"): 3.0, (1, "c0", "", "served"): 0.5}


def test_concurrent_adds_lose_nothing() -> None:
    t = Timeline()

    def work() -> None:
        for _ in range(1000):
            t.add(0, "n", "busy", 1.0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert by_key(t.rows()) == {(0, "n", "", "busy"): 4000.0}


def test_derive_splits_busy_wait_encode_and_transfer() -> None:
    rows = derive(raw(
        (0, "ps", "", "round", 10.0), (0, "ps", "", "busy", 10.0), (0, "ps", "", "wait", 9.0),
        (0, "ps", "", "encode_req", 0.5),
        (0, "ps", "e0", "rtt", 8.0),
        (0, "e0", "", "busy", 7.0), (0, "e0", "", "wait", 4.0), (0, "e0", "", "encode_req", 0.25),
        (0, "e0", "", "encode", 0.5), (0, "e0", "", "served", 7.75), (0, "e0", "e1", "transfer", 1.0),
        (0, "e0", "c0", "rtt", 4.0), (0, "c0", "", "busy", 3.0), (0, "c0", "", "encode", 0.1),
        (0, "c0", "", "served", 3.5),
    ))
    assert by_key(rows) == pytest.approx({
        (0, "ps", "", "round"): 10.0,
        (0, "ps", "", "compute"): 1.0,      # busy - wait
        (0, "ps", "", "wait"): 8.5,         # wait - its requests' encode
        (0, "ps", "", "encode"): 0.5,
        (0, "ps", "e0", "transfer"): 0.25,  # rtt 8 - e0's served 7.75
        (0, "e0", "", "compute"): 2.0,      # busy 7 - wait 4 - the hand-off 1
        (0, "e0", "", "wait"): 3.75,
        (0, "e0", "", "encode"): 0.75,      # requests and result
        (0, "e0", "e1", "transfer"): 1.0,   # a hand-off, timed by its sender
        (0, "e0", "c0", "transfer"): 0.5,
        (0, "c0", "", "compute"): 3.0,
        (0, "c0", "", "encode"): 0.1,
    })
    assert {r["phase"] for r in rows} <= {*timeline.PHASES, "round"}


def test_derive_clips_a_negative_difference_and_keeps_rounds_apart() -> None:
    rows = by_key(derive(raw((0, "p", "c", "rtt", 1.0), (0, "c", "", "served", 1.5), (1, "c", "", "served", 0.2),
                             (1, "p", "c", "rtt", 1.0))))
    assert rows == pytest.approx({(0, "p", "c", "transfer"): 0.0, (1, "p", "c", "transfer"): 0.8})


def test_slowest_link_and_node_over_the_run() -> None:
    rows = derive(raw((0, "ps", "e0", "rtt", 3.0), (1, "ps", "e0", "rtt", 3.0), (0, "ps", "e1", "rtt", 5.0),
                      (0, "c0", "", "busy", 2.0), (1, "c0", "", "busy", 2.0), (0, "c1", "", "busy", 3.0)))
    s = slowest(rows)
    assert (s.link, s.link_s, s.node, s.node_s) == (("ps", "e0"), 6.0, "c0", 4.0)
    line = slowest_line(rows)
    assert line is not None and "ps -> e0" in line and "c0" in line
    assert slowest_line([]) is None and slowest([]).link is None


def test_per_round_sums_phases_without_the_setup_step() -> None:
    rows = derive(raw((-1, "c0", "", "busy", 9.0), (0, "c0", "", "busy", 1.0), (0, "c1", "", "busy", 2.0),
                      (0, "ps", "c0", "rtt", 4.0), (1, "c0", "", "encode", 0.5)))
    assert per_round(rows) == {0: {"compute": 3.0, "encode": 0.0, "transfer": 4.0, "wait": 0.0},
                               1: {"compute": 0.0, "encode": 0.5, "transfer": 0.0, "wait": 0.0}}


def test_csv_round_trip(tmp_path: Path) -> None:
    rows = derive(raw((0, "ps", "e0", "rtt", 0.125), (0, "c0", "", "busy", 2.5), (-1, "ps", "", "round", 1.0)))
    write_csv(tmp_path / "timeline.csv", rows)
    assert (tmp_path / "timeline.csv").read_text().splitlines()[0] == "round,node,peer,phase,seconds"
    # the file's rounds are 1-based, as in rounds.csv and links.csv (0: the set-up step)
    assert read_csv(tmp_path / "timeline.csv") == [{**r, "round": r["round"] + 1} for r in rows]


def test_report_and_bye_frames_carry_the_rows() -> None:
    rows = raw((0, "c0", "", "busy", 0.5), (2, "e0", "c0", "rtt", 1.25))
    got = pb.Frame.FromString(report_frame([], [], 0, rows).SerializeToString())
    assert timeline_from_pb(got.report.timeline) == rows
    bye = pb.Frame.FromString(bye_frame("bye", finished=True, timeline=rows).SerializeToString())
    assert timeline_from_pb(bye.bye.timeline) == rows
    assert not report_frame([], [], 0).report.timeline  # without timing rows the Report is as before


def test_a_node_timeline_is_per_process_and_reset_per_run() -> None:
    a = timeline.recorder("unit-node")
    a.add(0, "unit-node", "busy", 1.0)
    assert timeline.recorder("unit-node") is a and not a.keep  # a child's: it reports what it measures
    b = timeline.reset("unit-node")  # the PS's, for a new run: keeps every row
    assert b is not a and timeline.recorder("unit-node") is b and b.rows() == [] and b.keep
