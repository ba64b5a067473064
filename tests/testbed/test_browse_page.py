"""``fedhop ui`` in a real headless Chromium (as tests/testbed/test_live_page.py drives it): the run list of a
folder holding two finished in-process runs and one still running, two runs overlaid (what ``fedhop compare``
draws, with hover values and a legend that hides a run), a finished run's page read from its folder with its
curves, per-link table and route, a running run's page following its journal; and a page opened on a PS's
address as the PS closes, which shows the run's final state instead of "connecting...". Screenshots go to the
test's artifacts folder (printed; under pytest's tmp_path).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from fedhop.browse import LiveMarker
from fedhop.common.engine.events import RunEvents
from fedhop.common.engine.inprocess import FaultPlan
from fedhop.common.engine.results import write_run_folder
from fedhop.server.web.browse import start_ui
from fedhop.server.web.live import simulate
from fedhop.server.web.serve import start_http
from fedhop.server.web.status import RunStatus
from tests.integration.netutil import small_spec
from tests.testbed.test_live_page import WAIT_S, as_int, shown, wait_text
from tests.unit.test_browse import journal, marker
from tests.unit.test_fedchs import spec as fedchs_spec

FEDCHS = "20261126-010000-fedchs-simulate"
FEDAVG = "20261126-010100-fedavg-simulate"
LIVE = "20261126-010200-fedavg-launch"


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    out = tmp_path / "artifacts"
    out.mkdir()
    print(f"\n[browse] screenshots in {out}")
    return out


def run_into(folder: Path, spec: Any, faults: FaultPlan | None = None) -> dict[str, Any]:
    """A tiny in-process run written to ``folder`` as ``fedhop simulate`` writes it (live.json included)."""
    folder.mkdir(parents=True)
    events = RunEvents()
    events.subscribe(LiveMarker(folder, engine="inprocess"))
    write_run_folder(simulate(spec, events, journal=folder / "rounds.jsonl", faults=faults), folder)
    return json.loads((folder / "results.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browse") / "runs"
    faults = FaultPlan(lambda node, task, rnd: node in ("client-0", "client-2", "client-4") and rnd == 1)
    run_into(root / FEDCHS, fedchs_spec({"K": 2}, clients=6, edges=3, rounds=5), faults)
    run_into(root / FEDAVG, small_spec("fedavg", clients=4, rounds=4))
    journal(root / LIVE, 2)
    marker(root / LIVE, started=time.time())  # this process: alive, so "running"; started last
    return root


def wait_count(drv: webdriver.Chrome, css: str, n: int) -> list[Any]:
    WebDriverWait(drv, WAIT_S).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, css)) == n,
                                     f"never {n} elements {css!r}")
    return drv.find_elements(By.CSS_SELECTOR, css)


def severe(drv: webdriver.Chrome) -> list[dict[str, Any]]:
    return [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]


def test_run_list_overlay_and_a_finished_runs_page(browser: webdriver.Chrome, runs: Path, artifacts: Path) -> None:
    results = {n: json.loads((runs / n / "results.json").read_text()) for n in (FEDCHS, FEDAVG)}
    ui = start_ui(runs, "127.0.0.1:0")
    try:
        # -- the list ----------------------------------------------------------------------------------------
        browser.get(ui.url)
        rows = wait_count(browser, "#runs-body tr", 3)
        assert [r.get_attribute("data-run") for r in rows] == [FEDCHS, FEDAVG, LIVE]
        cell = {r.get_attribute("data-run"): r for r in rows}
        assert cell[FEDCHS].find_element(By.CSS_SELECTOR, "td.status").text == "finished"
        assert cell[FEDCHS].find_element(By.CSS_SELECTOR, "td.rounds").text == "5/5"
        assert cell[FEDCHS].find_element(By.CSS_SELECTOR, "td.accuracy").text == \
            f"{results[FEDCHS]['rounds'][-1]['accuracy']:.4f}"
        assert cell[LIVE].find_element(By.CSS_SELECTOR, "td.status").text == "running"
        assert cell[LIVE].find_element(By.LINK_TEXT, "PS page").get_attribute("href") == "http://127.0.0.1:8123/"
        browser.save_screenshot(str(artifacts / "run_list.png"))

        # -- two runs overlaid -----------------------------------------------------------------------------
        for name in (FEDCHS, FEDAVG):
            cell[name].find_element(By.CSS_SELECTOR, "input.pick").click()
        for chart in ("ov-round", "ov-bytes", "ov-time"):
            lines = wait_count(browser, f"#{chart} polyline.series", 2)
            assert [ln.get_attribute("data-run") for ln in lines] == [FEDCHS, FEDAVG]
            for ln in lines:
                evaluated = [r for r in results[ln.get_attribute("data-run")]["rounds"] if "accuracy" in r]
                assert len(ln.get_attribute("points").split()) == len(evaluated)
        assert f"compare={FEDCHS},{FEDAVG}" in browser.current_url
        dot = browser.find_element(By.CSS_SELECTOR, "#ov-bytes circle[fill]")
        ActionChains(browser).move_to_element(dot).perform()
        tip = browser.find_element(By.ID, "tooltip")
        WebDriverWait(browser, WAIT_S).until(lambda d: tip.is_displayed(), "no tooltip on hover")
        assert "round" in tip.text and "cumulative payload" in tip.text
        browser.save_screenshot(str(artifacts / "runs_overlaid.png"))
        browser.find_element(By.CSS_SELECTOR, f'#legend span[data-run="{FEDAVG}"]').click()
        assert [ln.get_attribute("data-run") for ln in wait_count(browser, "#ov-round polyline.series", 1)] == \
            [FEDCHS]

        # a shared overlay URL opens with the same runs ticked
        browser.get(browser.current_url)
        wait_count(browser, "#ov-time polyline.series", 2)
        assert not severe(browser)

        # -- a finished run's page, read from its folder -------------------------------------------------------
        browser.find_element(By.LINK_TEXT, FEDCHS).click()
        wait_text(browser, "conn", "run folder")  # (the page shows the run before its stream connects, too)
        res = results[FEDCHS]
        assert shown(browser, "phase") == "finished"
        assert shown(browser, "round") == "5 / 5" and shown(browser, "run-algorithm") == "fedchs"
        assert shown(browser, "last-accuracy") == f"{res['rounds'][-1]['accuracy']:.4f}"
        assert as_int(shown(browser, "total-payload")) == res["totals"]["payload_bytes"]
        points = browser.find_element(By.CSS_SELECTOR, "#chart-acc-bytes polyline").get_attribute("points")
        assert len(points.split()) == sum("accuracy" in r for r in res["rounds"])
        table = {tr.get_attribute("data-link"): as_int(tr.find_element(By.CSS_SELECTOR, "td.payload").text)
                 for tr in browser.find_elements(By.CSS_SELECTOR, "#links-body tr")}
        per_link: dict[str, int] = {}
        for r in res["links"]:
            per_link[f"{r['src']}>{r['dst']}"] = per_link.get(f"{r['src']}>{r['dst']}", 0) + r["payload_bytes"]
        assert table == per_link
        route = shown(browser, "route")
        assert all(f"r{r['round']}: {r['edge']}" in route for r in res["rounds"])
        assert len(browser.find_elements(By.CSS_SELECTOR, "#missing-body tr")) == len(res["missing"]) > 0
        assert not severe(browser)
        browser.save_screenshot(str(artifacts / "finished_run_page.png"))
        browser.find_element(By.ID, "home").click()
        wait_count(browser, "#runs-body tr", 3)

        # -- a running run's page follows its journal, and links to its PS's own page ------------------------
        browser.find_element(By.LINK_TEXT, LIVE).click()
        wait_text(browser, "conn", "run folder (following)")
        assert shown(browser, "phase") == "running" and shown(browser, "round") == "2 / 5"
        assert browser.find_element(By.LINK_TEXT, "the PS's live page").get_attribute("href") == \
            "http://127.0.0.1:8123/"
        with (runs / LIVE / "rounds.jsonl").open("a") as f:
            f.write(json.dumps({"round": 3, "accuracy": 0.8125, "loss": 0.5, "elapsed_s": 1.5, "round_s": 0.5}) + "\n")
        wait_text(browser, "round", "3 / 5")
        assert shown(browser, "last-accuracy") == "0.8125"
        assert "bytes are written when the run ends" in shown(browser, "chart-acc-bytes")
        assert not severe(browser)
        browser.save_screenshot(str(artifacts / "running_run_page.png"))
    finally:
        ui.stop()
    for shot in ("run_list.png", "runs_overlaid.png", "finished_run_page.png", "running_run_page.png"):
        assert (artifacts / shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_page_opened_as_the_ps_closes_shows_the_run(browser: webdriver.Chrome, runs: Path, artifacts: Path) -> None:
    """A run ended and its PS is closing its web face: a page opened now shows the run, not "connecting..."."""
    res = json.loads((runs / FEDCHS / "results.json").read_text())
    status = RunStatus()
    spec = res["spec"]
    status("run_started", {"run_id": "ended-run", "spec": spec, "nodes": None, "resumed_at": 0})
    for r in res["rounds"]:
        status("round_started", {"round": r["round"] - 1})
        status("round_ended", {"round": r["round"] - 1, "duration_s": r["round_s"], "record": r})
    status("run_finished", {"ok": True, "wall_s": res["wall_s"], "error": None})
    server = start_http(status, "127.0.0.1", 0)
    try:
        notifier = server._app.state.notifier  # type: ignore[attr-defined]
        notifier.close()  # what the PS does first when its run ends (server.stop)
        deadline = time.monotonic() + WAIT_S
        while not notifier.closing:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        browser.get(server.url)
        wait_text(browser, "phase", "finished")
        assert shown(browser, "round") == "5 / 5"
        assert shown(browser, "last-accuracy") == f"{res['rounds'][-1]['accuracy']:.4f}"
        browser.save_screenshot(str(artifacts / "ps_page_after_the_run.png"))

        # no event stream and no JSON API at all (the PS gone right after serving the page, or a proxy keeping
        # them out): the page shows the state it was served with
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/api/*"]})
        browser.get(server.url)
        wait_text(browser, "phase", "finished")
        assert shown(browser, "round") == "5 / 5" and shown(browser, "run-algorithm") == "fedchs"
        points = browser.find_element(By.CSS_SELECTOR, "#chart-acc-round polyline").get_attribute("points")
        assert len(points.split()) == sum("accuracy" in r for r in res["rounds"])
        WebDriverWait(browser, WAIT_S).until(lambda d: shown(d, "conn") != "connecting…", "the page never gave up")
        assert "run ended" in shown(browser, "conn")
        browser.save_screenshot(str(artifacts / "ps_page_without_a_stream.png"))
    finally:
        server.stop()
