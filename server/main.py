"""``fedhop server``: the parameter server process (docs/design.md sections 5-6).

The PS owns the RunSpec. It serves ``Parent.Session``, waits until every node of the topology has joined
(edges report when their clients have joined, with data sizes), runs the algorithm's driver with a
:class:`~fedhop.transport.netcomm.NetComm`, tells everyone to stop, merges every process's byte meter and missing
log, and writes the run folder.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedhop.common import heap, run_lock
from fedhop.common.engine.api import NodeContext, get_algorithm
from fedhop.common.engine.base import MissingLog
from fedhop.common.engine.checkpoint import CheckpointStore
from fedhop.common.engine.events import RunEvents, round_records
from fedhop.common.engine.loop import Start
from fedhop.common.engine.results import RunResult, write_run_folder
from fedhop.common.engine.run import Run
from fedhop.common.engine.run_checkpoint import RunCheckpoint, load_latest, ps_store
from fedhop.common.engine.workspace import Workspace
from fedhop.common.exit_codes import ExitCode, Fatal
from fedhop.common.malloc_tuning import fix_mmap_threshold
from fedhop.common.spec import RunSpec
from fedhop.common.testhooks import gate
from fedhop.common.user_code import CODE_DIGEST, code_digest
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.aio_server import make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.health import add_health
from fedhop.transport.netcomm import NetComm
from fedhop.transport.parent import serve_parent
from fedhop.transport.session import HubConfig, HubListener, ParentHub

log = logging.getLogger("fedhop.server")


class JoinTimeout(RuntimeError):
    """No node of the topology joined within transport.join_timeout_s."""


class StartupFailed(RuntimeError):
    """A node of the federation died before the run started (reported by ``startup_failure``)."""


class Interrupted(Exception):
    """Ctrl-C during the run: ``result`` holds the rounds done (already written to the run folder)."""

    def __init__(self, result: RunResult) -> None:
        super().__init__(f"interrupted after {len(result.rounds)} of {result.spec.rounds} rounds")
        self.result = result


class RunFolderError(OSError):
    """The run folder cannot be written; found before the port opens, so no node joins a run that would lose
    its results."""


def check_run_folder(out: Path) -> None:
    """Create ``out`` and write, sync and remove a probe file in it; a RunFolderError names the problem."""
    probe = out / f".fedhop-write-probe-{secrets.token_hex(4)}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        with probe.open("wb") as f:
            f.write(b"fedhop")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as e:
        raise RunFolderError(f"the run folder {out} cannot be written ({e.strerror or e}); "
                             "choose another --out") from None


@dataclass(frozen=True)
class Resume:
    """What ``--resume RUN_DIR`` found: the spec, the run id and the PS checkpoint to continue from."""

    spec: RunSpec
    run_id: str
    next_round: int
    checkpoint: RunCheckpoint
    path: Path
    skipped: tuple[str, ...]  # newer checkpoints that could not be read

    @property
    def finished(self) -> bool:
        """Every round is done: resuming only collects the final model and writes the results."""
        return self.next_round >= self.spec.rounds


def load_resume(run_dir: Path) -> Resume:
    """The newest readable PS checkpoint of ``run_dir`` (a truncated or corrupted newer one is named and
    skipped); CheckpointError when there is none."""
    store = ps_store(run_dir)
    got, ck = load_latest(store)
    spec = RunSpec.model_validate(got.meta["spec"])
    resume = Resume(spec, ck.run_id, int(got.meta["next_round"]), ck, got.path, tuple(store.errors))
    if resume.finished and _results_written(run_dir):
        raise RunFinished(ExitCode.ALREADY_FINISHED, f"run {ck.run_id} in {run_dir} is finished: all {spec.rounds} "
                          f"rounds are done and its results are in {run_dir / 'results.json'}; nothing to resume "
                          f"(to run it again: fedhop rerun {run_dir})")
    return resume


class RunFinished(Fatal):
    """``--resume`` of a run that finished and wrote its results (exit code ALREADY_FINISHED)."""


def _results_written(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds the results of a run that ended with its final model (not interrupted)."""
    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(results, dict) and results.get("interrupted") is False and (run_dir / "model.pt").is_file()


class _RunNews(HubListener):
    """The PS hub's news of its children, told to the Run (which turns it into the run's events)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def child_joined(self, node: str, role: str) -> None:
        self.run.joined(node, role)

    def child_ready(self, node: str, sizes: dict[str, int]) -> None:  # an edge's Ready names its joined clients
        self.run.ready(node, sizes)

    def child_lost(self, node: str, why: str) -> None:
        self.run.lost(node, why)


def _gate(t: int) -> None:
    """Test hook: the PS's gate before round t (``common/testhooks.py``)."""
    gate(str(t))


def _committed(t: int, spec: RunSpec, welcome_info: dict[str, Any]) -> None:
    """After round ``t``'s checkpoint: a resumed run's Welcome tells a node that joins from now on to roll back to
    before round t + 1, the first round not committed, not to before the round the PS resumed at (a node
    restarted later would drop the state it saved since, and be used with it lost); then the test gate."""
    if "resume_round" in welcome_info:
        welcome_info["resume_round"] = t + 1
    heap.tidy(f"ps: after round {t + 1}")  # a quiet point: the round's survivors frozen (common/heap.py)
    if t + 1 < spec.rounds:
        _gate(t + 1)


def run_server(spec: RunSpec, listen: str = "127.0.0.1:0", *, out: Path | None = None, device: str | None = None,
               on_listening: Callable[[int], None] | None = None,
               startup_failure: Callable[[], str | None] | None = None,
               resume: Resume | None = None, events: RunEvents | None = None, security: Security = PLAINTEXT,
               ps_workspace: Callable[[Workspace], None] | None = None) -> RunResult:
    """Run ``spec`` as the PS of a networked federation; returns the result (also written to ``out``).

    The run's bookkeeping (events, round recorder, checkpoints, the result) is a
    :class:`~fedhop.common.engine.run.Run`, as in the in-process engine; this function wires it to the gRPC
    server, the session hub and the run folder. ``events``: the run's lifecycle events, its only progress
    channel (a progress bar, the live page; ``node_ready`` when a child said Ready, with its clients' data
    sizes). ``on_listening(port)``: the port is open (the launcher starts the children). ``startup_failure``
    (the launcher's): says why a node it started can no longer join, so the PS stops waiting at once instead
    of at the join deadline. Ctrl-C during the rounds writes the rounds done and raises :class:`Interrupted`.

    Checkpoints: after every ``spec.checkpoint_every`` rounds the PS writes its state (the algorithm's S, the
    byte rows, the missing log, the rounds) to ``out/checkpoints/ps``. ``resume``: continue such a run from its
    last checkpoint; the run keeps its id, so nodes that stayed up re-join it, and every node is told the
    round to resume at (a node that is ahead rolls back; one restarted with --state-dir restores its own).
    ``security``: the PS's :class:`~fedhop.transport.credentials.Security` (default: plaintext).
    ``ps_workspace(ws)``: applied to the PS's workspace before the children start (``fedhop reproduce``: the
    figure's metric in place of the test metrics, as it does to the in-process engine's workspace).

    The PS holds ``out`` while it runs (common/run_lock.py): another process running it is refused at once."""
    if out is not None:
        check_run_folder(out)
    with run_lock.hold(out):
        return _serve(spec, listen, out=out, device=device, on_listening=on_listening,
                      startup_failure=startup_failure, resume=resume, events=events, security=security,
                      ps_workspace=ps_workspace)


def _serve(spec: RunSpec, listen: str, *, out: Path | None, device: str | None,
           on_listening: Callable[[int], None] | None, startup_failure: Callable[[], str | None] | None,
           resume: Resume | None, events: RunEvents | None, security: Security,
           ps_workspace: Callable[[Workspace], None] | None) -> RunResult:
    """:func:`run_server`'s run, with its run folder held."""
    torch.set_num_threads(1)
    fix_mmap_threshold()  # freed chunk buffers go back to the OS (common/malloc_tuning.py)
    ws = Workspace(spec, device)
    if ps_workspace is not None:
        ps_workspace(ws)
    topo = ws.topology
    meter, missing = ByteMeter(), MissingLog()
    welcome_info: dict[str, Any] = {}  # sent in every Welcome
    start, records = Start(), []
    if resume is not None:
        ck = resume.checkpoint
        meter.merge(ck.meter)
        missing.entries[:] = ck.missing
        records = list(ck.records)
        start = Start(resume.next_round, ck.state)
        welcome_info["resume_round"] = resume.next_round
    store = ps_store(out) if out is not None else None
    run = Run(spec, topo, engine="network", meter=meter, missing=missing, events=events,
              run_id=resume.run_id if resume is not None else None, records=records,
              journal=out / "rounds.jsonl" if out is not None else None, store=store,
              after_commit=lambda t: _committed(t, spec, welcome_info))
    if resume is not None:
        log.info("ps: resuming run %s at round %d from %s", run.run_id, resume.next_round + 1, resume.path)
    welcome_info[CODE_DIGEST] = code_digest(spec)  # every node checks its user code against it
    hub = ParentHub(HubConfig(topo.server, spec, topo, run.run_id, welcome_info, security), meter, missing,
                    listener=_RunNews(run))
    run.start(resumed_at=start.next_round)
    # an asyncio server: its threads do not grow with the children (transport/aio_server.py, issue 19)
    server = make_loop_server(security, spec.transport.handshake_timeout_s)
    add_health(server)  # grpc.health.v1 (compose healthchecks, `fedhop health`, children lingering on it)
    serve_parent(hub, server)
    port = add_port(server, listen, security)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    server.start()
    unlog = run.events.subscribe(round_records(lambda rec: _log_round(rec, spec.rounds)))  # (the caller's stream)
    try:
        log.info("ps: run %s listening on port %d; waiting for %d children", run.run_id, port, len(hub.children))
        if on_listening is not None:
            on_listening(port)
        try:
            ws.model, ws.test  # noqa: B018  (load while the children start, not inside the first round)
        except (ValueError, OSError) as e:  # bad/missing data files, a model that does not fit the data
            raise Fatal(ExitCode.DATA, f"ps: cannot load its data or model: {e}") from None
        absent = hub.wait_ready(spec.transport.join_timeout_s, give_up=startup_failure)
        failure = startup_failure() if startup_failure is not None else None
        if failure:
            raise StartupFailed(failure)
        if len(absent) == len(hub.children):
            raise JoinTimeout(f"no node joined within {spec.transport.join_timeout_s:g}s "
                              f"(expected {list(hub.children)})")
        if absent:
            log.warning("ps: starting without %s (not ready within %gs)", absent, spec.transport.join_timeout_s)
        comm = NetComm(topo.server, topo, missing, hub, spec, security=security)
        ctx = NodeContext(node_id=topo.server, role="server", ws=ws, comm=comm)  # binds comm to ctx
        if resume is not None:
            comm.last_ok = dict(resume.checkpoint.last_ok)
        ctx.sizes = topo.subtree_sizes(hub.start(hub.peer_addresses()))
        heap.settle(f"ps: {len(hub.children) - len(absent)} children joined")  # their sessions live until the end
        outcome = run.drive(get_algorithm(spec.algorithm.name), ctx, start, partial=True)
        reason = "run finished" if outcome.finished else f"the run did not finish: {outcome.failed or 'interrupted'}"
        hub.shutdown(spec.transport.rpc_timeout_s if outcome.finished else min(10.0, spec.transport.rpc_timeout_s),
                     finished=outcome.finished, reason=reason)  # children's last rows merge into meter
        result = run.finish(outcome, sort_missing=True)
        if out is not None:
            _write(result, out, store)
        if outcome.interrupted:
            raise Interrupted(result)
        if outcome.failed is not None:
            raise outcome.failed
        return result
    finally:
        unlog()
        server.stop(grace=2.0)


def _log_round(rec: dict[str, Any], rounds: int) -> None:
    shown = " ".join(f"{k} {rec[k]:.4f}" for k in ("accuracy", "loss") if k in rec)
    log.info("ps: round %d/%d %s", rec["round"], rounds, shown)


def _write(result: RunResult, out: Path, store: CheckpointStore | None) -> None:
    """Write the run folder; if that fails (a full or read-only disk), say what is saved and where."""
    try:
        write_run_folder(result, out)
    except OSError as e:
        saved = [*getattr(e, "saved", ()), f"the rounds so far in {out / 'rounds.jsonl'}"]  # RunFolderNotWritten
        if store is not None and store.tags():
            saved.insert(0, f"the trained state (the model) in {store.folder} (round {store.tags()[-1] + 1})")
        raise ResultsNotWritten(f"the results could not be written to {out} ({e.strerror or e}); saved: "
                                f"{'; '.join(saved)}") from None


class ResultsNotWritten(OSError):
    """The run trained but its run folder could not be written; the message says what was saved and where."""
