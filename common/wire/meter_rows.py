"""The byte meter's rows as dicts, kept between reads: only the keys that changed since are rebuilt.

:meth:`ByteMeter.rows <fedhop.common.wire.meter.ByteMeter.rows>` is read after every round (the PS's commit: the
``links`` event and the checkpoint). At 10,000 clients a round adds ~5 rows per client, so building every row of
the run again each time grew with rounds x clients (issue 19: seconds per commit after a few rounds). The cache
holds each row's dict under its link (src, dst, kind, phase), in round order, and the links sorted: the meter's
order, (src, dst, kind, phase, round), is then the links' lists one after the other, joined at C speed. A changed
key costs one dict and a bisection in its link's list; each round has a version, bumped when one of its rows
changes, so a checkpoint can write the rounds that changed since the last one and no other
(``common/engine/meter_files.py``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedhop.common.wire.meter import LinkCount, LinkKey

Link = tuple[str, str, str, str]  # src, dst, kind, phase


def row_of(k: LinkKey, c: LinkCount, wire_kind: str) -> dict[str, Any]:
    """The row of one key: what ``ByteMeter.rows`` has always returned for it."""
    row: dict[str, Any] = {"src": k.src, "dst": k.dst, "kind": k.kind, "phase": k.phase, "round": k.round,
                           "messages": c.messages, "payload_bytes": c.payload_bytes, "message_bytes": c.message_bytes}
    if k.kind == wire_kind:
        row.update(wire_bytes=c.wire_bytes, wire_segments=c.wire_segments, wire_retrans=c.wire_retrans)
    return row


class RowCache:
    """Row dicts by link and round, updated from the keys a meter changed (the meter's lock is held by the
    caller of every method). ``built``: rows made so far (a test's count of the work done)."""

    def __init__(self) -> None:
        self._links: dict[Link, tuple[list[int], list[dict[str, Any]]]] = {}  # rounds ascending, their rows
        self._order: list[Link] = []  # the links sorted (rebuilt when a link comes or goes)
        self._order_stale = False
        self._by_round: dict[int, dict[Link, dict[str, Any]]] = {}
        self._version: dict[int, int] = {}  # per round: bumped by each change of one of its rows
        self._clock = 0
        self.built = 0

    def update(self, counts: Mapping[LinkKey, LinkCount], dirty: Iterable[LinkKey], wire_kind: str) -> None:
        """Rebuild the rows of ``dirty`` from ``counts`` (a key no longer counted loses its row)."""
        for k in dirty:
            link = (k.src, k.dst, k.kind, k.phase)
            c = counts.get(k)
            if c is None:
                self._drop(link, k.round)
            else:
                self.built += 1
                self._put(link, k.round, row_of(k, c, wire_kind))

    def replace_round(self, round: int, rows: Iterable[dict[str, Any]]) -> None:
        """Round ``round``'s rows are ``rows`` (kept as they are: dicts of :func:`row_of`'s shape, e.g. another
        process's meter's, ``RoundRows``); its other rows go."""
        new = {(r["src"], r["dst"], r["kind"], r["phase"]): r for r in rows}
        for link in [link for link in self._by_round.get(round, {}) if link not in new]:
            self._drop(link, round)
        for link, row in new.items():
            self._put(link, round, row)

    def _put(self, link: Link, round: int, row: dict[str, Any]) -> None:
        entry = self._links.get(link)
        if entry is None:
            entry = self._links[link] = ([], [])
            self._order_stale = True
        rounds, rows = entry
        i = bisect_left(rounds, round)
        if i < len(rounds) and rounds[i] == round:
            rows[i] = row
        else:
            rounds.insert(i, round)
            rows.insert(i, row)
        self._by_round.setdefault(round, {})[link] = row
        self._bump(round)

    def _drop(self, link: Link, round: int) -> None:
        entry = self._links.get(link)
        if entry is None:
            return
        rounds, rows = entry
        i = bisect_left(rounds, round)
        if not (i < len(rounds) and rounds[i] == round):
            return
        del rounds[i], rows[i]
        del self._by_round[round][link]
        if not rounds:
            del self._links[link]
            self._order_stale = True
        self._bump(round)

    def _bump(self, round: int) -> None:
        self._clock += 1
        self._version[round] = self._clock

    def rows(self) -> list[dict[str, Any]]:
        """Every row, sorted by (src, dst, kind, phase, round)."""
        if self._order_stale:
            self._order, self._order_stale = sorted(self._links), False
        out: list[dict[str, Any]] = []
        for link in self._order:
            out.extend(self._links[link][1])
        return out

    def rows_of_round(self, round: int) -> list[dict[str, Any]]:
        """One round's rows, sorted by link."""
        in_round = self._by_round.get(round, {})
        return [in_round[link] for link in sorted(in_round)]

    def changed_rounds(self, known: Mapping[int, int]) -> dict[int, tuple[int, list[dict[str, Any]]]]:
        """Per round whose version is not the one in ``known``: its version and its rows."""
        return {r: (v, self.rows_of_round(r)) for r, v in self._version.items() if known.get(r) != v}
