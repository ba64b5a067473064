"""The live page's per-round timeline in a real headless Chromium (as tests/testbed/test_live_page.py): a Fed-CHS
run with a ``[network]`` profile draws the last round's Gantt row per node, the predicted round as a line, and a
row per link with its achieved rate beside the configured one, as ``/api/timeline``'s ``chart`` says."""

from __future__ import annotations

from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from fedhop.common.engine.events import RunEvents
from fedhop.server.web.serve import start_http
from fedhop.server.web.status import RunStatus
from tests.live_run import run_with_events
from tests.specs import DIGITS, run_spec
from tests.testbed.test_live_page import WAIT_S, wait_text

NET = {"client_edge": {"mbit": 20, "delay_ms": 30}, "edge_edge": {"mbit": 10, "delay_ms": 10},
       "edge_ps": {"delay_ms": 5}}


def test_gantt_and_link_rates_follow_the_chart(browser: webdriver.Chrome, tmp_path: Path) -> None:
    spec = run_spec("fedchs", {"K": 2}, clients=4, edges=2, rounds=3, data=DIGITS,
                    model={"name": "mlp", "hidden": [64]}, network=NET)
    status, events = RunStatus(), RunEvents()
    events.subscribe(status)
    server = start_http(status, "127.0.0.1", 0)
    try:
        browser.get(server.url)
        wait_text(browser, "conn", "live")
        run_with_events(spec, events)
        wait_text(browser, "phase", "finished")
        chart = status.timeline()["chart"]
        assert chart["round"] == 2 and chart["predicted_round_s"] > 0
        WebDriverWait(browser, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#gantt rect"),
                                             "the Gantt chart was never drawn")
        rects = browser.find_elements(By.CSS_SELECTOR, "#gantt rect")
        assert len(rects) == sum(len(n["segments"]) for n in chart["nodes"])
        labels = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#gantt text")]
        assert all(n["node"] in labels for n in chart["nodes"])
        assert browser.find_elements(By.CSS_SELECTOR, "#gantt line.predicted")
        assert f"{chart['predicted_round_s']:.3f} s predicted" in browser.find_element(By.ID, "gantt-note").text
        rows = browser.find_elements(By.CSS_SELECTOR, "#rates-body tr")
        assert len(rows) == len(chart["links"])
        shown = {r.find_elements(By.TAG_NAME, "td")[0].text: r.find_elements(By.TAG_NAME, "td")[5].text
                 for r in rows}
        assert shown["edge-0 ↔ client-0" if "edge-0 ↔ client-0" in shown else "edge-1 ↔ client-2"] == "20 / 20"
        severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe
        assert browser.save_screenshot(str(tmp_path / "gantt.png"))
        print("screenshot:", tmp_path / "gantt.png")
    finally:
        server.stop()
