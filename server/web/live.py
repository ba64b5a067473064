"""The web face over one run, whichever engine runs it; and ``fedhop simulate`` with it attached.

A :class:`LivePage` is a run's event stream with a RunStatus subscribed to it and, unless the address is
``off``, the live page / JSON API / metrics served on that address: by a child process fed with the same events
(server/web/proc.py; a flood of requests then takes nothing from the run's GIL), or with ``in_thread=True`` by a
server thread of this process reading this RunStatus. Any engine's Run emits into ``page.events``: the PS's
(``fedhop server`` / ``launch``) or the in-process engine's::

    with live_page("127.0.0.1:0") as page:        # or page_from_args(address, token) in a command
        result = simulate(spec, page.events)     # /api/status, /api/rounds, ... follow the run
        ...                                      # still served until the block ends

The web stack (starlette, uvicorn) is imported only when a page is served, the engine only by :func:`simulate`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhop.common.engine.events import RunEvents
from fedhop.server.web.status import RunStatus

if TYPE_CHECKING:  # the engine is imported by simulate, the web stack only when a page is served
    from fedhop.common.engine.inprocess import FaultPlan
    from fedhop.common.engine.results import RunResult
    from fedhop.common.spec import RunSpec
    from fedhop.server.web.proc import WebProcess
    from fedhop.server.web.serve import HttpServer

OFF = "off"


@dataclass
class LivePage:
    """A run's events, the RunStatus they feed, and the web face showing them (None when off): a
    :class:`~fedhop.server.web.proc.WebProcess` (the run's ``--http``) or an in-thread
    :class:`~fedhop.server.web.serve.HttpServer`."""

    events: RunEvents
    status: RunStatus
    http: WebProcess | HttpServer | None

    @property
    def url(self) -> str | None:
        return self.http.url if self.http is not None else None

    def sync(self, timeout_s: float = 10.0) -> bool:
        """Wait until the web face shows every event emitted so far (a child process applies them a moment
        later; in-thread and off: at once). False when it is gone or ``timeout_s`` passed."""
        from fedhop.server.web.proc import WebProcess

        if isinstance(self.http, WebProcess):
            return self.http.sync(timeout_s)
        return True

    def close(self) -> None:
        """Stop serving (the events and the status stay usable)."""
        if self.http is not None:
            self.http.stop()
            self.http = None

    def __enter__(self) -> LivePage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_page(address: str = "127.0.0.1:0", *, token: str | None = None, events: RunEvents | None = None,
              announce: Callable[[str], None] | None = None, in_thread: bool = False) -> LivePage:
    """Subscribe a RunStatus to ``events`` (default: a new stream) and serve the run on ``address``
    (``HOST:PORT``, port 0 = a free one; ``off`` = no server) from a child process fed by ``events``
    (``in_thread``: from a thread of this process reading the RunStatus). ``announce(line)`` gets the page's
    URL. Raises :class:`~fedhop.server.web.serve.HttpConfigError` (a bad address, a missing token) or OSError
    (taken) before anything starts."""
    events = events if events is not None else RunEvents()
    status = RunStatus()
    events.subscribe(status)
    if address == OFF:
        return LivePage(events, status, None)
    from fedhop.server.web.serve import parse_address

    host, port = parse_address(address)
    http: WebProcess | HttpServer
    if in_thread:
        from fedhop.server.web.serve import start_http

        http = start_http(status, host, port, token=token)
    else:
        from fedhop.server.web.proc import start_web_process

        http = start_web_process(host, port, token, events)
    if announce is not None:
        announce(f"live page: {http.url}" + (" (bearer token required)" if token else ""))
    return LivePage(events, status, http)


@contextmanager
def live_page(address: str = "127.0.0.1:0", *, token: str | None = None, events: RunEvents | None = None,
              announce: Callable[[str], None] | None = None, in_thread: bool = False) -> Iterator[LivePage]:
    """:func:`open_page` for the duration of a ``with`` block."""
    page = open_page(address, token=token, events=events, announce=announce, in_thread=in_thread)
    try:
        yield page
    finally:
        page.close()


def simulate(spec: RunSpec, events: RunEvents | None = None, *, device: str | None = None,
             journal: Path | None = None, run_id: str | None = None, faults: FaultPlan | None = None,
             replay: list[dict[str, Any]] | None = None) -> RunResult:
    """``fedhop simulate``'s run: ``spec`` with the in-process engine, its lifecycle events into ``events`` (a
    :class:`LivePage`'s, a progress bar's). ``journal``: the rounds.jsonl file; ``faults``: a test's fault plan;
    ``replay``: a recorded run's rounds, whose ``arrivals`` order its asynchronous collects (``--replay``)."""
    from fedhop.common.engine.inprocess import InProcessEngine

    engine = InProcessEngine(spec, device=device, faults=faults, replay=replay)
    return engine.run(journal, events=events, run_id=run_id)
