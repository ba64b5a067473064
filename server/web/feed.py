"""The live page's feed: for one connected page, what changed in a RunStatus since the page last heard.

The first message carries everything (``reset``); later ones carry the status, new rounds, new route steps,
new missing entries, the per-link table when link rows changed (its largest links: :func:`page_links`), node
states when they changed, and the cumulative bytes of earlier rounds whose value changed (a child's meter rows
can arrive after its round).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedhop.server.web.status import RunStatus

if TYPE_CHECKING:  # guard.py imports starlette, imported only where a page is served
    from fedhop.server.web.guard import CachedStatus


FEED_LINKS = 300  # links a feed message carries, largest first: the page's table shows as many (static/app.js)


def page_links(summary: dict[str, Any]) -> dict[str, Any]:
    """What the page draws of :meth:`RunStatus.links`: the ``FEED_LINKS`` largest links, how many there are
    (``links_total``) and the totals; not ``by_kind`` (the page does not show it). At 10,000 clients the whole
    summary is ~20,000 links and ~50,000 (link, kind, phase) entries, megabytes of JSON to every open page after
    each round; ``/api/links`` still gives all of it."""
    links = summary["links"]
    return {"links": links[:FEED_LINKS], "links_total": len(links), "totals": summary["totals"]}


@dataclass
class Cursor:
    """What one page has been sent."""

    sent_any: bool = False
    spec_sent: bool = False
    rounds: int = 0
    route: int = 0
    missing: int = 0
    links_version: int = -1
    nodes_version: int = -1
    cumulative: list[tuple[int, int]] = field(default_factory=list)


def next_message(status: RunStatus | CachedStatus, cur: Cursor) -> tuple[int, dict[str, Any]]:
    """(version, message) for the page behind ``cur``; advances ``cur``. ``version`` is read first, so an event
    that lands while the message is built makes the next wait return at once."""
    v = status.versions()
    # a cached view (guard.CachedStatus) gives a status at least as new as the version read above
    st = status.status_at_least(v["all"]) if not isinstance(status, RunStatus) else status.status()
    if cur.spec_sent:
        st.pop("spec")  # sent once
    cur.spec_sent = st.get("spec") is not None
    msg: dict[str, Any] = {"reset": not cur.sent_any, "version": v["all"], "status": st}
    rounds = status.rounds(cur.rounds)
    cur.rounds += len(rounds)
    msg["rounds"] = rounds
    route = status.route(cur.route)
    cur.route += len(route)
    msg["route"] = route
    missing = status.missing(cur.missing)
    cur.missing += len(missing)
    msg["missing"] = missing
    known = cur.cumulative + [(r["payload_bytes"], r["message_bytes"]) for r in rounds]
    if v["links"] != cur.links_version:
        msg["links"] = page_links(status.links())
        cur.links_version = v["links"]
        now = status.cumulative_bytes()[:len(known)]
        first = next((i for i, (a, b) in enumerate(zip(now, known, strict=True)) if a != b), None)
        if first is not None:
            msg["cumulative"] = {"from": first, "payload_bytes": [c[0] for c in now[first:]],
                                 "message_bytes": [c[1] for c in now[first:]]}
        known = now
    cur.cumulative = known
    if v["nodes"] != cur.nodes_version:
        msg["topology"] = status.topology()
        cur.nodes_version = v["nodes"]
    cur.sent_any = True
    return v["all"], msg
