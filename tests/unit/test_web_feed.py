"""The live page's feed (server/web/feed.py) sends the per-link table as the page shows it: the largest links,
their count and the totals, whatever the number of links (a 10,000-client run has ~20,000), and ``/api/links``
(RunStatus.links) keeps all of them."""

from __future__ import annotations

from fedhop.server.web.feed import FEED_LINKS, Cursor, next_message
from fedhop.server.web.status import RunStatus


def rows(clients: int) -> list[dict]:
    out = []
    for i in range(clients):
        c = f"client-{i:04d}"
        out.append({"src": "ps", "dst": c, "kind": "fedavg.train", "phase": "request", "round": 0, "messages": 1,
                    "payload_bytes": 1000 + i, "message_bytes": 1100 + i})
        out.append({"src": c, "dst": "ps", "kind": "fedavg.train", "phase": "reply", "round": 0, "messages": 1,
                    "payload_bytes": 10 * i, "message_bytes": 10 * i + 50})
    return sorted(out, key=lambda r: (r["src"], r["dst"], r["kind"], r["phase"], r["round"]))


def test_the_feed_carries_the_largest_links_their_count_and_the_totals() -> None:
    status, cur = RunStatus(), Cursor()
    meter_rows = rows(400)  # 800 directed links
    status("links", {"rows": meter_rows})
    _, msg = next_message(status, cur)
    sent = msg["links"]
    assert "by_kind" not in sent and sent["links_total"] == 800
    everything = status.links()["links"]
    assert len(everything) == 800 and len(sent["links"]) == FEED_LINKS
    # the largest, in the page's order: from the rows themselves
    by_link = sorted(((r["payload_bytes"], r["message_bytes"], r["src"], r["dst"]) for r in meter_rows),
                     key=lambda x: (-x[0], -x[1], x[2], x[3]))
    assert [(x["payload_bytes"], x["src"], x["dst"]) for x in sent["links"]] == \
        [(p, s, d) for p, _, s, d in by_link[:FEED_LINKS]]
    assert sent["totals"] == {"messages": 800, "payload_bytes": sum(r["payload_bytes"] for r in meter_rows),
                              "message_bytes": sum(r["message_bytes"] for r in meter_rows)}
    _, again = next_message(status, cur)
    assert "links" not in again  # unchanged rows: no table
    status("links", {"rows": rows(3)})
    _, small = next_message(status, cur)
    assert small["links"]["links_total"] == 6 and len(small["links"]["links"]) == 6
