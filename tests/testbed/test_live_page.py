"""The live page in a real headless Chromium (Debian's chromium + chromium-driver, driven by selenium).

The page is loaded before a run starts and never reloaded: the test holds the run after its second round
(a listener waits on an event the test controls), checks that the page shows that round, lets the run finish,
and checks that the numbers shown match the run folder's results.json. Screenshots go into the run folder.

Installs chromium and chromium-driver with apt-get when they are missing (root). Run by ``make
test-testbed`` (or ``python -m pytest tests/testbed/test_live_page.py``).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.inprocess import FaultPlan
from fedhop.common.engine.results import write_run_folder
from fedhop.server.web.serve import start_http
from fedhop.server.web.status import RunStatus
from tests.live_run import run_with_events
from tests.unit.test_fedchs import spec as fedchs_spec

WAIT_S = 60


def shown(drv: webdriver.Chrome, element_id: str) -> str:
    return drv.find_element(By.ID, element_id).text


def wait_text(drv: webdriver.Chrome, element_id: str, want: str) -> None:
    WebDriverWait(drv, WAIT_S).until(lambda d: shown(d, element_id) == want,
                                     f"#{element_id} never showed {want!r}")


def as_int(text: str) -> int:
    return int(text.replace(",", ""))


def test_live_page_follows_a_run_and_ends_at_its_results(browser: webdriver.Chrome, tmp_path: Path) -> None:
    spec = fedchs_spec({"K": 2}, clients=6, edges=3, rounds=4)
    faults = FaultPlan(lambda node, task, rnd: node in ("client-0", "client-2", "client-4") and rnd == 1)
    run_dir = tmp_path / "run"
    status, events = RunStatus(), RunEvents()
    events.subscribe(status)
    reached, release = threading.Event(), threading.Event()

    def hold_before_round_3(kind: str, data: dict[str, Any]) -> None:
        if kind == "round_started" and data["round"] == 2:
            reached.set()
            release.wait(WAIT_S * 2)

    events.subscribe(hold_before_round_3)
    server = start_http(status, "127.0.0.1", 0)
    out: dict[str, Any] = {}
    run = threading.Thread(target=lambda: out.update(result=run_with_events(spec, events, faults=faults)))
    try:
        browser.get(server.url)
        wait_text(browser, "conn", "live")
        assert shown(browser, "phase") == "waiting"
        run.start()
        assert reached.wait(WAIT_S), "the run never reached round 3"

        # held after two rounds: the page (never reloaded) shows them
        wait_text(browser, "round", "3 / 4")
        assert shown(browser, "phase") == "running" and shown(browser, "nodes") == "9 / 9"
        assert (shown(browser, "run-name"), shown(browser, "run-algorithm")) == (spec.name, "fedchs")
        held_accuracy = shown(browser, "last-accuracy")
        run_dir.mkdir(parents=True)
        browser.save_screenshot(str(run_dir / "live_page_running.png"))
        release.set()
        run.join(WAIT_S * 2)
        assert "result" in out, "the run did not finish"
        write_run_folder(out["result"], run_dir)

        wait_text(browser, "phase", "finished")
        results = json.loads((run_dir / "results.json").read_text())
        rounds = results["rounds"]
        assert held_accuracy == f"{rounds[1]['accuracy']:.4f}"
        assert shown(browser, "round") == "4 / 4"
        assert shown(browser, "last-accuracy") == f"{rounds[-1]['accuracy']:.4f}"
        assert shown(browser, "last-loss") == f"{rounds[-1]['loss']:.4f}"
        assert as_int(shown(browser, "total-payload")) == results["totals"]["payload_bytes"]
        assert as_int(shown(browser, "total-message")) == results["totals"]["message_bytes"]

        per_link: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for r in results["links"]:
            acc = per_link[f"{r['src']}>{r['dst']}"]
            acc[0] += r["payload_bytes"]
            acc[1] += r["message_bytes"]
            acc[2] += r["messages"]
        table = {}
        for tr in browser.find_elements(By.CSS_SELECTOR, "#links-body tr"):
            cells = {c: tr.find_element(By.CSS_SELECTOR, f"td.{c}").text for c in ("payload", "message", "messages")}
            table[tr.get_attribute("data-link")] = [as_int(cells["payload"]), as_int(cells["message"]),
                                                    as_int(cells["messages"])]
        assert table == dict(per_link)
        payload_col = [v[0] for v in table.values()]
        assert payload_col == sorted(payload_col, reverse=True)  # largest links first, as the table says

        route = shown(browser, "route")
        for r in rounds:
            assert f"r{r['round']}: {r['edge']}" in route
        assert results["missing"], "the fault plan must have produced missing entries"
        missed = {m["node"] for m in results["missing"]}
        marked = {c.get_attribute("data-node") for c in
                  browser.find_elements(By.CSS_SELECTOR, "#topology circle.missed")}
        assert marked == missed
        assert len(browser.find_elements(By.CSS_SELECTOR, "#missing-body tr")) == len(results["missing"])
        points = browser.find_element(By.CSS_SELECTOR, "#chart-acc-round polyline").get_attribute("points")
        assert len(points.split()) == sum("accuracy" in r for r in rounds)

        severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe
        shot = run_dir / "live_page.png"
        assert browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        release.set()
        run.join(WAIT_S) if run.is_alive() else None
        server.stop()


def test_large_federation_draws_clusters_and_lost_nodes(browser: webdriver.Chrome, tmp_path: Path) -> None:
    """300 clients are drawn as one box per cluster with its counts; a lost edge is marked with its reason."""
    spec = fedchs_spec(clients=300, edges=10, rounds=5)
    status = RunStatus()
    status("run_started", {"run_id": "big", "spec": spec.model_dump(mode="json"), "nodes": None, "resumed_at": 0})
    for n in [f"edge-{m}" for m in range(10)] + [f"client-{i}" for i in range(300)]:
        status("node_joined", {"node": n, "role": "edge" if n.startswith("edge") else "client"})
    status("node_lost", {"node": "edge-3", "reason": "stream closed"})
    for i in range(4):  # four clients of edge-0 (clients 0..29) lost
        status("node_lost", {"node": f"client-{i}", "reason": "deadline"})
    server = start_http(status, "127.0.0.1", 0)
    try:
        browser.get(server.url)
        wait_text(browser, "phase", "joining")
        assert shown(browser, "nodes") == "305 / 310" and shown(browser, "lost") == "5"
        labels = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#topology text")]
        assert "30 clients, 4 lost" in labels and labels.count("30 clients") == 9
        lost = browser.find_element(By.CSS_SELECTOR, '#topology circle[data-node="edge-3"]')
        assert "lost" in lost.get_attribute("class").split()
        assert "stream closed" in lost.find_element(By.TAG_NAME, "title").get_attribute("textContent")
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        browser.save_screenshot(str(tmp_path / "large_federation.png"))
    finally:
        server.stop()
