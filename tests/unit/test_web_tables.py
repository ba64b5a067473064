"""The live page's link tables (server/web/status.py) are kept from the rounds each ``links`` event changed
(issue 19: rebuilt from every row they took 0.7 s a page request at 500,000 rows): after every kind of change a
PS's meter sees (late replies into old rounds, merges, wire rows, a rollback's relabelling) they must say what a
sum over every row says, computed here independently."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fedhop.common.wire.meter import ByteMeter
from fedhop.server.web import status as status_mod
from fedhop.server.web.status import RunStatus
from tests.unit.test_meter_rows import random_change


def reference(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of ``rows`` from its definition: per (src, dst, kind, phase) and per (src, dst), summed."""
    wire = any("wire_bytes" in r for r in rows)
    counts = ("messages", "payload_bytes", "message_bytes", *(("wire_bytes",) if wire else ()))
    kinds: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        k = (r["src"], r["dst"], r["kind"], r["phase"])
        x = kinds.setdefault(k, {"src": k[0], "dst": k[1], "kind": k[2], "phase": k[3], **dict.fromkeys(counts, 0),
                                 "last_round": r["round"]})
        for c in counts:
            x[c] += r.get(c, 0)
        x["last_round"] = max(x["last_round"], r["round"])
    links: dict[tuple, dict[str, Any]] = {}
    for k in sorted(kinds):
        y = links.setdefault(k[:2], {"src": k[0], "dst": k[1], **dict.fromkeys(counts, 0), "kinds": []})
        for c in counts:
            y[c] += kinds[k][c]
        if k[2] not in y["kinds"]:
            y["kinds"].append(k[2])
    return {"links": sorted(links.values(), key=lambda y: (-y["payload_bytes"], -y["message_bytes"], y["src"],
                                                           y["dst"])),
            "by_kind": [kinds[k] for k in sorted(kinds)],
            "totals": {c: sum(r.get(c, 0) for r in rows) for c in counts}}


def cumulative(rows: list[dict[str, Any]], upto: int) -> dict[str, int]:
    return {c: sum(r[c] for r in rows if r["round"] <= upto) for c in ("payload_bytes", "message_bytes")}


@pytest.mark.parametrize("seed", [1, 19, 77])
def test_tables_kept_from_the_changed_rounds_equal_a_sum_over_every_row(seed: int, monkeypatch) -> None:
    built_whole = []
    of = status_mod._LinkSums.of
    monkeypatch.setattr(status_mod._LinkSums, "of", classmethod(lambda cls, rows: built_whole.append(1) or of(rows)))
    rng = random.Random(seed)
    meter, seen = ByteMeter(), {}
    live, plain = RunStatus(), RunStatus()  # a links event with its rounds, and the rows alone (a run's folder)
    reads = 0
    for step in range(400):
        t = rng.randrange(-1, 9) if rng.random() < 0.3 else step // 45  # mostly the current round
        random_change(meter, rng, rng.randrange(5), t)
        if step in (170, 300):  # a rollback: old rows of rounds already sent move to "redo"
            assert meter.relabel_from(step // 45 - 1)
        if rng.random() < 0.25 or step == 399:  # a commit
            view = meter.view(seen)
            seen.update((r, v) for r, (v, _) in view.changed.items())
            live("links", {"rows": view.rows, "rounds": {r: rows for r, (_, rows) in view.changed.items()}})
            plain("links", {"rows": view.rows})
            if rng.random() < 0.5 or step == 399:  # a page request (not after every event: changes pile up)
                reads += 1
                want = reference(view.rows)
                assert live.links() == want
                assert plain.links() == want
                for upto in range(-2, 10):
                    assert live._tables_now().cumulative(upto) == cumulative(view.rows, upto)
    # every read of the plain status built its tables from every row; the live one did so for its first read and
    # after a rollback moved a key's last round, not more
    assert reads > 20
    assert len(built_whole) - reads <= 3


def test_a_malformed_row_fails_that_read_and_the_next_event_is_shown_right() -> None:
    """A malformed row fails the read that meets it (the web face answers 500 and goes on); the sums it half
    changed are not reused: the next read builds from every row."""
    live = RunStatus()
    good = [{"src": "ps", "dst": "client-0", "kind": "fedavg.train", "phase": "request", "round": 0, "messages": 1,
             "payload_bytes": 10, "message_bytes": 12}]
    live("links", {"rows": good, "rounds": {0: good}})
    assert live.links()["totals"]["payload_bytes"] == 10
    bad = [*good, {"src": "ps", "dst": "client-1", "kind": "fedavg.train", "phase": "request", "round": 1,
                   "messages": 1, "payload_bytes": 5, "message_bytes": 6, "wire_bytes": "many"}]  # fails midway
    live("links", {"rows": bad, "rounds": {1: bad[1:]}})
    with pytest.raises(TypeError):
        live.links()
    fixed = [*good, {k: v for k, v in bad[1].items() if k != "wire_bytes"}]
    live("links", {"rows": fixed, "rounds": {1: fixed[1:]}})
    assert live.links() == reference(fixed)
