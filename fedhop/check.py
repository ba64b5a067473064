"""``fedhop check``: integration-test a protocol (issue 16, section 4).

One spec runs through both engines: the in-process engine (the oracle, no sockets) and real processes
(:func:`fedhop.launch.launch`: the PS here, every edge and client host a child process). The checks:

* ``model``: the final models are bit-identical;
* ``payload``: payload bytes per (src, dst, kind, phase, round) are equal across engines;
* ``formula``: per round they equal the protocol's declared formula (``Algorithm.payload_per_round``), when it
  declares one that covers the spec (else the row says ``skipped`` and why); what a protocol's own ``final``
  step sends to the PS after the last round (a collect) is outside the formula;
* ``crash``: ``fedhop launch`` SIGKILLed (PS and children) after round R and resumed with ``launch --resume``
  ends with the oracle's model and payload per link;
* ``fault``: one client process SIGKILLed after round R: the run still exits 0, records every round, and the
  missing log names it (the default victim is a client the protocol still asks after R).

Finding the processes to kill reads ``/proc`` (Linux), as the namespace testbed does.

Every check gives a :class:`Verdict` (a failure is a row with a reason, never a traceback); :func:`check` runs
them all into a :class:`CheckReport`. The checks hold for protocols whose decisions do not depend on arrival
order (every built-in but FedAsync, FedBuff and FOCUS closed at a quorum), and for those by replay: their oracle
follows the arrival order the networked run recorded (``fedhop simulate --replay``). Their crash check replays the
resumed run from the checkpoint at the kill (:func:`replay_refused` says when it cannot: clients with state). The kill
moments are chosen with the PS's test gate (``common/testhooks.py``), not with sleeps. :mod:`fedhop.testing`
exposes the same checks to a user's pytest suite.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from fedhop.common.engine.results import RunResult
    from fedhop.common.spec import RunSpec

CHECKS = ("model", "payload", "formula", "crash", "fault")
SKIPPABLE = frozenset({"formula", "crash", "fault"})
GATE_ENV = "FEDHOP_TEST_GATE"
MAX_SHOWN = 4  # differing keys named in a row's detail


@dataclass(frozen=True)
class Verdict:
    """One row of the table: ``ok`` True (holds), False (fails) or None (skipped, with the reason)."""

    check: str
    ok: bool | None
    detail: str = ""

    @property
    def verdict(self) -> str:
        return "skipped" if self.ok is None else ("ok" if self.ok else "FAIL")


@dataclass(frozen=True)
class CheckReport:
    """Every check's verdict for one spec; ``ok`` when none failed (skipped ones do not fail a check)."""

    spec_name: str
    algorithm: str
    verdicts: tuple[Verdict, ...]

    @property
    def ok(self) -> bool:
        return all(v.ok is not False for v in self.verdicts)

    def verdict(self, check: str) -> Verdict:
        return next(v for v in self.verdicts if v.check == check)

    def table(self) -> str:
        """The verdict table: check | verdict | detail."""
        w = max(len("check"), *(len(v.check) for v in self.verdicts))
        lines = [f"{'check':<{w}}  verdict  detail", f"{'-' * w}  -------  ------"]
        lines += [f"{v.check:<{w}}  {v.verdict:<7}  {v.detail}" for v in self.verdicts]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec_name, "algorithm": self.algorithm, "ok": self.ok,
                "verdicts": [{"check": v.check, "verdict": v.verdict, "detail": v.detail} for v in self.verdicts]}


@dataclass(frozen=True)
class KillClient:
    """The fault check's victim: ``client`` killed once ``after_round`` rounds are done (1-based)."""

    client: str
    after_round: int

    @classmethod
    def parse(cls, text: str) -> KillClient:
        """``ID@ROUND``, e.g. ``client-1@2``; ValueError naming the form otherwise."""
        node, sep, r = text.partition("@")
        if not sep or not node or not r.isdigit():
            raise ValueError(f"--kill-client {text!r}: expected ID@ROUND, e.g. client-1@2")
        return cls(node, int(r))


@dataclass(frozen=True)
class CheckOptions:
    """How :func:`check` runs: ``out`` holds one run folder per engine run (network/, crash/, fault/);
    ``crash_round``: the PS is killed after this many rounds (default: half the run); ``kill``: the fault check's
    victim (default: the last client after round 1); ``skip``: checks not to run (formula, crash, fault);
    ``timeout_s``: the longest a launched run may take."""

    out: Path
    crash_round: int | None = None
    kill: KillClient | None = None
    skip: frozenset[str] = field(default_factory=frozenset)
    device: str = "cpu"
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        unknown = set(self.skip) - SKIPPABLE
        if unknown:
            raise ValueError(f"cannot skip {sorted(unknown)}: skippable checks are {sorted(SKIPPABLE)}")


@dataclass(frozen=True)
class EngineRuns:
    """The two engines' results of one spec (``network`` None, with ``network_error``, when launch failed)."""

    oracle: RunResult
    network: RunResult | None
    network_error: str = ""


# -- running the engines ------------------------------------------------------------------------------------------
def run_oracle(spec: RunSpec, device: str = "cpu", replay: list[dict[str, Any]] | None = None) -> RunResult:
    """The in-process engine's run of ``spec``; ``replay``: a recorded run's rounds, whose arrival order its
    asynchronous collects follow (``fedhop simulate --replay``)."""
    from fedhop.common.engine.inprocess import InProcessEngine

    return InProcessEngine(spec, device=device, replay=replay).run()


def order_dependent(result: RunResult | None) -> bool:
    """Whether a run took replies in arrival order (``Comm.collect``, a scatter with a ``quorum``): its rounds
    record the order (``arrivals``), and its oracle is the replay of that order."""
    return result is not None and any(r.get("arrivals") for r in result.rounds)


def run_network(spec: RunSpec, out: Path, device: str = "cpu") -> RunResult:
    """``spec`` over real processes (:func:`fedhop.launch.launch`) into the run folder ``out`` (which the PS
    writes)."""
    from fedhop.launch import launch

    return launch(spec, out, device=device)


def run_engines(spec: RunSpec, out: Path, device: str = "cpu") -> EngineRuns:
    """Both engines' runs of ``spec``; a networked run that fails is named in ``network_error``. The networked
    run goes first: for an asynchronous protocol the oracle replays the order it recorded."""
    try:
        network = run_network(spec, out, device)
    except Exception as e:  # noqa: BLE001  (a failed run is a verdict, not a traceback)
        return EngineRuns(run_oracle(spec, device), None, f"the networked run failed: {_reason(e)}")
    return EngineRuns(run_oracle(spec, device, network.rounds if order_dependent(network) else None), network)


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# -- the checks ---------------------------------------------------------------------------------------------------
def model_verdict(expected: Mapping[str, torch.Tensor], got: Mapping[str, torch.Tensor] | None,
                  what: str = "networked") -> Verdict:
    """``model``: ``got`` (the ``what`` run's final model) bit-identical to ``expected``."""
    import torch

    if got is None:
        return Verdict("model", False, f"no {what} model")
    if list(got) != list(expected):
        return Verdict("model", False, f"tensor names differ: {list(expected)} vs {list(got)}"[:300])
    differ = [k for k in expected if got[k].dtype != expected[k].dtype or got[k].shape != expected[k].shape
              or not torch.equal(got[k], expected[k])]
    if differ:
        gaps = [float((got[k].double() - expected[k].double()).abs().max()) for k in differ
                if got[k].shape == expected[k].shape]
        gap = f"largest difference {max(gaps):.3g}" if gaps else "shapes or dtypes differ"
        return Verdict("model", False, f"{len(differ)} of {len(expected)} tensors differ ({_names(differ)}); {gap}")
    n = sum(t.numel() for t in expected.values())
    return Verdict("model", True, f"bit-identical ({len(expected)} tensors, {n} values)")


def work_payload(links: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str, str, int], int]:
    """Payload bytes per (src, dst, kind, phase, round) of the task traffic (the networked engine's control
    messages, which carry no payload and exist only there, left out)."""
    from fedhop.common.wire.control import CONTROL_KINDS

    out: dict[tuple[str, str, str, str, int], int] = {}
    for r in links:
        if r["kind"] in CONTROL_KINDS:
            continue
        k = (r["src"], r["dst"], r["kind"], r["phase"], int(r["round"]))
        out[k] = out.get(k, 0) + int(r["payload_bytes"])
    return out


def payload_verdict(oracle: RunResult, network: RunResult | None) -> Verdict:
    """``payload``: the same payload bytes per link, kind, phase and round in both engines."""
    if network is None:
        return Verdict("payload", False, "no networked run")
    a, b = work_payload(oracle.links), work_payload(network.links)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if differ:
        shown = "; ".join(f"{s}->{d} {kind} {ph} r{t}: {a.get((s, d, kind, ph, t))} vs {b.get((s, d, kind, ph, t))}"
                          for s, d, kind, ph, t in differ[:MAX_SHOWN])
        return Verdict("payload", False, f"{len(differ)} of {len(set(a) | set(b))} link rows differ "
                                         f"(in-process vs network): {shown}")
    return Verdict("payload", True, f"{len(a)} link rows equal, {sum(a.values())} payload bytes")


def formula_verdict(spec: RunSpec, result: RunResult) -> Verdict:
    """``formula``: every round's payload per (src, dst, kind) equals the algorithm's declared
    ``payload_per_round``; skipped when it declares none or the formula does not cover the spec. A protocol with
    its own ``final`` step (a collect after the last round, counted in the last round) may add messages to the PS
    of kinds its formula does not name in the last round; the row says how many bytes."""
    from fedhop.common.engine.api import final_model, get_algorithm
    from fedhop.common.topology import SERVER, build_topology
    from fedhop.common.wire.bundle import payload_bytes

    algo = get_algorithm(spec.algorithm.name)
    if algo.payload_per_round is None:
        return Verdict("formula", None, f"{algo.name} declares no payload formula")
    expected = algo.payload_per_round(spec, build_topology(spec.topology, spec.seed), payload_bytes(result.final))
    if expected is None:
        return Verdict("formula", None, f"{algo.name}'s formula does not cover this spec's options")
    per_round: dict[int, dict[tuple[str, str, str], int]] = {t: {} for t in range(spec.rounds)}
    for (s, d, kind, _, t), n in work_payload(result.links).items():
        if n and t >= 0:  # rounds only: an algorithm's set-up step (round -1) is outside the per-round formula
            row = per_round.setdefault(t, {})
            row[(s, d, kind)] = row.get((s, d, kind), 0) + n
    want = {k: v for k, v in expected.items() if v}
    # a protocol's own final step (Algorithm.final: e.g. the PS collecting the clients' models) runs after the last
    # round, on its meter row: outside the per-round formula are the messages to the PS of kinds the formula lacks
    declared = {kind for _, _, kind in want}
    final_bytes = 0
    if algo.final is not final_model and spec.rounds - 1 in per_round:
        last = per_round[spec.rounds - 1]
        outside = [k for k in last if k[1] == SERVER and k not in want and k[2] not in declared]
        final_bytes = sum(last.pop(k) for k in outside)
    for t, got in sorted(per_round.items()):
        if got != want:
            differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            shown = "; ".join(f"{s}->{d} {kind}: {got.get((s, d, kind), 0)} vs declared {want.get((s, d, kind), 0)}"
                              for s, d, kind in differ[:MAX_SHOWN])
            return Verdict("formula", False, f"round {t + 1}: {len(differ)} links differ from the declared "
                                             f"formula: {shown}")
    after = f" (and {final_bytes} bytes of the final step to the PS)" if final_bytes else ""
    return Verdict("formula", True, f"{sum(want.values())} payload bytes per round over {len(want)} links, "
                                    f"as declared, in all {spec.rounds} rounds{after}")


def crash_verdict(spec: RunSpec, out: Path, oracle: RunResult, after_round: int | None = None,
                  device: str = "cpu", timeout_s: float = 600.0) -> Verdict:
    """``crash``: ``fedhop launch`` SIGKILLed (the PS and every child) once ``after_round`` rounds are done and
    checkpointed, then ``fedhop launch --resume``: the final model equals the oracle's. For an order-dependent
    ``oracle`` (its rounds record ``arrivals``) the oracle is instead the in-process engine resumed from a copy of
    the PS's checkpoint at the kill, replaying the resumed run's recorded order (:func:`replay_refused`: when that
    cannot be exact, the row is skipped, saying why)."""
    if spec.rounds < 2:
        return Verdict("crash", None, "needs at least 2 rounds (the PS is killed between two rounds)")
    replayed = order_dependent(oracle)
    if replayed:
        why = replay_refused(spec)
        if why:
            return Verdict("crash", None, why)
    every = spec.checkpoint_every
    if every == 0:
        return Verdict("crash", None, "checkpoint_every = 0: the run keeps no checkpoint to resume from")
    # default: half the run, on a round that is checkpointed (a later kill redoes the rounds since)
    r = after_round if after_round is not None else max(1, (spec.rounds // 2) // every * every)
    if not 0 < r < spec.rounds:
        return Verdict("crash", False, f"--crash-round {r} must lie between 1 and rounds - 1 = {spec.rounds - 1}")
    gate = _gate_folder(out)
    (gate / f"stop-{r}").touch()
    run = (out / "run").resolve()
    spec_file = out / "spec.toml"
    spec_file.write_text(spec.to_toml())
    first = _launch([str(spec_file), "--out", str(run)], gate, out / "launch.log", device)
    try:
        if not _await(gate / f"at-{r}", first, timeout_s):
            return Verdict("crash", False, f"the first launch ended (exit {first.poll()}) before round {r} "
                                           f"(log: {out / 'launch.log'})")
    except subprocess.TimeoutExpired:
        return Verdict("crash", False, f"the first launch did not reach round {r} within {timeout_s:g} s")
    finally:
        _kill_tree(first, run)
    (gate / f"stop-{r}").unlink()
    killed = out / "killed-checkpoints"  # the PS's checkpoints at the kill (the resumed run adds and prunes its own)
    if replayed:
        if killed.exists():
            shutil.rmtree(killed)
        shutil.copytree(run / "checkpoints" / "ps", killed)
    again = _launch(["--resume", str(run)], gate, out / "resume.log", device)
    try:
        code = again.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return Verdict("crash", False, f"the resumed launch did not end within {timeout_s:g} s")
    finally:
        _kill_tree(again, run)
    if code != 0:
        return Verdict("crash", False, f"the resumed launch exited {code} (log: {out / 'resume.log'})")
    model = _load_model(run)
    results = _results(run)
    how = ""
    if replayed:  # the oracle of the resumed run: the same checkpoint, resumed in-process, its order replayed
        from fedhop.common.engine.inprocess import InProcessEngine, ReplayError

        how = "; checked by replay: the in-process engine resumed from the same checkpoint follows the order the " \
              "resumed run recorded"
        try:
            oracle = InProcessEngine(spec, device=device, replay=results["rounds"]).run(checkpoints=killed,
                                                                                         resume=True)
        except ReplayError as e:
            return Verdict("crash", False, f"killed after round {r}, resumed: the replay of the resumed run took "
                                           f"another turn: {e}")
    v = model_verdict(oracle.final, model, "resumed")
    if not v.ok:
        return Verdict("crash", False, f"killed after round {r}, resumed: {v.detail}{how}")
    # every round's payload per link, those before the kill restored from the checkpoint, equals the oracle's
    # (work redone after a kill is counted apart, phase "redo": none when the kill falls between rounds)
    rows = [{**row, "round": int(row["round"]) - 1} for row in results["links"] if row["phase"] != "redo"]
    a, b = work_payload(oracle.links), work_payload(rows)
    # (a row only one run has is 0 payload bytes there: a resumed protocol may add control messages, e.g. FOCUS's
    # client flow kicks its clients again)
    differ = sorted(k for k in set(a) | set(b) if a.get(k, 0) != b.get(k, 0))
    if differ:
        return Verdict("crash", False, f"killed after round {r}, resumed: the model is bit-identical, but "
                                       f"{len(differ)} link rows carry other payload bytes (first: {differ[0]}){how}")
    return Verdict("crash", True, f"killed after round {r}, resumed: {v.detail}; payload per link equal{how}")


def replay_refused(spec: RunSpec) -> str:
    """Why the crash check of an order-dependent protocol cannot be made exact for ``spec`` (empty: it can).

    Its resumed run cannot equal the uninterrupted one: the tasks in flight at the kill are lost, and the
    resumed PS submits them again with a newer model. What is checked instead is the resumed run against the
    in-process engine resumed from the same checkpoint, replaying the order the resumed run recorded. That needs
    the whole run's state at the kill in the PS's checkpoint, which over the network holds the PS's only: a
    protocol whose edges or clients keep state of their own (``Algorithm.node_state``) keeps it in their own
    stores, which hold a later round by the time the check could read them."""
    from fedhop.common.engine.api import get_algorithm
    from fedhop.common.topology import build_topology

    algo = get_algorithm(spec.algorithm.name)
    topo = build_topology(spec.topology, spec.seed)
    stateful = sorted({topo.role(n) for n in topo.all_nodes() if n != topo.server
                       and algo.node_state(topo.role(n)) is not None})
    if not stateful:
        return ""
    return (f"not exact for {algo.name} here: it takes replies in arrival order, so the resumed run is checked by "
            f"replaying it from the checkpoint at the kill, which over the network holds the PS's state only; its "
            f"{' and '.join(r + 's' for r in stateful)} keep state of their own (node_state), which no replay "
            "can restore as it was at the kill")


def asked_after(oracle: RunResult, client: str, after_round: int) -> bool:
    """Whether the protocol sends ``client`` a task after ``after_round`` rounds (1-based), in the oracle's run."""
    return any(r["dst"] == client and r["phase"] == "request" and int(r["round"]) >= after_round
               for r in oracle.links)


def default_victim(spec: RunSpec, oracle: RunResult | None) -> KillClient:
    """The fault check's default: after round 1, the last client (canonical order) that the protocol still
    asks for work later (a client a drawn participation or an edge walk never calls again would test nothing)."""
    from fedhop.common.topology import build_topology

    clients = build_topology(spec.topology, spec.seed).clients
    if oracle is not None:
        for c in reversed(clients):
            if asked_after(oracle, c, 1):
                return KillClient(c, 1)
    return KillClient(clients[-1], 1)


def fault_verdict(spec: RunSpec, out: Path, kill: KillClient | None = None, device: str = "cpu",
                  timeout_s: float = 600.0, oracle: RunResult | None = None) -> Verdict:
    """``fault``: one client process SIGKILLed once ``kill.after_round`` rounds are done: the run goes on under
    the protocol's rule for a missing participant, exits 0 and its missing log names the client. With the
    ``oracle``'s run: the default victim is a client the protocol still asks after the kill, and a victim it
    never asks again is a skipped row (the missing log could not name it)."""
    from fedhop.common.topology import build_topology

    if spec.rounds < 2:
        return Verdict("fault", None, "needs at least 2 rounds (a client is killed between two rounds)")
    topo = build_topology(spec.topology, spec.seed)
    kill = kill or default_victim(spec, oracle)
    if kill.client not in topo.clients:
        return Verdict("fault", False, f"--kill-client {kill.client!r}: not a client of this spec "
                                       f"({topo.clients[0]}..{topo.clients[-1]})")
    if not 0 < kill.after_round < spec.rounds:
        return Verdict("fault", False, f"--kill-client round {kill.after_round} must lie between 1 and rounds - 1 "
                                       f"= {spec.rounds - 1}")
    if oracle is not None and not asked_after(oracle, kill.client, kill.after_round):
        return Verdict("fault", None, f"the protocol never asks {kill.client} for work after round "
                                      f"{kill.after_round}: nothing to miss (choose another --kill-client)")
    gate = _gate_folder(out)
    r = kill.after_round
    (gate / f"stop-{r}").touch()
    run = (out / "run").resolve()
    spec_file = out / "spec.toml"
    spec_file.write_text(spec.to_toml())
    proc = _launch([str(spec_file), "--out", str(run), "--clients-per-process", "1"], gate, out / "launch.log",
                   device)
    try:
        if not _await(gate / f"at-{r}", proc, timeout_s):
            return Verdict("fault", False, f"the launch ended (exit {proc.poll()}) before round {r} "
                                           f"(log: {out / 'launch.log'})")
        victims = _pids(run, kill.client)
        if len(victims) != 1:
            return Verdict("fault", False, f"found {len(victims)} processes of {kill.client}, expected one")
        os.kill(victims[0], signal.SIGKILL)
        (gate / f"go-{r}").touch()
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return Verdict("fault", False, f"the run did not end within {timeout_s:g} s after {kill.client} was killed")
    finally:
        _kill_tree(proc, run)
    if code != 0:
        return Verdict("fault", False, f"with {kill.client} killed after round {r} the run exited {code}, not 0 "
                                       f"(log: {out / 'launch.log'})")
    try:
        results = _results(run)
        missing, done = results["missing"], len(results["rounds"])
    except (OSError, ValueError, KeyError) as e:
        return Verdict("fault", False, f"no missing log in {run / 'results.json'}: {_reason(e)}")
    if done != spec.rounds:
        return Verdict("fault", False, f"with {kill.client} killed after round {r} the run recorded {done} of "
                                       f"{spec.rounds} rounds")
    named = sorted({m["node"] for m in missing})
    if kill.client not in named:
        return Verdict("fault", False, f"{kill.client} killed after round {r}, but the missing log names "
                                       f"{named or 'no one'}")
    others = [n for n in named if n != kill.client]
    rounds = sorted({int(m["round"]) for m in missing if m["node"] == kill.client})
    return Verdict("fault", True, f"{kill.client} killed after round {r}: the run finished (exit 0), missing in "
                                  f"rounds {rounds[0]}..{rounds[-1]}" + (f"; also missing: {others}" if others else ""))


def check(spec: RunSpec, options: CheckOptions) -> CheckReport:
    """Every check of ``spec`` (those in ``options.skip`` reported as skipped). The runs go to ``options.out``'s
    ``network/``, ``crash/`` and ``fault/``, emptied first (a run folder left there would be resumed)."""
    options.out.mkdir(parents=True, exist_ok=True)
    for sub in ("network", "crash", "fault"):
        if (options.out / sub).is_dir():
            shutil.rmtree(options.out / sub)
    try:
        runs = run_engines(spec, options.out / "network", options.device)
    except Exception as e:  # noqa: BLE001  (the oracle itself failed: every check fails, saying so)
        why = f"the in-process run failed: {_reason(e)}"
        return CheckReport(spec.name, spec.algorithm.name, tuple(Verdict(c, False, why) for c in CHECKS))
    net = runs.network
    rows: list[Verdict] = []
    if net is None:
        rows += [Verdict("model", False, runs.network_error), Verdict("payload", False, runs.network_error)]
    else:
        rows += [model_verdict(runs.oracle.final, net.final), payload_verdict(runs.oracle, net)]
    if "formula" in options.skip:
        rows.append(Verdict("formula", None, "skipped (--skip)"))
    else:
        rows.append(formula_verdict(spec, runs.oracle))
    if "crash" in options.skip:
        rows.append(Verdict("crash", None, "skipped (--skip)"))
    else:
        rows.append(_guarded("crash", lambda: crash_verdict(spec, options.out / "crash", runs.oracle,
                                                            options.crash_round, options.device, options.timeout_s)))
    if "fault" in options.skip:
        rows.append(Verdict("fault", None, "skipped (--skip)"))
    else:
        rows.append(_guarded("fault", lambda: fault_verdict(spec, options.out / "fault", options.kill,
                                                            options.device, options.timeout_s, runs.oracle)))
    return CheckReport(spec.name, spec.algorithm.name, tuple(rows))


def _guarded(name: str, fn: Callable[[], Verdict]) -> Verdict:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (a check that breaks is a failed row, not a traceback)
        return Verdict(name, False, f"the check itself failed: {_reason(e)}")


# -- processes ----------------------------------------------------------------------------------------------------
def _names(keys: list[str]) -> str:
    return ", ".join(keys[:MAX_SHOWN]) + (", ..." if len(keys) > MAX_SHOWN else "")


def _gate_folder(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    gate = out / "gate"
    gate.mkdir(exist_ok=True)
    for f in gate.iterdir():
        f.unlink()
    return gate.resolve()


def _launch(args: list[str], gate: Path, log: Path, device: str) -> subprocess.Popen[bytes]:
    """``fedhop launch ARGS`` in its own session, its processes marked by ``FEDHOP_TEST_GATE=gate``."""
    env = {**os.environ, GATE_ENV: str(gate)}
    with log.open("ab") as f:
        return subprocess.Popen([sys.executable, "-m", "fedhop", "launch", *args, "--quiet", "--http", "off",
                                 "--device", device], stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _await(path: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Until ``path`` exists (True) or ``proc`` ended (False); TimeoutExpired after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            return path.exists()
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        time.sleep(0.05)
    return True


def _pids(run: Path, node: str | None = None) -> list[int]:
    """The role processes a launch into ``run`` started (their command line names ``--state-dir run/state``;
    launch gives every child that), or only ``node``'s (``--id node``). Linux /proc; the environment cannot
    mark them: a forked child's title takes the memory of its environment."""
    state = re.compile(rb"--state-dir[\s\x00]+" + re.escape(str(run.resolve() / "state").encode()) + rb"(\s|\x00|$)")
    ident = re.compile(rb"--id[\s\x00]+" + re.escape(node.encode()) + rb"(\s|\x00|$)") if node else None
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if state.search(cmd) and (ident is None or ident.search(cmd)):
            found.append(int(p.name))
    return found


def _kill_tree(proc: subprocess.Popen[bytes], run: Path) -> None:
    """SIGKILL a launch, its process group (its fork server) and every role process it started (each runs in
    its own session)."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.wait(30)
    for pid in _pids(run):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _results(run: Path) -> dict[str, Any]:
    """A run folder's results.json."""
    import json

    return json.loads((run / "results.json").read_text())


def _load_model(run: Path) -> dict[str, torch.Tensor] | None:
    import torch

    f = run / "model.pt"
    return torch.load(f) if f.is_file() else None
