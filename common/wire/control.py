"""Control frames: byte-meter rows and missing logs as they travel in Report and Bye frames.

A child reports what its meter and missing log gained since its last report (:class:`ReportCursor`), after
each task, so that rows of a node that dies later are already held by its parent; what remains travels
in its Bye. Report frames are counted on the child -> parent link under the kind :data:`REPORT`, with no
payload, and the session's other control frames (Hello, Welcome, Ready, Bye, keep-alives) under their own
kinds (:data:`SESSION_KINDS`), both ways, by the parent; they exist only in the networked engine
(:data:`CONTROL_KINDS`, which also holds the wire level's kind).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhop.common.wire.meter import WIRE_COUNTS, WIRE_KIND
from fedhop.v1 import fedhop_pb2 as pb

REPORT = "report"
HELLO, WELCOME, READY, BYE, KEEPALIVE = "hello", "welcome", "ready", "bye", "keepalive"
# a session frame's body -> its meter kind (a parent counts every session frame, both ways, under these kinds;
# "ready" is the child's Ready and the parent's start, told apart by src and dst; keep-alives have no body)
SESSION_KINDS: dict[str | None, str] = {None: KEEPALIVE, "hello": HELLO, "welcome": WELCOME, "ready": READY,
                                        "bye": BYE}
# the kinds that exist only over the network: session control frames (no payload, phase "request") and the
# wire level (the kernel's TCP counters, WIRE_KIND rows, phase "tcp")
CONTROL_KINDS = frozenset({REPORT, *SESSION_KINDS.values(), WIRE_KIND})


def session_kind(frame: pb.Frame) -> str | None:
    """The meter kind of a session control frame (Hello, Welcome, Ready, Bye, keep-alive); None for others."""
    return SESSION_KINDS.get(frame.WhichOneof("body"))
_COUNTS = ("messages", "payload_bytes", "message_bytes", *WIRE_COUNTS)


def meter_rows_to_pb(rows: list[dict], target: object) -> None:
    for r in rows:
        target.add(src=r["src"], dst=r["dst"], kind=r["kind"], phase=r["phase"],  # type: ignore[attr-defined]
                   messages=r["messages"], payload_bytes=r["payload_bytes"],
                   message_bytes=r["message_bytes"], round=r["round"],
                   **{c: int(r.get(c, 0)) for c in WIRE_COUNTS})


def meter_rows_from_pb(rows: object) -> list[dict]:
    """Meter rows as :meth:`ByteMeter.rows` gives them (wire counts on wire rows only)."""
    return [{"src": r.src, "dst": r.dst, "kind": r.kind, "phase": r.phase, "round": int(r.round),
             "messages": int(r.messages), "payload_bytes": int(r.payload_bytes),
             "message_bytes": int(r.message_bytes),
             **({c: int(getattr(r, c)) for c in WIRE_COUNTS} if r.kind == WIRE_KIND else {})}
            for r in rows]  # type: ignore[attr-defined]


def timeline_to_pb(rows: list[dict], target: object) -> None:
    """Timing rows (fedhop.common.timeline) into a Report's or Bye's ``timeline`` field."""
    for r in rows:
        target.add(round=int(r["round"]), node=r["node"], peer=r.get("peer", ""),  # type: ignore[attr-defined]
                   phase=r["phase"], seconds=float(r["seconds"]))


def timeline_from_pb(rows: object) -> list[dict]:
    return [{"round": int(r.round), "node": r.node, "peer": r.peer, "phase": r.phase,
             "seconds": float(r.seconds)} for r in rows]  # type: ignore[attr-defined]


def missing_to_pb(entries: list[dict], target: object) -> None:
    for e in entries:
        target.add(round=int(e["round"]), by=e["by"], node=e["node"], task=e["task"],  # type: ignore[attr-defined]
                   reason=e["reason"])


def missing_from_pb(entries: object) -> list[dict]:
    return [{"round": int(e.round), "by": e.by, "node": e.node, "task": e.task, "reason": e.reason}
            for e in entries]  # type: ignore[attr-defined]


def _key(r: dict) -> tuple:
    return r["src"], r["dst"], r["kind"], r["phase"], int(r["round"])


@dataclass
class ReportCursor:
    """What of a node's meter rows and missing log its parent already holds; :meth:`delta` gives the rest."""

    sent: dict[tuple, tuple[int, ...]] = field(default_factory=dict)
    missing_sent: int = 0

    def delta(self, rows: list[dict], missing: list[dict]) -> tuple[list[dict], list[dict]]:
        """Rows (as differences) and missing entries added since the last call; marks them as sent."""
        out = []
        for r in rows:
            k = _key(r)
            now = tuple(int(r.get(c, 0)) for c in _COUNTS)
            before = self.sent.get(k, (0,) * len(_COUNTS))
            if now != before:
                out.append({**r, **{c: a - b for c, a, b in zip(_COUNTS, now, before, strict=True)
                                    if c in r}})
                self.sent[k] = now  # type: ignore[assignment]
        new_missing = missing[self.missing_sent:]
        self.missing_sent = len(missing)
        return out, list(new_missing)


def report_frame(rows: list[dict], missing: list[dict], round_idx: int,
                 timeline: list[dict] | None = None) -> pb.Frame:
    f = pb.Frame()
    f.report.round = round_idx
    meter_rows_to_pb(rows, f.report.meter)
    missing_to_pb(missing, f.report.missing)
    timeline_to_pb(timeline or [], f.report.timeline)
    return f


def bye_frame(reason: str, *, finished: bool, rows: list[dict] | None = None,
              missing: list[dict] | None = None, timeline: list[dict] | None = None) -> pb.Frame:
    f = pb.Frame()
    f.bye.reason = reason
    f.bye.finished = finished
    meter_rows_to_pb(rows or [], f.bye.meter)
    missing_to_pb(missing or [], f.bye.missing)
    timeline_to_pb(timeline or [], f.bye.timeline)
    return f
