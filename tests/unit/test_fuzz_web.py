"""Property-based fuzzing of the web face's HTTP API (hypothesis), in process through Starlette's TestClient (no
sockets): every route with random query strings (valid and invalid ``since`` / ``rows`` / ``token``, repeated
and unknown keys, percent-encoded bytes), and random paths under ``/api/``, ``/static/`` and ``/``, with and
without a bearer token. Every answer must be below 500, a 4xx must carry a JSON ``{"error": ...}``, and a 200 from
a JSON route must be JSON.

CI runs ``FEDHOP_FUZZ_EXAMPLES`` (default 50: the unit tier's time budget) examples per property and app (open,
with a token); ``make fuzz`` runs many more.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import urllib.parse

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from fedhop.server.web.app import create_app
from fedhop.server.web.guard import WebLimits
from fedhop.server.web.status import RunStatus
from tests.unit.test_fedchs import spec as fedchs_spec

EXAMPLES = int(os.environ.get("FEDHOP_FUZZ_EXAMPLES", "50"))
FUZZ = settings(max_examples=EXAMPLES, deadline=dt.timedelta(seconds=10), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
ROUTES = ("/api/status", "/api/rounds", "/api/links", "/api/topology", "/api/missing", "/api/timeline",
          "/api/events", "/metrics", "/")
JSON_ROUTES = {r for r in ROUTES if r.startswith("/api/")}
KEYS = ("since", "rows", "token", "x", "", "since[]", "SINCE")
TOKEN = "fuzz-token-0123456789abcdef"
NO_LIMITS = WebLimits(rate_per_s=1e9, burst=10**9, max_streams=10**6)


def _status() -> RunStatus:
    status = RunStatus()
    status("run_started", {"run_id": "r-1", "spec": fedchs_spec(clients=4, edges=2, rounds=3), "nodes": None,
                           "resumed_at": 0})
    for t in range(2):
        status("round_started", {"round": t})
        status("round_ended", {"round": t, "duration_s": 1.0,
                               "record": {"round": t + 1, "edge": "edge-0", "accuracy": 0.5, "loss": 1.0}})
    status("links", {"rows": [{"src": "ps", "dst": "edge-0", "kind": "fedchs.round", "phase": "request",
                               "round": 0, "messages": 1, "payload_bytes": 10, "message_bytes": 20}]})
    status("missing", {"entry": {"round": 1, "node": "client-1", "reason": "late"}})
    return status


@pytest.fixture(scope="module", params=[None, TOKEN], ids=["open", "token"])
def api(request: pytest.FixtureRequest):
    app = create_app(_status(), token=request.param, limits=NO_LIMITS)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=True) as client:
        app.state.notifier.closing = True  # an event stream sends the state once and ends (not endless)
        yield client, request.param


values = st.one_of(st.text(max_size=30), st.integers(-10**12, 10**12).map(str), st.sampled_from(
    ["0", "1", "01", "-0", "1e3", "²", "٣", " 1", "1 ", "0x1", "9" * 9, "9" * 10, "9" * 5000, "", TOKEN]))
queries = st.lists(st.tuples(st.sampled_from(KEYS) | st.text(max_size=10), values), max_size=4)
raw_queries = st.text(st.characters(codec="ascii"), max_size=200)


def check(resp, route: str) -> None:
    assert resp.status_code < 500, (route, resp.status_code, resp.text[:200])
    event(f"status {resp.status_code}")
    if resp.status_code >= 400:
        assert "error" in resp.json(), (route, resp.status_code, resp.text[:200])
    elif resp.status_code == 200 and route in JSON_ROUTES and route != "/api/events":
        json.loads(resp.text)


@FUZZ
@given(route=st.sampled_from(ROUTES), query=queries, authed=st.booleans())
def test_every_route_takes_any_query(api, route: str, query: list[tuple[str, str]], authed: bool) -> None:
    client, token = api
    headers = {"Authorization": f"Bearer {token}"} if token and authed else {}
    url = route + ("?" + urllib.parse.urlencode(query) if query else "")
    check(client.get(url, headers=headers), route)


@FUZZ
@given(route=st.sampled_from(ROUTES), query=raw_queries)
def test_every_route_takes_raw_query_strings(api, route: str, query: str) -> None:
    client, token = api
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    check(client.get(route + "?" + urllib.parse.quote(query, safe="=&%+;"), headers=headers), route)


@FUZZ
@given(prefix=st.sampled_from(["/api/", "/static/", "/", "/api/status/", "/metrics/"]),
       rest=st.text(max_size=40), method=st.sampled_from(["GET", "HEAD", "POST", "DELETE", "OPTIONS"]))
def test_any_path_and_method_is_a_clean_4xx_or_200(api, prefix: str, rest: str, method: str) -> None:
    client, token = api
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    path = prefix + urllib.parse.quote(rest, safe="/.")
    resp = client.request(method, path, headers=headers)
    assert resp.status_code < 500, (path, method, resp.status_code)
    event(f"status {resp.status_code}")
    if resp.status_code >= 400 and method != "HEAD":
        assert "error" in resp.json(), (path, method, resp.status_code, resp.text[:200])
