"""The web face's connection screen (server/web/serve.py): a client address over its rate gets the Guard's 429
as canned bytes before its request is parsed (a flood's refusals cost the server thread little), and the
Guard's token buckets are the ones the screen reads."""

from __future__ import annotations

import httpx

from fedhop.server.web.guard import RateLimiter
from fedhop.server.web.serve import start_http
from fedhop.server.web.status import RunStatus


class Frozen:
    """A clock that does not move: a bucket emptied stays empty."""

    def __call__(self) -> float:
        return 1000.0


def test_peek_takes_no_token() -> None:
    rates = RateLimiter(rate_per_s=1.0, burst=2, max_clients=8, clock=Frozen())
    assert rates.peek("a") == 0.0 and rates.peek("a") == 0.0
    assert rates.take("a") == 0.0 and rates.take("a") == 0.0
    assert rates.peek("a") == 1.0 and rates.take("a") == 1.0  # empty: both say how long to wait
    assert rates.peek("b") == 0.0  # another address has its own bucket


def test_an_address_over_its_rate_is_refused_before_its_request_is_parsed() -> None:
    server = start_http(RunStatus(), "127.0.0.1", 0)
    try:
        rates = server._app.state.rates  # type: ignore[attr-defined]
        rates._clock = Frozen()  # the bucket does not refill while the test runs
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as c:
            ok = c.get("/api/status")
            assert ok.status_code == 200 and ok.headers.get("server") == "uvicorn"
        while rates.take("127.0.0.1") == 0.0:  # the Guard's bucket for this address, emptied
            pass
        refused = httpx.get(f"http://127.0.0.1:{server.port}/api/status", timeout=10)
        assert refused.status_code == 429
        assert refused.json() == {"error": "too many requests from this address: slow down"}
        assert int(refused.headers["retry-after"]) >= 1
        assert "server" not in refused.headers  # canned by the screen: the app (and h11's parser) never saw it
        assert refused.headers["connection"] == "close"
        stream = httpx.get(f"http://127.0.0.1:{server.port}/api/events", timeout=10)
        assert stream.status_code == 429  # an event stream too: it never opens
    finally:
        server.stop()
