"""``fedhop testbed up``: a whole federation across network namespaces, with shaped links and kernel byte counts.

One namespace per process (PS, each edge, each client) with its own address on a bridge (deploy/netns.py);
the run's ``[network]`` profile (common/network_spec.py): per-direction rate with tc htb (deploy/shaping.py),
delay and jitter by holding packets in the kernel (deploy/kernel_delay.py; where that is unavailable, or with
``FEDHOP_DELAY_MECHANISM=proxy``, by a userspace proxy, deploy/delay_proxy.py), loss with an nftables rule
(deploy/loss.py), its traces
replayed by a scheduler thread (deploy/profile.py); the roles
started with their own commands (``fedhop server|edge|client``) through ``ip netns exec``; wire bytes per link
from nftables counters (deploy/kernel_bytes.py). Everything created is removed at the end, also on failure,
Ctrl-C or SIGTERM. :class:`Testbed` implements the testbed contract (deploy/contract.py: start / wait / wire /
stop).

Run folder (the PS's files plus): ``wire.csv`` (kernel counters per directed link), ``link_bytes.csv``
(payload, message and wire per link, with ratios), ``round_times.csv`` (when each round's record reached the
PS's journal), ``testbed.json`` (namespaces, addresses, link shapes, pids), ``tc.json`` (htb statistics per shaped
link and direction), ``loss.json`` (packets dropped per lossy direction), ``tcp.csv`` (TCP segments and
retransmissions per node), ``trace.json`` (with traces: when each step was applied, and the clocks to place
the rounds on the trace's time line) and ``logs/``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedhop.common.network_spec import TraceError, compute_trace_env, load_traces
from fedhop.common.spec import RunSpec
from fedhop.common.testbed_spec import TestbedSpec
from fedhop.common.topology import build_topology
from fedhop.deploy import contract, kernel_bytes, kernel_delay, loss, profile, shaping, testbed_http, testbed_tls
from fedhop.deploy.contract import EDGE_PORT, PS_PORT, RoleCommand, link_security
from fedhop.deploy.link_table import LinkBytes
from fedhop.deploy.netns import Network, TestbedError, in_ns, plan_network, run_cmd
from fedhop.deploy.processes import Processes
from fedhop.deploy.profile import Link, Replay, peers_of, run_links  # noqa: F401  (run_links: re-exported)
from fedhop.deploy.wire import WireReading

QUIET_WAIT_S = 5.0  # how long wire() waits for delayed links to go quiet
log = logging.getLogger("fedhop.testbed")

STOP_GRACE_S = 30.0
STARTUP_S = 300.0  # a role behind a delay proxy must listen within this (torch imports are slow on busy hosts)
POLL_S = 0.02
DELAY_ENV = "FEDHOP_DELAY_MECHANISM"  # kernel | proxy; unset: the kernel's where it works, else the proxy
KERNEL_DELAY_READY_S = 30.0


class Interrupted(BaseException):  # noqa: N818  (like KeyboardInterrupt: not an error of the run)
    """SIGINT or SIGTERM reached ``fedhop testbed up``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def check_host() -> None:
    """Root and the tools, before anything is created."""
    if os.geteuid() != 0:
        raise TestbedError("fedhop testbed up needs root (network namespaces, veths, tc, nftables): "
                           "run it with sudo or as root")
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise TestbedError(f"missing tools: {missing} (Debian: apt-get install -y iproute2)")


@dataclass
class RoundClock:
    """Round times from the PS's journal (``rounds.jsonl``): the file is created when the run starts and one
    line is appended per round, so its modification times (polled) date the round ends."""

    path: Path
    start_ns: int | None = None
    ends_ns: list[int] = field(default_factory=list)
    _size: int = -1

    def poll(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        if st.st_size == self._size:
            return
        if st.st_size == 0:
            self.start_ns = st.st_mtime_ns
        else:
            lines = self.path.read_bytes().count(b"\n")
            self.ends_ns += [st.st_mtime_ns] * (lines - len(self.ends_ns))  # several at once: same time
        self._size = st.st_size

    def rows(self) -> list[dict[str, Any]]:
        out, prev = [], self.start_ns
        for i, end in enumerate(self.ends_ns, start=1):
            out.append({"round": i,
                        "end_s": "" if self.start_ns is None else f"{(end - self.start_ns) / 1e9:.3f}",
                        "round_s": "" if prev is None else f"{(end - prev) / 1e9:.3f}"})
            prev = end
        return out


@dataclass
class TestbedResult:
    __test__ = False

    rc: int
    out: Path
    levels: list[LinkBytes]
    rounds: list[dict[str, Any]]
    notes: list[str]


class Testbed:
    """One ``testbed up``: plan, create, run, collect, destroy (:class:`fedhop.deploy.contract.Testbed`)."""

    __test__ = False

    def __init__(self, spec_path: Path, out: Path, *, device: str | None = None, timeout_s: float | None = None,
                 tls: str | None = None, http: str | None = None, http_token: str | None = None) -> None:
        self.spec_path = spec_path
        self.spec = RunSpec.load(spec_path)  # SpecError names the field
        self.tb = self.spec.testbed or TestbedSpec()
        self.profile = self.spec.network_profile()
        self.topo = build_topology(self.spec.topology, self.spec.seed)
        self.order = self.topo.all_nodes()
        try:
            self.profile.check_nodes(self.topo.all_nodes())
        except ValueError as e:
            raise TestbedError(str(e)) from None
        try:
            self.traces = load_traces(self.profile, spec_path.parent)
            self.steps = profile.timeline(self.topo, self.profile, self.traces)  # every change checked now
        except (TraceError, ValueError) as e:
            raise TestbedError(str(e)) from None
        self.links: list[Link] = self.steps[0][1]
        self.out = out
        self.device = device
        self.timeout_s = timeout_s
        nodes = [(n, self.topo.role(n)) for n in self.topo.all_nodes()]
        self.net: Network = plan_network(nodes, self.tb.subnet, mtu=self.tb.mtu, offloads=self.tb.offloads,
                                         tcp_timestamps=self.tb.tcp_timestamps)
        self.tls = tls
        if tls is not None and tls != testbed_tls.AUTO:
            testbed_tls.check_folder(Path(tls), self.net, spec_path)
        self.plan = contract.plan(self.topo, {n: nn.address for n, nn in self.net.nodes.items()},
                                  contract.fixed_ports(self.topo, PS_PORT, EDGE_PORT))
        self.tls_dir: Path | None = None
        self.counters = kernel_bytes.NamespaceCounters(self.net, peers_of(self.links))
        self.children = Processes(out / "logs")
        self.shapes: list[shaping.LinkShape] = []
        self.losses: list[loss.LinkLoss] = []  # every direction lossy at some time, with its loss at 0 s
        self.loss_tables: dict[str, loss.LossTable] = {}
        self.controls: dict[str, Path] = {}  # listening node -> its delay proxy's control file (with traces)
        self.held = {n: profile.ever_held(n, self.steps) for n in self.order}  # node -> peers delayed into it
        self.delay_mode: str | None = None  # kernel | proxy, once started with a delayed link
        self.kdelay_controls: dict[str, Path] = {}  # node -> its kernel delay's control file (with traces)
        self.replay = Replay([t for t, _ in self.steps], self._step)
        self._replay_t0_ns = 0
        self.clock = RoundClock(out / "rounds.jsonl")
        self._tearing_down = False
        # last: binds the host's port (a taken one fails here, before anything is created)
        self.http = testbed_http.bind(http, http_token) if http else None

    # -- processes ------------------------------------------------------------------------------------------
    @property
    def procs(self) -> dict[str, Any]:
        """The processes started so far, by name."""
        return self.children.procs

    def _start(self, name: str, ns: str, cmd: list[str], env: dict[str, str] | None = None,
               pass_fds: tuple[int, ...] = ()) -> None:
        self.children.start(name, in_ns(ns, cmd), env=env, pass_fds=pass_fds)

    def _security(self) -> tuple[str, ...]:
        """Every role's link options: mutual TLS with --tls, else plaintext (:func:`contract.link_security`)."""
        return link_security(str(self.tls_dir) if self.tls_dir else None)

    def _web(self) -> tuple[list[str], dict[str, str]]:
        """The PS's --http options (and token, through its environment), and the forwarder from the host."""
        if self.http is None:
            return [], {}
        ps = self.net.nodes[self.topo.server]
        inner = self.http.inner_address(ps.address)
        fd = self.http.sock.fileno()
        self._start("http-forward", ps.ns, [sys.executable, "-m", "fedhop.deploy.delay_proxy", "--listen-fd",
                                            str(fd), "--target", inner], pass_fds=(fd,))
        return ["--http", inner], ({"FEDHOP_HTTP_TOKEN": self.http.token} if self.http.token else {})

    def _holds(self, node: str, links: list[Link]) -> dict[str, profile.PeerDelay]:
        """Peer address -> the delay proxy's holds for the delayed links into ``node``'s server."""
        return {self.net.nodes[peer].address: pd for peer, pd in profile.proxy_holds(node, links).items()}

    def _serve_addr(self, node: str) -> tuple[str, str]:
        """(listen, public) addresses of a listening node: with delayed links (at any time of the run's traces)
        held by the proxy, the proxy takes the public one."""
        public = self.plan.address(node)
        if self.delay_mode != "proxy" or not profile.ever(node, self.steps)[2]:
            return public, public
        listen = f"127.0.0.1:{self.plan.node(node).port}"
        args = [sys.executable, "-m", "fedhop.deploy.delay_proxy", "--listen", public, "--target", listen]
        for addr, pd in sorted(self._holds(node, self.links).items()):
            args += ["--delay", f"{addr}={profile.hold_arg(pd)}"]
        args += ["--seed", str(self.spec.seed)]
        if len(self.steps) > 1:  # a trace may change the delays: through a control file
            control = self.out / f"delays-{node}.json"
            profile.write_holds(control, self._holds(node, self.links))
            self.controls[node] = control
            args += ["--control", str(control)]
        self._start(f"proxy-{node}", self.net.nodes[node].ns, args)
        return listen, public

    def _choose_delay(self) -> str:
        """``kernel`` where this host can hold packets in an NFQUEUE (probed in the bridge namespace), else
        ``proxy`` with a warning; ``FEDHOP_DELAY_MECHANISM`` forces one (``kernel``: an error if unavailable)."""
        want = os.environ.get(DELAY_ENV, "").strip().lower()
        if want not in ("", "kernel", "proxy"):
            raise TestbedError(f"{DELAY_ENV}={want!r}: expected kernel or proxy")
        if want == "proxy":
            log.info("delay and jitter by the userspace proxy (%s=proxy)", DELAY_ENV)
            return "proxy"
        p = subprocess.run(in_ns(self.net.bridge_ns, [sys.executable, "-m", "fedhop.deploy.kernel_delay", "--probe"]),
                           capture_output=True, text=True)
        if p.returncode == 0:
            return "kernel"
        why = (p.stdout.strip().splitlines() or p.stderr.strip().splitlines() or ["?"])[-1]
        if want == "kernel":
            raise TestbedError(f"{DELAY_ENV}=kernel, but the kernel delay is unavailable: {why}")
        log.warning("kernel delay unavailable (%s): delay and jitter by the userspace proxy instead, which the "
                    "kernel's TCP does not feel (docs/network.md)", why)
        return "proxy"

    def _kernel_holds(self, node: str, links: list[Link]) -> dict[str, kernel_delay.Hold]:
        """Peer address -> the hold of what ``node`` receives from it, for every peer ever delayed into it."""
        now = profile.inbound_holds(node, links)
        return {self.net.nodes[p].address: now[p] for p in sorted(self.held[node])}

    def _start_kernel_delay(self) -> None:
        """One ``kernel_delay`` per node with delayed inbound directions, in its namespace; returns once every
        rule is in place (TestbedError with its log if one fails)."""
        ready: dict[str, Path] = {}
        for node in self.order:
            if not self.held[node]:
                continue
            ready[node] = self.out / f"kdelay-{node}.ready"
            ready[node].unlink(missing_ok=True)
            args = [sys.executable, "-m", "fedhop.deploy.kernel_delay", "--seed", str(self.spec.seed),
                    "--ready", str(ready[node])]
            args += [x for a, h in self._kernel_holds(node, self.links).items() for x in ("--hold", f"{a}={h}")]
            if len(self.steps) > 1:
                control = self.kdelay_controls[node] = self.out / f"kdelay-{node}.json"
                kernel_delay.write_control(control, self._kernel_holds(node, self.links))
                args += ["--control", str(control)]
            self._start(f"kdelay-{node}", self.net.nodes[node].ns, args)
        end = time.monotonic() + KERNEL_DELAY_READY_S
        for node, path in ready.items():
            while not path.exists():
                if self.procs[f"kdelay-{node}"].poll() is not None or time.monotonic() > end:
                    log_file = self.out / "logs" / f"kdelay-{node}.log"
                    text = log_file.read_text() if log_file.exists() else ""
                    raise TestbedError(f"the kernel delay of {node} did not start: {text.strip()[-500:]}")
                time.sleep(POLL_S)
            path.unlink()

    def _await_listening(self, node: str, listen: str) -> None:
        """Behind a delay proxy, wait until ``node``'s server listens on ``listen`` before its children start:
        the proxy accepts at once, so a child that dials earlier would see its connection closed (with TLS:
        a failed handshake) instead of a refused one that it retries."""
        if not listen.startswith("127.0.0.1:"):
            return
        end = time.monotonic() + STARTUP_S  # (the proxy listens on the same port, on the public address)
        while not run_cmd(in_ns(self.net.nodes[node].ns, ["ss", "-Hltn", "src", listen]), check=False).strip():
            if self.procs[node].poll() is not None:
                return  # it died: _wait reports its exit code
            if time.monotonic() > end:
                raise TestbedError(f"{node} did not listen on {listen} within {STARTUP_S:g}s")
            time.sleep(0.05)

    def _role_env(self, node: str) -> dict[str, str]:
        """A node with a trace in its own table replays its compute column (common/network_spec.py)."""
        return compute_trace_env(self.profile, node, self.spec_path.parent, self._replay_t0_ns)

    def start_roles(self) -> None:
        dev = self.device
        topo = self.topo
        sec = self._security()
        listen, _ = self._serve_addr(topo.server)
        web, web_env = self._web()
        self._start("ps", self.net.nodes[topo.server].ns,
                    RoleCommand("server", str(self.spec_path), listen=listen, security=sec, device=dev,
                                extra=("--out", str(self.out), "--force", *web)).argv(),
                    env={**web_env, **self._role_env(topo.server)})
        self._await_listening(topo.server, listen)
        edge_listen: dict[str, str] = {}
        for e in topo.edges:
            listen, public = self._serve_addr(e)
            self._start(e, self.net.nodes[e].ns,
                        RoleCommand("edge", e, connect=self.plan.connect(e), listen=listen, advertise=public,
                                    security=sec, device=dev).argv(), env=self._role_env(e))
            edge_listen[e] = listen
        for n, listen in edge_listen.items():
            self._await_listening(n, listen)
        for c in topo.clients:
            listen, public = self._serve_addr(c) if self.plan.node(c).port is not None else (None, None)
            self._start(c, self.net.nodes[c].ns,
                        RoleCommand("client", c, connect=self.plan.connect(c), listen=listen, advertise=public,
                                    security=sec, device=dev).argv(), env=self._role_env(c))

    def stop_roles(self) -> None:
        self.children.stop(5.0)

    # -- the run --------------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self._tearing_down:
            raise Interrupted(signum)

    def _write_plan(self) -> None:
        plan = {
            "tag": self.net.tag,
            "bridge_namespace": self.net.bridge_ns,
            "subnet": str(self.net.subnet),
            "nodes": {n: asdict(nn) for n, nn in self.net.nodes.items()},
            "links": [asdict(lk) for lk in self.links],
            "wire_counters": self.counters.backend,
            "delay": self.delay_mode,
            "tls": str(self.tls_dir) if self.tls_dir else None,
            "http": self.http.url if self.http else None,
            "pids": {n: p.pid for n, p in self.procs.items()},
        }
        (self.out / "testbed.json").write_text(json.dumps(plan, indent=1))

    def _wait(self, clock: RoundClock, timeout_s: float | None) -> int:
        ps = self.procs["ps"]
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while ps.poll() is None:
            clock.poll()
            if end is not None and time.monotonic() > end:
                raise TestbedError(f"the run did not finish within --timeout {timeout_s:g}s")
            time.sleep(POLL_S)
        clock.poll()
        rc = ps.returncode
        children = [p for n, p in self.procs.items()
                    if n != "ps" and not n.startswith(("proxy-", "http-", "kdelay-"))]
        stop = time.monotonic() + (STOP_GRACE_S if rc == 0 else 0.0)  # a failed PS: no Bye is coming
        for p in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.01, stop - time.monotonic()))
        return rc

    # -- the testbed contract (deploy/contract.py) ----------------------------------------------------------
    def start(self) -> None:
        """Certificates, namespaces, shaping, counters; then the roles."""
        self.out.mkdir(parents=True, exist_ok=True)
        if self.tls == testbed_tls.AUTO:
            self.tls_dir = testbed_tls.auto_folder(self.out, self.net)
        elif self.tls is not None:
            self.tls_dir = Path(self.tls).resolve()
        self.net.create()
        rated = {(a, b) for _, links in self.steps for lk in links for a, b, s in lk.directions()
                 if s.mbit is not None}
        lossy = {(a, b) for _, links in self.steps for lk in links for a, b, s in lk.directions() if s.loss}
        self.shapes = [shaping.LinkShape(a, b, s.mbit) for lk in self.links for a, b, s in lk.directions()
                       if (a, b) in rated]
        shaping.apply_shaping(self.net, self.shapes)
        self.losses = [loss.LinkLoss(a, b, s.loss) for lk in self.links for a, b, s in lk.directions()
                       if (a, b) in lossy]
        if self.losses and not kernel_bytes.nft_available():
            raise TestbedError("a [network] loss needs nftables (apt-get install -y nftables)")
        loss.apply_loss(self.net, self.losses, self.loss_tables)
        if any(self.held.values()):
            self.delay_mode = self._choose_delay()
            if self.delay_mode == "kernel":
                self._start_kernel_delay()
        self.counters.install()
        self._replay_t0_ns = time.time_ns()
        self.replay.start()  # the traces' time 0: shaping in place, the roles about to start
        self.start_roles()
        self._write_plan()

    def _step(self, t: float) -> None:
        """A trace step: every direction whose rate, loss or delay changed at ``t`` is re-set (Replay's thread)."""
        links = dict(self.steps)[t]
        before = {(a, b): s for lk in self.links for a, b, s in lk.directions()}
        installed = {(s.a, s.b) for s in self.shapes}
        for lk in links:
            for a, b, s in lk.directions():
                if s.mbit != before[(a, b)].mbit and (a, b) in installed:
                    for ns, cmd in shaping.rate_changes(self.net, self.shapes, a, b, s.mbit):
                        run_cmd(in_ns(ns, cmd))
        lossy = {(x.src, x.dst) for x in self.losses}
        loss.apply_loss(self.net, [loss.LinkLoss(a, b, s.loss) for lk in links for a, b, s in lk.directions()
                                   if (a, b) in lossy], self.loss_tables)
        for node, control in self.controls.items():
            profile.write_holds(control, self._holds(node, links))
        for node, control in self.kdelay_controls.items():
            kernel_delay.write_control(control, self._kernel_holds(node, links))
        self.links = links
        log.info("trace step at %gs applied", t)

    def started_lines(self) -> list[str]:
        """What the testbed is, once started: namespaces, shaped and lossy directions, counters, link security,
        logs; the live page's address (``fedhop testbed up`` prints them)."""
        lines = [f"{len(self.net.nodes)} namespaces ({self.net.tag}-*) on {self.net.subnet}, "
                 f"{len(self.shapes)} rate-limited link directions, {len(self.losses)} lossy, "
                 f"{sum(map(len, self.held.values()))} delayed"
                 f"{f' ({self.delay_mode})' if self.delay_mode else ''}, "
                 f"wire counters: {self.counters.backend}, links: "
                 f"{'mutual TLS' if self.tls_dir else 'plaintext'}; logs in {self.out / 'logs'}"]
        if self.http:
            lines.append(f"live page: {self.http.url}")
        return lines

    def wait(self, timeout_s: float | None = None) -> int:
        """The PS's exit code, the round ends noted on the way; raises TestbedError after ``timeout_s``."""
        return self._wait(self.clock, timeout_s)

    def wire(self) -> WireReading:
        """The counters once the links are quiet. A delayed link (kernel delay or proxy) may still hold the last
        packets of the roles' goodbyes when the PS exits: counted at the sender, not yet at the receiver. So the
        counters are read again, the longest hold of the run apart, until two readings agree (at most
        ``QUIET_WAIT_S``); without a delay one reading is final."""
        hold = max((sh.delay_ms + sh.jitter_ms for _, links in self.steps for lk in links
                    for _, _, sh in lk.directions()), default=0.0) / 1000.0
        reading = self.counters.read()
        end = time.monotonic() + QUIET_WAIT_S
        while hold > 0 and time.monotonic() < end:
            time.sleep(hold + 0.05)  # (the poll interval: how long a packet can stay held)
            again = self.counters.read()
            if again.rows == reading.rows:
                return again
            reading = again
        return reading

    def stop(self) -> None:
        """Every process, the live page's port, every namespace (with its veths, qdiscs and counters)."""
        self.replay.stop()
        try:
            self.stop_roles()
            if self.http:
                self.http.close()
        finally:
            left = self.net.destroy()
            if left:
                log.error("could not remove namespaces %s; `fedhop testbed clean` retries", left)

    def run(self, on_started: Callable[[Testbed], None] | None = None) -> TestbedResult:
        """Start, wait for the PS, collect, stop (also on failure, SIGINT or SIGTERM: :class:`Interrupted`);
        ``on_started(self)`` once everything runs."""
        saved = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        notes: list[str] = []
        try:
            self.start()
            if on_started is not None:
                on_started(self)
            rc = self.wait(self.timeout_s)
            rounds = self.clock.rows()
            _write_csv(self.out / "round_times.csv", rounds, ["round", "end_s", "round_s"])
            reading = self.wire()
            notes += reading.notes
            levels = contract.collect(self.out, reading, self.order)  # wire.csv, link_bytes.csv
            tcp = kernel_bytes.tcp_stats(self.net)
            _write_csv(self.out / "tcp.csv", [{"node": n, **v} for n, v in tcp.items()],
                       ["node", "OutSegs", "RetransSegs"])
            retrans = {n: v["RetransSegs"] for n, v in tcp.items() if v["RetransSegs"]}
            if retrans:
                notes.append(f"TCP retransmitted segments (counted in wire bytes): {retrans}")
            (self.out / "tc.json").write_text(json.dumps(shaping.class_stats(self.net, self.shapes), indent=1))
            if self.losses:
                (self.out / "loss.json").write_text(json.dumps(loss.drop_counts(self.losses, self.loss_tables),
                                                               indent=1))
            self.replay.stop()
            if self.traces:
                (self.out / "trace.json").write_text(json.dumps({
                    "t0_unix_ns": self._replay_t0_ns, "rounds_start_unix_ns": self.clock.start_ns,
                    "steps": [{"t": t, "late_s": round(late, 4)} for t, late in self.replay.applied],
                    "errors": self.replay.errors, "files": {k: tr.path for k, tr in self.traces.items()}}, indent=1))
                notes += [f"trace step failed: {e}" for e in self.replay.errors]
            if levels is None:
                notes.append(f"the PS wrote no links.csv (exit code {rc}): no per-link table")
            return TestbedResult(rc=rc, out=self.out, levels=levels or [], rounds=rounds, notes=notes)
        finally:
            self._tearing_down = True
            try:
                self.stop()
            finally:
                for s, h in saved.items():
                    signal.signal(s, h)


def _write_csv(path: Path, rows: list[dict[str, Any]], header: list[str]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(rows)


def open_testbed(spec_path: Path, out: Path | None, *, device: str | None = None, timeout_s: float | None = None,
                 tls: str | None = None, http: str | None = None, http_token: str | None = None) -> Testbed:
    """A planned testbed for ``spec_path`` (nothing created yet): the host checked first, the run folder
    ``out`` or ``runs/<time>-<name>-testbed``. Raises :class:`TestbedError` (host, links, certificates) or the
    spec's ``SpecError``."""
    from fedhop.run_folders import default_out

    check_host()
    return Testbed(spec_path, out if out is not None else default_out(RunSpec.load(spec_path).name, "testbed"),
                   device=device, timeout_s=timeout_s, tls=tls, http=http, http_token=http_token)


def clean() -> list[str]:
    """Remove what testbeds whose owner died left behind; the namespaces removed. Raises :class:`TestbedError`
    when the host cannot run a testbed (not root, tools missing)."""
    from fedhop.deploy.netns import clean_stale

    check_host()
    return clean_stale()
