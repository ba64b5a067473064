"""Helpers of the networked-engine integration tests: specs, real role processes on 127.0.0.1, results."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.launch import Processes, free_port, role_cmd
from tests.specs import DIGITS, run_spec
from tests.waiting import exited, wait_until


def small_spec(algorithm: str = "fedavg", *, clients: int = 3, edges: int = 0, rounds: int = 3,
               options: dict[str, Any] | None = None, transport: dict[str, Any] | None = None,
               seed: int = 7, edge_graph: str = "random") -> RunSpec:
    base = {"lr": 0.1, "local_steps": 3, "batch_size": 16} if algorithm in ("fedavg", "hierfavg") else {}
    opts = {**base, **(options or {})}
    return run_spec(algorithm, opts, clients=clients, edges=edges, edge_graph=edge_graph,
                    name=f"net-{algorithm}-{edges}e", rounds=rounds, seed=seed, data=DIGITS,
                    model={"name": "mlp", "hidden": [16]},
                    transport={"round_deadline_s": 60.0, "join_timeout_s": 90.0, "chunk_bytes": 4096,
                               **(transport or {})})


def launch_run(spec: RunSpec, tmp: Path, timeout: float = 240, security: Sequence[str] = (),
               extra: Sequence[str] = ()) -> Path:
    """``fedhop launch`` in a subprocess (PS in the launcher, a process per edge, clients in client hosts);
    ``security``: launch's options for the links (``--tls DIR``, ``--token FILE``); ``extra``: more options (e.g.
    ``--clients-per-process 1``: a process per client)."""
    spec_file = tmp / "spec.toml"
    spec_file.write_text(spec.to_toml())
    out = tmp / "run"
    proc = subprocess.run([sys.executable, "-m", "fedhop", "launch", str(spec_file), "--out", str(out),
                           "--device", "cpu", "--quiet", *security, *extra], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{logs(out)}"
    assert "did not exit cleanly" not in (out / "logs" / "ps.log").read_text(), logs(out)
    return out


def launch_cli_here(spec: RunSpec, tmp: Path, security: Sequence[str] = (), extra: Sequence[str] = ()) -> Path:
    """``fedhop launch`` through the command line's ``main`` in the test process: the options of
    :func:`launch_run` parsed and applied as the command does, the PS here, every child forked from this session's
    fork server, without the new interpreter and its own fork server (two torch imports) that a subprocess pays.
    For tests of what the command's options do to a run; a test of the process itself (exit codes, signals,
    what it prints) keeps :func:`launch_run`."""
    from fedhop.cli import main

    spec_file = tmp / "spec.toml"
    spec_file.write_text(spec.to_toml())
    out = tmp / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(["launch", str(spec_file), "--out", str(out), "--device", "cpu", "--quiet", *security, *extra])
    assert code == 0, f"launch failed ({code}):\n{printed.getvalue()}\n{logs(out)}"
    assert "did not exit cleanly" not in (out / "logs" / "ps.log").read_text(), logs(out)
    return out


def launch_here(spec: RunSpec, tmp: Path, **options: Any) -> Path:
    """:func:`fedhop.launch.launch` in the test process: the PS here, every edge and client host a separate
    process forked from this session's fork server (fedhop/forkstart.py), which imported torch once for all
    tests; the same run folder as ``fedhop launch`` writes. For tests about what crosses the wire, not about
    the command line (that is :func:`launch_run`, which pays a new interpreter and a fork server of its own:
    two torch imports). ``options``: launch's keyword arguments (e.g. ``clients_per_process=1``)."""
    from fedhop.launch import launch

    out = tmp / "run"
    launch(spec, out, device="cpu", **options)
    assert "did not exit cleanly" not in (out / "logs" / "ps.log").read_text(), logs(out)
    return out


def node_log(out: Path, node: str) -> str:
    """The log of the process that ran ``node`` in a launch: ``logs/<node>.log``, or its client host's
    (``logs/client-0..client-3.log``)."""
    from fedhop.client_ids import parse_ids

    own = out / "logs" / f"{node}.log"
    if own.is_file():
        return own.read_text(errors="replace")
    for f in sorted((out / "logs").glob("client-*..*.log")):
        if node in parse_ids(f.name.removesuffix(".log")):
            return f.read_text(errors="replace")
    raise AssertionError(f"no log of {node} in {out / 'logs'}")


def logs(out: Path) -> str:
    parts = []
    for f in sorted((out / "logs").glob("*.log")) if (out / "logs").is_dir() else []:
        parts.append(f"--- {f.name}\n{f.read_text()[-3000:]}")
    return "\n".join(parts)


class Federation:
    """``fedhop server`` plus every edge and client as separate processes, each with a known pid.

    ``hold``: nodes not started with the others (start them later with :meth:`start_node`; :meth:`release_join`
    starts the run without them, instead of waiting out the join timeout). ``security``: options every process
    gets (``--tls DIR``, ``--token FILE``). ``marks``: rounds whose end the test awaits with :meth:`wait_round`
    (the PS's test gate after each, made to pass at once: it marks the moment and holds nothing). ``holds``:
    rounds after which the PS waits at its gate until the test calls :meth:`go` (await it with
    :meth:`wait_round` too).

    The test waits for states, not log lines: the PS serves its live page's JSON API (``--http``, unless
    ``server_args`` names one; :meth:`status`, :meth:`wait_lost`), and every process marks what it reached in
    the test-gate folder (``common/testhooks.py``'s ``mark``; :meth:`wait_seen`)."""

    def __init__(self, spec: RunSpec, tmp: Path, hold: tuple[str, ...] = (),
                 state_dir: Path | None = None, out: Path | None = None, security: Sequence[str] = (),
                 server_args: tuple[str, ...] = (), marks: tuple[int, ...] = (),
                 holds: tuple[int, ...] = ()) -> None:
        self.spec = spec
        self.security = list(security)
        self.state_dir = state_dir
        self.out = out or tmp / "run"
        self.spec_file = tmp / "spec.toml"
        self.spec_file.write_text(spec.to_toml())
        self.port = free_port()
        self.procs = Processes(tmp / "logs")
        self.hold = hold
        self._env_gate = None
        if "FEDHOP_TEST_GATE" not in os.environ:  # release_join, marks, wait_seen (common/testhooks.py)
            (tmp / "gate").mkdir(exist_ok=True)
            os.environ["FEDHOP_TEST_GATE"] = self._env_gate = str(tmp / "gate")
        self.gates = Path(os.environ["FEDHOP_TEST_GATE"])
        if "--http" in server_args:
            self.http = list(server_args)[list(server_args).index("--http") + 1]
        else:
            self.http = f"127.0.0.1:{free_port()}"
            server_args = (*server_args, "--http", self.http)
        self.marks = (*marks, *holds)
        for r in self.marks:
            assert 0 < r < spec.rounds, f"the PS passes a gate only between rounds, not after round {r}"
            assert not (self.gates / f"stop-{r}").exists(), f"the test holds the PS after round {r} itself"
            if r not in holds:
                (self.gates / f"go-{r}").touch()
            (self.gates / f"stop-{r}").touch()
        self.ps = self.procs.start("ps", [sys.executable, "-m", "fedhop", "server", str(self.spec_file),
                                          "--listen", f"127.0.0.1:{self.port}", "--out", str(self.out),
                                          "--device", "cpu", *self.security, *server_args])
        self.topology = build_topology(spec.topology, spec.seed)
        self.addr = {self.topology.server: f"127.0.0.1:{self.port}"}
        self.addr.update({e: f"127.0.0.1:{free_port()}" for e in self.topology.edges})
        for n in (*self.topology.edges, *self.topology.clients):
            if n not in hold:
                self.start_node(n)

    def start_node(self, node: str, security: Sequence[str] | None = None) -> None:
        """Start ``node`` with the federation's security options (or ``security`` instead)."""
        role = self.topology.role(node)
        self.procs.start(node, role_cmd(role, node, self.addr[self.topology.parent[node]], device="cpu",
                                        listen=self.addr[node] if role == "edge" else None,
                                        state_dir=self.state_dir,
                                        extra=self.security if security is None else security))

    def release_join(self, parent: str = "ps", timeout: float = 120) -> None:
        """Once every child of ``parent`` that is not held back said Ready, end ``parent``'s wait for the
        held ones (the test hook ``go-join-<parent>``): the run starts, and they can join late."""
        children = [n for n, p in self.topology.parent.items() if p == parent and n not in self.hold]
        for n in children:
            self.wait_seen(f"ready-{parent}-{n}", timeout, node=parent)
        (self.gates / f"go-join-{parent}").touch()

    def seen(self, name: str) -> int:
        """How often a process marked the state ``name`` (``common/testhooks.py``'s ``mark``): e.g.
        ``ready-ps-client-1`` (the PS had client-1's Ready), ``admitted-ps-client-2`` (a late child admitted at
        a round boundary), ``rejoining-edge-0`` / ``rejoined-edge-0`` (a child lost its parent / joined it
        again)."""
        f = self.gates / f"seen-{name}"
        return len(f.read_text().splitlines()) if f.is_file() else 0

    def wait_seen(self, name: str, timeout: float, node: str = "ps", times: int = 1) -> None:
        """Wait until ``node`` marked the state ``name`` ``times`` times in all (see :meth:`seen`)."""
        wait_until(lambda: self.seen(name) >= times, f"{node} to reach {name!r}" + (f" {times} times" if times > 1
                   else ""), timeout=timeout, stop_if=exited(self.procs.procs[node], node), details=self.all_logs)

    def status(self) -> dict[str, Any] | None:
        """The PS's ``/api/status`` (server/web/status.py; docs/live-page.md), None while it does not answer."""
        try:
            return httpx.get(f"http://{self.http}/api/status", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return None

    def wait_lost(self, node: str, timeout: float, reason: str = "") -> str:
        """Wait until the PS's status says ``node`` is lost, its reason starting with ``reason`` (``dropped``:
        dropped after missed rounds); returns the reason."""
        def lost() -> str | None:
            why = ((self.status() or {}).get("nodes") or {}).get("lost", {}).get(node)
            return why if why is not None and why.startswith(reason) else None
        return wait_until(lost, f"the PS's status to say {node} is lost" + (f" ({reason})" if reason else ""),
                          timeout=timeout, stop_if=exited(self.ps, "the PS"), details=self.all_logs)

    def wait_round(self, r: int, timeout: float) -> None:
        """Wait until the PS has ended round ``r`` (and written its checkpoint): its gate after round ``r``, one
        of ``marks``."""
        assert r in self.marks, f"round {r} is not among the marks {self.marks}"
        wait_until((self.gates / f"at-{r}").exists, f"the PS to end round {r}",
                   timeout=timeout, stop_if=exited(self.ps, "the PS"), details=self.all_logs)

    def go(self, r: int) -> None:
        """Let the PS go on past its gate after round ``r``, one of ``holds``."""
        (self.gates / f"go-{r}").touch()

    def restart_ps(self, name: str = "ps2") -> None:
        """A new PS process that resumes the run from its last checkpoint, on the same address."""
        self.ps = self.procs.start(name, [sys.executable, "-m", "fedhop", "server", "--resume", str(self.out),
                                          "--listen", f"127.0.0.1:{self.port}", "--device", "cpu",
                                          "--http", self.http, *self.security])

    def log_of(self, node: str) -> str:
        return (self.procs.logs / f"{node}.log").read_text(errors="replace")

    def ps_log(self) -> str:
        return self.log_of("ps")

    def exit_codes(self, timeout: float) -> dict[str, int | None]:
        """Every process's exit code (None: still running after ``timeout`` in all)."""
        return self.procs.wait(timeout)

    def wait(self, timeout: float) -> int:
        return self.ps.wait(timeout)

    def all_logs(self) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(self.procs.logs.glob("*.log")))

    def close(self) -> None:
        self.procs.kill_all()
        if self._env_gate is not None and os.environ.get("FEDHOP_TEST_GATE") == self._env_gate:
            del os.environ["FEDHOP_TEST_GATE"]


def example_here(name: str, tmp: Path, monkeypatch: pytest.MonkeyPatch,
                 smaller: Sequence[tuple[str, str]]) -> Path:
    """A copy of ``examples/NAME`` in ``tmp`` with its spec.toml made smaller (each ``(old, new)`` must occur),
    the working directory and first on sys.path for the test (fedhop imports the module a spec names from the
    working directory, as ``fedhop simulate`` / ``launch`` run in the example's folder would)."""
    folder = tmp / name
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / name, folder,
                    ignore=shutil.ignore_patterns("__pycache__"))
    text = (folder / "spec.toml").read_text()
    for old, new in smaller:
        assert old in text, f"examples/{name}/spec.toml no longer holds {old!r}"
        text = text.replace(old, new)
    (folder / "spec.toml").write_text(text)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def load_result(out: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    return json.loads((out / "results.json").read_text()), torch.load(out / "model.pt")


def replies(res: dict[str, Any]) -> set[tuple[str, int]]:
    """(node, round) of every reply a parent received; rounds 0-based as in memory (the run folder's files
    number them from 1)."""
    return {(r["src"], r["round"] - 1) for r in res["links"] if r["phase"] == "reply"}


def rows_by_key(links: list[dict[str, Any]], level: str) -> dict[tuple, int]:
    """Bytes per (src, dst, kind, phase), summed over rounds."""
    out: dict[tuple, int] = {}
    for r in links:
        k = (r["src"], r["dst"], r["kind"], r["phase"])
        out[k] = out.get(k, 0) + r[level]
    return out


def launch_killed_and_resumed(args: Sequence[str], run: Path, gate: Path, *, extra: Sequence[str] = (),
                              cwd: Path | None = None, at_round: int = 2, timeout: float = 300,
                              while_held: Callable[[subprocess.Popen], None] | None = None,
                              resume_here: bool = False) -> subprocess.CompletedProcess:
    """``fedhop launch ARGS EXTRA --out RUN`` held by the test gate (``gate/stop-<at_round>``, set beforehand)
    after round ``at_round``, SIGKILLed there, then ``fedhop launch --resume RUN EXTRA`` with the gate open: the
    resumed launch's completed process (stderr captured). ``while_held(first)``: called while the first launch
    waits at the gate. ``resume_here``: the resumed launch through the command line's ``main`` in the test
    process (no new interpreter and fork server; its exit code and what it printed as a completed process), for
    a run of built-in code only (a user's module would stay imported here)."""
    common = ["--quiet", "--http", "off"]
    first = subprocess.Popen([sys.executable, "-m", "fedhop", "launch", *args, *extra, "--out", str(run), *common],
                             cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until((gate / f"at-{at_round}").exists, f"round {at_round} to end", timeout=240,
                   stop_if=exited(first, "launch"))
        if while_held is not None:
            while_held(first)
    finally:
        first.kill()
        first.wait(30)
    (gate / f"stop-{at_round}").unlink()
    if resume_here:
        from fedhop.cli import main

        assert cwd is None, "a resume in the test process runs in the test's working directory"
        argv = ["launch", "--resume", str(run), *common, *extra]
        printed, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(err):
            code = main(argv)
        return subprocess.CompletedProcess(["fedhop", *argv], code, printed.getvalue(), err.getvalue())
    return subprocess.run([sys.executable, "-m", "fedhop", "launch", "--resume", str(run), *common, *extra],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)
