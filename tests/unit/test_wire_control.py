"""Report frames (common/wire/control.py): a child reports only what its meter and missing log gained since
its last report, so that the PS's merged table equals the child's own, however the reports were cut."""

from __future__ import annotations

from fedhop.common.wire.control import ReportCursor, bye_frame, meter_rows_from_pb, missing_from_pb, report_frame
from fedhop.common.wire.meter import ByteMeter


def test_reports_add_up_to_the_childs_table() -> None:
    child, parent = ByteMeter(), ByteMeter()
    missing: list[dict] = []
    cursor = ReportCursor()
    got_missing: list[dict] = []

    def report() -> None:
        rows, new_missing = cursor.delta(child.rows(), missing)
        f = report_frame(rows, new_missing, 0)
        parent.merge(meter_rows_from_pb(f.report.meter))
        got_missing.extend(missing_from_pb(f.report.missing))

    child.record("edge-0", "client-0", "t", "request", 100, 130, 0)
    child.record("client-0", "edge-0", "t", "reply", 100, 140, 0)
    report()
    first = parent.rows()
    report()  # nothing new: nothing changes
    assert parent.rows() == first
    child.record("edge-0", "client-0", "t", "request", 100, 130, 0)  # the same key again: only the difference
    child.record("edge-0", "client-1", "t", "request", 100, 130, 1)
    missing.append({"round": 2, "by": "edge-0", "node": "client-1", "task": "t", "reason": "deadline"})
    report()
    rows, new_missing = cursor.delta(child.rows(), missing)
    bye = bye_frame("bye", finished=True, rows=rows, missing=new_missing)
    parent.merge(meter_rows_from_pb(bye.bye.meter))
    assert parent.rows() == child.rows()
    assert got_missing == missing
    assert [r["messages"] for r in parent.rows() if r["dst"] == "client-0"] == [2]
