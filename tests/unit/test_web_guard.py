"""The web face's bounds (server/web/guard.py), in process through Starlette's TestClient (no sockets): rates per
client address (429 + Retry-After), URL and body sizes (414 / 413), the cap on open event streams (503), slow
stream readers dropped, reads of the RunStatus cached, JSON errors everywhere, the token kept out of --help,
and the one line per node that says a run is on plaintext."""

from __future__ import annotations

import argparse
import asyncio
import logging

import pytest
from starlette.testclient import TestClient

from fedhop.cli.console import HelpFormatter
from fedhop.server.web.app import create_app
from fedhop.server.web.cli import TOKEN_ENV, add_http_args, token_of
from fedhop.server.web.guard import CachedStatus, Guard, RateLimiter, ResponseCache, WebLimits
from fedhop.server.web.status import RunStatus
from tests.unit.test_fedchs import spec as fedchs_spec

BASE = "http://127.0.0.1"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def started(status: RunStatus) -> RunStatus:
    status("run_started", {"run_id": "r-1", "spec": fedchs_spec(clients=4, edges=2, rounds=3), "nodes": None,
                           "resumed_at": 0})
    status("round_started", {"round": 0})
    status("round_ended", {"round": 0, "duration_s": 1.0, "record": {"round": 1, "accuracy": 0.5, "loss": 1.0}})
    return status


def client(limits: WebLimits | None, status: RunStatus | None = None) -> TestClient:
    return TestClient(create_app(status or started(RunStatus()), limits=limits), base_url=BASE)


def test_rate_limiter_is_a_token_bucket_per_address() -> None:
    clock = Clock()
    rl = RateLimiter(rate_per_s=2.0, burst=3, max_clients=2, clock=clock)
    assert [rl.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rl.take("a") == pytest.approx(0.5)  # empty: one token in 0.5 s
    assert rl.take("b") == 0.0  # another address has its own bucket
    clock.t += 0.5
    assert rl.take("a") == 0.0 and rl.take("a") > 0
    rl.take("c")  # a third address: the least recent ("b") is forgotten, "a" kept
    assert set(rl._buckets) == {"a", "c"}


def test_flood_from_one_address_gets_429_with_retry_after() -> None:
    with client(WebLimits(rate_per_s=0.01, burst=3)) as c:
        assert [c.get("/api/status").status_code for _ in range(3)] == [200, 200, 200]
        r = c.get("/api/status")
        assert r.status_code == 429 and r.json()["error"].startswith("too many requests")
        assert int(r.headers["retry-after"]) >= 99


def test_long_urls_and_request_bodies_are_refused() -> None:
    with client(WebLimits(max_url_bytes=200, max_body_bytes=10)) as c:
        r = c.get("/api/rounds?since=1&" + "x" * 300)
        assert r.status_code == 414 and "longer than 200" in r.json()["error"]
        r = c.request("GET", "/api/status", content=b"y" * 11)
        assert r.status_code == 413 and "limited to 10 bytes" in r.json()["error"]
        assert c.request("GET", "/api/status", content=b"y" * 10).status_code == 200


def test_errors_are_json_never_500() -> None:
    with client(WebLimits()) as c:
        for path, code in (("/api/nope", 404), ("/api/rounds?since=-1", 400), ("/api/rounds?since=%C2%B2", 400),
                           ("/api/missing?since=" + "9" * 3000, 400), ("/static/../app.py", 404)):
            r = c.get(path)
            assert r.status_code == code and "error" in r.json(), path[:60]
        r = c.post("/api/status")
        assert r.status_code == 405 and "error" in r.json()


def test_event_streams_beyond_the_cap_get_503() -> None:
    with client(WebLimits(max_streams=0)) as c:
        r = c.get("/api/events")
        assert r.status_code == 503 and "event streams are open" in r.json()["error"]
        assert int(r.headers["retry-after"]) >= 1


def _scope(path: str, root_path: str = "") -> dict:
    return {"type": "http", "path": root_path + path, "raw_path": (root_path + path).encode(), "query_string": b"",
            "headers": [], "client": ("127.0.0.1", 5000), "method": "GET", "root_path": root_path}


def test_stream_cap_counts_open_streams_and_frees_them() -> None:
    async def scenario() -> tuple[list[int], int, list[int]]:
        release = asyncio.Event()

        async def endless(scope, receive, send) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await release.wait()

        guard = Guard(endless, WebLimits(max_streams=2))

        async def one() -> int:
            codes: list[int] = []

            async def send(message) -> None:
                if message["type"] == "http.response.start":
                    codes.append(message["status"])

            async def receive() -> dict:
                return {"type": "http.request", "body": b""}
            await guard(_scope("/api/events", "/runs/r-1"), receive, send)  # mounted under a prefix, as in ui
            return codes[0]

        first = [asyncio.create_task(one()) for _ in range(2)]
        while guard.open_streams < 2:
            await asyncio.sleep(0)
        third = await one()  # while two are open
        release.set()
        opened = list(await asyncio.gather(*first))
        assert guard.open_streams == 0
        later = list(await asyncio.wait_for(asyncio.gather(one(), one()), 5))  # the cap was freed
        return opened, third, later

    assert asyncio.run(scenario()) == ([200, 200], 503, [200, 200])


def test_a_reader_that_stops_reading_is_dropped() -> None:
    async def scenario() -> tuple[int, int]:
        sent = 0

        async def chatty(scope, receive, send) -> None:
            nonlocal sent
            await send({"type": "http.response.start", "status": 200, "headers": []})
            while True:
                await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
                sent += 1

        async def stuck_send(message) -> None:
            if message["type"] == "http.response.body" and sent >= 3:
                await asyncio.Event().wait()  # the reader's socket buffer is full, forever

        async def receive() -> dict:
            return {"type": "http.request", "body": b""}
        guard = Guard(chatty, WebLimits(stream_send_timeout_s=0.05))
        await asyncio.wait_for(guard(_scope("/api/events"), receive, stuck_send), 5)
        return sent, guard.open_streams

    assert asyncio.run(scenario()) == (3, 0)  # nothing buffered beyond the blocked write; the slot is freed


def test_status_is_computed_at_most_every_max_age() -> None:
    """Between two events the status is computed once per max age however often it is read; an event makes the
    next read compute it again (a request after an event sees it)."""
    clock = Clock()
    raw = started(RunStatus(clock=clock))
    view = CachedStatus(raw, 0.25, clock=clock)
    first = view.status()
    for _ in range(100):
        assert view.status() == first
    assert view.computed == 1
    raw("round_started", {"round": 1})
    assert view.status()["round"] == 2  # the event is seen at once
    assert view.computed == 2
    for _ in range(100):
        view.status()
    assert view.computed == 2
    assert view.status_at_least(raw.version)["round"] == 2
    assert view.computed == 2
    clock.t += 0.3
    view.status()
    assert view.computed == 3  # older than max age: computed again (elapsed moves even without events)
    view.links(), view.links(), view.topology(), view.topology()
    assert view.computed == 5
    raw("node_joined", {"node": "client-0", "role": "client"})
    assert view.topology()["nodes"]["client-0"]["state"] == "joined"  # changed: computed again
    assert view.computed == 6
    view.topology(), view.topology()
    assert view.computed == 6


def test_response_bodies_are_shared_for_max_age() -> None:
    clock = Clock()
    cache = ResponseCache(0.25, size=2, clock=clock)
    calls: list[int] = []

    def render() -> bytes:
        calls.append(1)
        return b"x"
    for _ in range(10):
        cache.get(("/a", b""), render)
    assert len(calls) == 1
    clock.t += 0.3
    cache.get(("/a", b""), render)
    cache.get(("/b", b""), render)
    cache.get(("/c", b""), render)
    assert len(calls) == 4 and len(cache._bodies) == 2


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="stream_interval_s"):
        WebLimits(stream_interval_s=0.1, status_cache_s=0.2)
    with pytest.raises(ValueError, match="positive"):
        WebLimits(rate_per_s=0)


def test_help_does_not_print_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "never-shown-0123456789abcdef"
    monkeypatch.setenv(TOKEN_ENV, secret)
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    add_http_args(p, default="127.0.0.1:0")
    assert secret not in p.format_help() and f"${TOKEN_ENV}" in p.format_help()
    assert token_of(p.parse_args([]).http_token) == secret  # still the default where the page is served
    assert token_of("given-0123456789abcdef") == "given-0123456789abcdef"
    monkeypatch.delenv(TOKEN_ENV)
    assert token_of(None) is None


def test_a_plaintext_node_says_so_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    from fedhop.cli.security import SecurityArgs, security_for

    with caplog.at_level(logging.INFO):
        for node in ("ps", "edge-0", "client-3"):
            assert security_for(SecurityArgs(), node, None).plaintext
    lines = [r.getMessage() for r in caplog.records if "plaintext" in r.getMessage()]
    assert lines == [f"{n}: links: insecure (plaintext, no peer authentication)" for n in ("ps", "edge-0", "client-3")]
