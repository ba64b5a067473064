"""NodeStore on disk: a node with nothing to keep writes nothing, and restores to the same node as one that did;
once it has kept something, every save is written (an empty one too, or a restart would bring back stale state)."""

from __future__ import annotations

from pathlib import Path

import torch

import fedhop.common.algorithms  # noqa: F401  (registers every algorithm)
from fedhop.common.engine.api import NodeContext
from fedhop.common.engine.node_store import NEWEST, NodeStore
from fedhop.common.engine.snapshot import snapshot
from fedhop.common.engine.state_log import StateLog
from fedhop.common.engine.workspace import Workspace
from tests.unit.hostile import spec_for


def _ctx(algorithm: str, node: str = "client-0") -> NodeContext:
    return NodeContext(node_id=node, role="client", ws=Workspace(spec_for(algorithm=algorithm), "cpu"),
                       comm=None)  # type: ignore[arg-type]


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []


def test_a_stateless_client_writes_no_files_and_restores_the_same(tmp_path: Path) -> None:
    ctx = _ctx("fedavg")
    assert snapshot(ctx).state is None  # FedAvg's clients keep nothing between rounds
    store = NodeStore("client-0", tmp_path)
    for r in range(3):
        ctx.round = r
        store.save(ctx, "run-1")
    assert _files(tmp_path / "client-0") == []
    assert store.skipped == 3 and store.bytes_written == 0
    assert store.newest_tag() is None

    restarted = _ctx("fedavg")
    got = NodeStore("client-0", tmp_path).rollback(restarted, NEWEST, "run-1")
    assert got.tag is None and got.source == "fresh"
    assert snapshot(restarted) == snapshot(ctx)


def test_a_client_with_state_writes_every_save(tmp_path: Path) -> None:
    ctx = _ctx("scaffold")
    assert ctx.state is not None
    store = NodeStore("client-0", tmp_path)
    for r in range(3):
        ctx.round = r
        store.save(ctx, "run-1")
    assert store.skipped == 0
    assert store.disk is not None and store.disk.tags() == [1, 2]  # keep = 2
    again = StateLog(tmp_path / "client-0")  # a new process reads every save back (tag 0 is forgotten, not erased)
    assert again.tags()[-2:] == [1, 2]
    got = again.latest()
    assert got is not None and got.tag == 2


def test_once_something_was_kept_an_empty_snapshot_is_written_too(tmp_path: Path) -> None:
    ctx = _ctx("fedavg")
    store = NodeStore("client-0", tmp_path)
    ctx.inbox["post:000000000001"] = ({"w": torch.ones(2)}, {"n": 1})
    store.save(ctx, "run-1", tag=0)
    ctx.inbox.clear()  # the post ran: the node is empty again, but the disk holds the post
    ctx.round = 1
    store.save(ctx, "run-1")
    assert StateLog(tmp_path / "client-0").tags() == [0, 1]
    restarted = _ctx("fedavg")
    NodeStore("client-0", tmp_path).rollback(restarted, NEWEST, "run-1")
    assert restarted.inbox == {}  # the newest (empty) state, not the post of round 0


def test_a_restarted_store_that_finds_files_keeps_writing(tmp_path: Path) -> None:
    ctx = _ctx("fedavg")
    ctx.public["seen"] = 1
    NodeStore("client-0", tmp_path).save(ctx, "run-1", tag=0)
    ctx.public.clear()
    again = NodeStore("client-0", tmp_path)  # a new process: it has not looked yet
    ctx.round = 1
    again.save(ctx, "run-1")
    assert again.skipped == 0 and StateLog(tmp_path / "client-0").tags() == [0, 1]


def test_after_a_rollback_to_nothing_empty_saves_are_skipped_again(tmp_path: Path) -> None:
    ctx = _ctx("fedavg")
    store = NodeStore("client-0", tmp_path)
    ctx.public["seen"] = 1
    ctx.round = 2
    store.save(ctx, "run-1")
    store.rollback(ctx, 1, "run-1")  # the parent resumed before round 2: tag 2 is dropped, nothing is left
    assert StateLog(tmp_path / "client-0").tags() == []
    sizes = [p.stat().st_size for p in sorted((tmp_path / "client-0").glob("*"))]
    ctx.round = 1
    store.save(ctx, "run-1")
    assert store.skipped == 1
    assert [p.stat().st_size for p in sorted((tmp_path / "client-0").glob("*"))] == sizes  # nothing appended
