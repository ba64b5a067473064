"""``fedhop ui``: the live page's web face over a folder of runs (issue 18), read from the run folders' files.

Routes:
    /                     the run list, and the runs ticked there overlaid (accuracy or another metric vs round,
                          vs cumulative payload bytes and vs wall-clock: what ``fedhop compare`` draws)
    /api/runs             every run (``fedhop ls --json``'s objects, plus ``page``: the run's page, relative)
    /api/curves?run=NAME  each named run's round records (repeat ``run``): the overlay's data
    /runs/NAME/           the run's live page, the same page a PS serves, with the same /api routes
                          (/runs/NAME/api/status, /api/rounds, /api/links, /api/topology, /api/missing,
                          /api/timeline, /api/events, /metrics) answered from the folder

A run's page is a :class:`FolderStatus`: the RunStatus the PS would have, rebuilt by replaying the folder's
files as the run's events (``run_started`` with its spec, a ``round_ended`` per round record, the meter rows,
the missing log, the timeline, ``run_finished``). It is rebuilt whenever those files change, and its event
stream polls them every :data:`POLL_S` seconds, so the page of a run still being written (``rounds.jsonl``)
follows it; while the run's process is alive, the page and the list also link to the PS's own live page
(``live.json``'s URL: every byte of it, live).

Bound to loopback only loopback Host headers are accepted; elsewhere a bearer token is required (as for the
PS's face: ``app.py``'s middleware).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import uvicorn
from anyio import to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from fedhop.browse import RunFolder, RunInfo, RunNotFound, files_signature, find_runs, read_folder
from fedhop.server.web.app import KEEPALIVE_S, create_app, web_middleware
from fedhop.server.web.feed import Cursor, next_message
from fedhop.server.web.serve import check_token, is_loopback, parse_address
from fedhop.server.web.status import RunStatus

log = logging.getLogger("fedhop.ui")

POLL_S = 1.0  # how often a run page's stream looks at its folder
RECHECK_S = 5.0  # a running run's view is rebuilt at least this often (its process may have died)
LIST_TTL_S = 2.0  # the run names are looked up again after this long
ROUTE_PATH = "/runs"


class FolderStatus(RunStatus):
    """The RunStatus of a run rebuilt from its folder; :meth:`status` adds where it comes from (``source``:
    ``folder``, the run's ``folder`` name, ``live_url``: its PS's page while it runs, ``home``: the run list)
    and the folder's status as the phase once the run is over (``interrupted`` included)."""

    def __init__(self, run: RunFolder, home: str = "../../") -> None:
        self._t = 0.0
        super().__init__(clock=lambda: self._t)
        self.run = run
        self.home = home
        replay(self, run)

    def set_clock(self, t: float) -> None:
        self._t = float(t)

    def status(self) -> dict[str, Any]:
        st = super().status()
        info = self.run.info
        st.update(source="folder", folder=info.name, live_url=info.url, home=self.home,
                  run_id=st["run_id"] or info.run_id or info.name)
        if info.status != "running":
            st["phase"] = info.status
        if st["spec"] is None:  # a spec this fedhop cannot read, or none yet: what the folder says
            st.update(name=info.spec_name or info.name, algorithm=info.algorithm,
                      rounds_total=info.rounds_total or st["rounds_total"])
        return st


def replay(status: FolderStatus, run: RunFolder) -> None:
    """Feed ``status`` the events the run's files stand for (see the module docstring)."""
    try:
        if run.spec is not None:
            status("run_started", {"run_id": run.info.run_id or run.info.name, "spec": run.spec, "nodes": None,
                                   "resumed_at": 0})
    except (ValueError, KeyError, TypeError) as e:  # a spec this fedhop cannot read (pydantic's error: ValueError)
        log.warning("%s: its spec cannot be read (%s); the page shows the rounds only", run.info.path,
                    str(e).splitlines()[0])
    topo = status.topology()
    for node, about in topo["nodes"].items():
        if node != topo["server"]:
            status("node_joined", {"node": node, "role": about.get("role")})
    for rec in sorted(run.rounds, key=lambda r: int(r["round"])):
        t = int(rec["round"]) - 1
        elapsed, took = float(rec.get("elapsed_s") or 0.0), float(rec.get("round_s") or 0.0)
        status.set_clock(max(0.0, elapsed - took))
        status("round_started", {"round": t})
        status.set_clock(elapsed)
        record = {k: v for k, v in rec.items() if not k.startswith("cum_")}
        status("round_ended", {"round": t, "record": record, "duration_s": took})
    if run.links:  # the files number rounds from 1 (0 = set-up and tear-down); the meter from 0 (-1)
        status("links", {"rows": [{**r, "round": int(r["round"]) - 1} for r in run.links]})
    for entry in run.missing:
        status("missing", {"entry": entry})
    by_round: dict[int, list[dict[str, Any]]] = {}
    for row in run.timeline:
        by_round.setdefault(int(row["round"]) - 1, []).append({**row, "round": int(row["round"]) - 1})
    for t, rows in sorted(by_round.items()):
        status("round_timeline", {"round": t, "rows": rows})
    info = run.info
    if info.status != "running":
        if info.duration_s is not None:
            status.set_clock(info.duration_s)
        status("run_finished", {"ok": info.status != "failed", "wall_s": info.duration_s, "error": info.error})


@dataclass
class RunView:
    """One run's page: its files' signature when read, the status replayed from them, the app serving it."""

    run: RunFolder
    status: FolderStatus
    app: Starlette
    signature: tuple[Any, ...]
    read_at: float


@dataclass
class RunViews:
    """The runs under ``root`` by name, each view rebuilt when its files change (thread-safe)."""

    root: Path
    _views: dict[str, RunView] = field(default_factory=dict)
    _infos: dict[str, tuple[tuple[Any, ...], float, RunInfo]] = field(default_factory=dict)
    _names: tuple[float, dict[str, Path]] = (0.0, {})
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def names(self) -> dict[str, Path]:
        with self._lock:
            at, names = self._names
            if time.monotonic() - at < LIST_TTL_S:
                return names
        found = {self._name(f): f for f in find_runs(self.root)}
        with self._lock:
            self._names = (time.monotonic(), found)
        return found

    def infos(self) -> list[RunInfo]:
        """Every run's ``ls`` line, oldest first (as :func:`~fedhop.browse.list_runs`), a folder read again only
        when its files changed (or, running, every :data:`RECHECK_S`): the list page asks every few seconds."""
        if not self.root.is_dir():
            raise RunNotFound(f"{self.root} is not a folder of runs")
        out = []
        for name, folder in self.names().items():
            sig = files_signature(folder)
            with self._lock:
                hit = self._infos.get(name)
            if hit is not None and hit[0] == sig and (
                    hit[2].status != "running" or time.monotonic() - hit[1] < RECHECK_S):
                out.append(hit[2])
                continue
            try:
                info = read_folder(folder, self.root).info
            except RunNotFound:  # removed meanwhile
                continue
            with self._lock:
                self._infos[name] = (sig, time.monotonic(), info)
            out.append(info)
        return sorted(out, key=lambda i: (i.started if i.started is not None else math.inf, i.name))

    def _name(self, folder: Path) -> str:
        rel = folder.resolve().relative_to(self.root.resolve()).as_posix()
        return folder.name if rel == "." else rel

    def split(self, rel: str) -> tuple[str | None, str]:
        """``/NAME/rest`` -> (NAME, ``/rest``) for the longest run name it starts with; (None, rel) if none."""
        names = self.names()
        for name in sorted(names, key=len, reverse=True):
            head = f"/{name}"
            if rel == head or rel.startswith(head + "/"):
                return name, rel[len(head):]
        return None, rel

    def get(self, name: str) -> RunView:
        folder = self.names().get(name)
        if folder is None:
            raise RunNotFound(f"no run {name!r} under {self.root}")
        sig = files_signature(folder)
        with self._lock:
            view = self._views.get(name)
        if view is not None and view.signature == sig and (
                view.run.info.status != "running" or time.monotonic() - view.read_at < RECHECK_S):
            return view
        run = read_folder(folder, self.root)
        status = FolderStatus(run, home="../" * (name.count("/") + 2))  # from /runs/NAME/ back to the list
        view = RunView(run, status, create_app(status, loopback=False), sig, time.monotonic())
        with self._lock:
            self._views[name] = view
        return view


def curves(view: RunView) -> dict[str, Any]:
    """A run's round records for the overlay: numeric metrics, ``payload_bytes`` (cumulative) and ``elapsed_s``."""
    rows = []
    for r in view.run.rounds:
        row = {k: v for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if "cum_payload_bytes" in row:
            row["payload_bytes"] = row.pop("cum_payload_bytes")
        row.pop("cum_message_bytes", None)
        rows.append(row)
    info = view.run.info
    return {"name": info.name, "algorithm": info.algorithm, "status": info.status, "rounds": rows}


class RunPages:
    """ASGI app under ``/runs``: ``/runs/NAME/...`` is run NAME's page and API (its event stream polls the
    folder); ``/runs/NAME`` redirects to ``/runs/NAME/`` (the page's links are relative)."""

    def __init__(self, views: RunViews, closing: threading.Event, poll_s: float) -> None:
        self.views, self.closing, self.poll_s = views, closing, poll_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        root_path = scope.get("root_path", "")
        path = scope["path"]
        rel = path[len(root_path):] if path.startswith(root_path) else path
        name, sub = await to_thread.run_sync(self.views.split, rel)
        response: Response | None = None
        if name is None:
            response = JSONResponse({"error": f"no run {rel.strip('/')!r} under {self.views.root}"}, status_code=404)
        elif sub == "":
            response = RedirectResponse(path + "/" + (f"?{scope['query_string'].decode()}"
                                                      if scope.get("query_string") else ""), status_code=307)
        if response is not None:
            await response(scope, receive, send)
            return
        assert name is not None
        try:
            view = await to_thread.run_sync(self.views.get, name)
        except RunNotFound as e:
            await JSONResponse({"error": str(e)}, status_code=404)(scope, receive, send)
            return
        if sub == "/api/events":
            await self.events(name)(scope, receive, send)
            return
        await view.app(dict(scope, root_path=f"{root_path}/{name}"), receive, send)

    def events(self, name: str) -> Response:
        """The page's server-sent events: the whole state first, again whenever the folder changed."""
        async def stream() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            sent: tuple[Any, ...] | None = None
            quiet_since = time.monotonic()
            n = 0
            while not self.closing.is_set():
                try:
                    view = await to_thread.run_sync(self.views.get, name)
                except RunNotFound:
                    return
                key = (view.signature, view.run.info.status)
                if key != sent:
                    sent = key
                    n += 1
                    _, msg = next_message(view.status, Cursor())
                    yield f"id: {n}\nevent: update\ndata: {json.dumps(msg)}\n\n"
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                    yield ": keep-alive\n\n"
                    quiet_since = time.monotonic()
                await asyncio.sleep(self.poll_s)
        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def create_ui_app(root: Path, *, token: str | None = None, loopback: bool = True,
                  poll_s: float = POLL_S) -> Starlette:
    """The ASGI app of ``fedhop ui`` over the runs under ``root``. ``token``: require it on every route;
    ``loopback``: accept only loopback Host headers. ``app.state.closing``: set it to end the event streams."""
    root = Path(root)
    views = RunViews(root)
    closing = threading.Event()
    static = resources.files("fedhop.server.web") / "static"
    runs_html = (static / "runs.html").read_text(encoding="utf-8")

    async def index(request: Request) -> Response:
        return HTMLResponse(runs_html, headers={"Cache-Control": "no-store"})

    async def api_runs(request: Request) -> Response:
        try:
            infos = await to_thread.run_sync(views.infos)
        except RunNotFound as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        return JSONResponse({"root": str(root), "runs": [
            {**i.to_json(), "page": f"runs/{i.name}/"} for i in infos]})

    async def api_curves(request: Request) -> Response:
        names = request.query_params.getlist("run")
        out = []
        for name in names:
            try:
                view = await to_thread.run_sync(views.get, name)
            except RunNotFound as e:
                return JSONResponse({"error": str(e)}, status_code=404)
            out.append(curves(view))
        return JSONResponse({"runs": out})

    async def to_list(request: Request) -> Response:
        return RedirectResponse("/", status_code=307)

    app = Starlette(routes=[
        Route("/", index),
        Route("/api/runs", api_runs),
        Route("/api/curves", api_curves),
        Route(ROUTE_PATH, to_list),
        Mount(ROUTE_PATH, app=RunPages(views, closing, poll_s)),
        Mount("/static", StaticFiles(packages=[("fedhop.server.web", "static")]), name="static"),
    ], middleware=web_middleware(None, loopback, token))
    app.state.closing = closing
    app.state.views = views
    return app


class _Server(uvicorn.Server):
    """uvicorn's server that also ends the run pages' event streams on Ctrl-C / SIGTERM (else shutting down
    waits for them)."""

    def __init__(self, config: uvicorn.Config, closing: threading.Event) -> None:
        super().__init__(config)
        self.closing = closing

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.closing.set()
        super().handle_exit(sig, frame)


@dataclass
class UiServer:
    """A running ``fedhop ui`` (in a thread; :func:`start_ui`): its URL and how to stop it."""

    url: str
    _server: uvicorn.Server
    _thread: threading.Thread
    _app: Starlette

    def stop(self, timeout_s: float = 5.0) -> None:
        self._app.state.closing.set()
        self._server.should_exit = True
        self._thread.join(timeout_s)


def _bind(address: str, token: str | None) -> tuple[socket.socket, str, int]:
    host, port = parse_address(address)
    check_token(host, token)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot serve the run browser on {host}:{port}: {e.strerror}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock, host, int(sock.getsockname()[1])


def _server(root: Path, sock: socket.socket, host: str, port: int, token: str | None,
            poll_s: float) -> tuple[uvicorn.Server, Starlette, str]:
    app = create_ui_app(root, token=token, loopback=is_loopback(host), poll_s=poll_s)
    config = uvicorn.Config(app, host=host, port=port, loop="asyncio", http="h11", ws="none", lifespan="off",
                            log_config=None, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    shown = socket.gethostname() if host in ("0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    return _Server(config, app.state.closing), app, f"http://{shown}:{port}/"


def start_ui(root: Path, address: str = "127.0.0.1:0", *, token: str | None = None,
             poll_s: float = POLL_S) -> UiServer:
    """Serve ``fedhop ui`` over ``root`` on ``address`` in a daemon thread; returns once it answers."""
    sock, host, port = _bind(address, token)
    server, app, url = _server(Path(root), sock, host, port, token, poll_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="fedhop-ui", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"fedhop ui on {host}:{port} did not start")
        thread.join(0.01)
    return UiServer(url, server, thread, app)


def serve_forever(root: Path, address: str, *, token: str | None = None,
                  announce: Callable[[str], None] | None = None) -> None:
    """``fedhop ui``: serve in the foreground until Ctrl-C (or SIGTERM)."""
    sock, host, port = _bind(address, token)
    server, app, url = _server(Path(root), sock, host, port, token, POLL_S)
    interrupted: list[int] = []

    def on_sigint(sig: int, frame: object) -> None:  # before uvicorn takes the signal over, and after it gives it back
        interrupted.append(sig)
        server.should_exit = True

    previous = signal.signal(signal.SIGINT, on_sigint) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        if announce is not None:
            announce(f"serving the runs under {root} on {url}" + (" (bearer token required: open "
                                                                   f"{url}?token=TOKEN once)" if token else ""))
        server.run(sockets=[sock])
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        app.state.closing.set()
        with contextlib.suppress(OSError):
            sock.close()
    if interrupted:  # Ctrl-C, whenever it came: the command ends as interrupted (exit 130), not as done
        raise KeyboardInterrupt
