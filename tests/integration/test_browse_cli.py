"""``fedhop ui`` as a process: it says where it serves, answers there, and Ctrl-C ends it with the usual code
and one line (a page's open event stream does not hold it up)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fedhop.common.exit_codes import ExitCode
from tests.unit.test_browse import finished


def test_ui_serves_a_folder_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    finished(root / "20261126-010203-toy-simulate")
    proc = subprocess.Popen([sys.executable, "-m", "fedhop", "ui", str(root), "--http", "127.0.0.1:0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # blocks until the server announces itself (or the process ends)
        m = re.search(r"serving the runs under .* on (http://\S+/)", line)
        assert m, line
        url = m.group(1)
        runs = httpx.get(url + "api/runs", timeout=30).json()["runs"]
        assert [(r["name"], r["status"]) for r in runs] == [("20261126-010203-toy-simulate", "finished")]
        with httpx.stream("GET", url + "runs/20261126-010203-toy-simulate/api/events", timeout=30) as resp:
            assert next(resp.iter_lines()).startswith("retry:")
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(30)
        took = time.monotonic() - t0
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == ExitCode.INTERRUPTED, rest
    assert rest.strip() == "fedhop ui: interrupted"
    assert took < 10, f"Ctrl-C took {took:.1f}s"
