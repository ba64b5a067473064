"""Bring your own protocol (issue 16, section 3): ``algorithm.name = "package.module:NAME"`` names an
``fedhop.api.Algorithm`` record in the user's module. It is imported, validated (its options like a built-in's),
digested and checked like the other user callables; its state (a user dataclass, a pydantic model, a dict) is
saved in checkpoints and restored, or refused before round 1 with a message naming the field."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel, ConfigDict

import fedhop.api as api
from fedhop.cli import main
from fedhop.common import catalog
from fedhop.common.engine.checkpoint import read_checkpoint
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.engine.preflight import check_user_code
from fedhop.common.engine.state_io import StateError, from_tree, to_tree, trust_module
from fedhop.common.spec import RunSpec, SpecError
from fedhop.common.user_code import code_digest, references
from tests.specs import DIGITS, spec_dict

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "server_momentum"
REF = "momentum:ALGORITHM"


@pytest.fixture(autouse=True)
def example_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield


def momentum_spec(rounds: int = 4, **options: object) -> RunSpec:
    opts = {"local_steps": 2, "batch_size": 8, **options}
    return RunSpec.parse(spec_dict(REF, opts, clients=3, rounds=rounds, seed=2, data=DIGITS,
                                   model={"name": "mlp", "hidden": [8]}))


def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> str:
    """A module ``name`` in a folder on sys.path (removed from sys.modules afterwards)."""
    folder = tmp_path / f"src_{name}"
    folder.mkdir()
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


# -- the reference ---------------------------------------------------------------------------------------------

def test_a_user_algorithm_validates_its_options_like_a_builtin() -> None:
    spec = momentum_spec(momentum=0.5)
    assert spec.options().momentum == 0.5 and spec.options().server_lr == 1.0  # defaults filled in
    assert references(spec)["algorithm.name"] == REF
    for bad, message in (({"momentum": 1.5}, "momentum: Input should be less than 1"),
                         ({"bogus": 1}, "bogus: Extra inputs are not permitted")):
        with pytest.raises(SpecError, match=message):
            momentum_spec(**bad)


def test_a_user_algorithm_keeps_its_topology_rule() -> None:
    raw = spec_dict(REF, {}, clients=4, edges=2, rounds=1, data=DIGITS)
    with pytest.raises(SpecError, match="'momentum:ALGORITHM' runs on server \\+ clients only"):
        RunSpec.parse(raw)


@pytest.mark.parametrize(("name", "message"), [
    ("nowhere_pkg_xyz:ALGORITHM", r"algorithm\.name: cannot import module 'nowhere_pkg_xyz'"),
    ("momentum:NOPE", r"algorithm\.name: module 'momentum' has no attribute 'NOPE'"),
    ("momentum:train", r"algorithm\.name: momentum:train is a function, not a fedhop\.api\.Algorithm record"),
    ("momentum:Options", r"algorithm\.name: momentum:Options is a class, not a fedhop\.api\.Algorithm record"),
    ("a:b:c", r"algorithm\.name: 'a:b:c' is not a Python reference of the form 'package\.module:NAME'"),
])
def test_a_bad_reference_is_one_line_naming_the_field(name: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        RunSpec.parse(spec_dict(name, {}, clients=2, rounds=1, data=DIGITS))


def test_cli_exits_2_on_a_bad_algorithm_reference(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(momentum_spec().to_toml().replace(REF, "momentum:NOPE"))
    out = tmp_path / "run"
    assert main(["simulate", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.name: module 'momentum' has no attribute 'NOPE'" in err and "Traceback" not in err
    assert not out.exists()


def test_algorithms_lists_builtins_and_explain_lists_the_user_options(capsys: pytest.CaptureFixture) -> None:
    momentum_spec()  # the user algorithm imported in this process: still not a built-in
    assert main(["algorithms"]) == 0
    listed = capsys.readouterr().out
    assert "fedavg " in listed and "momentum" not in listed
    assert REF not in catalog.ALGORITHMS
    assert main(["spec", "--explain", REF]) == 0
    text = capsys.readouterr().out
    assert "FedAvg with server momentum" in text
    assert "algorithm.options.server_lr" in text and "server momentum beta" in text


def test_the_code_digest_covers_the_algorithm_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = (EXAMPLE / "momentum.py").read_text()
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "momentum.py").write_text(src)
    spec = momentum_spec()
    before = code_digest(spec)
    assert before
    (copy / "momentum.py").write_text(src + "\n# edited\n")
    monkeypatch.syspath_prepend(str(copy))
    monkeypatch.delitem(sys.modules, "momentum")
    assert code_digest(spec) != before


# -- running it, its state -------------------------------------------------------------------------------------

def test_it_runs_in_process_and_momentum_changes_the_model() -> None:
    plain = InProcessEngine(momentum_spec(momentum=0.0)).run()
    heavy = InProcessEngine(momentum_spec(momentum=0.9)).run()
    assert len(heavy.rounds) == 4 and "accuracy" in heavy.rounds[-1]
    assert any(not torch.equal(plain.final[k], heavy.final[k]) for k in plain.final)
    again = InProcessEngine(momentum_spec(momentum=0.9)).run()
    assert all(torch.equal(again.final[k], v) for k, v in heavy.final.items())


class Crash(Exception):
    pass


def test_resume_from_a_checkpoint_restores_the_user_state(tmp_path: Path) -> None:
    spec = momentum_spec(rounds=5)
    whole = InProcessEngine(spec).run()

    def crash(t: int) -> None:
        if t == 2:
            raise Crash

    with pytest.raises(Crash):
        InProcessEngine(spec).run(checkpoints=tmp_path, after_commit=crash)
    _, state = read_checkpoint(tmp_path / "ckpt_00000002.fhck")
    ps = state.state
    assert type(ps).__module__ == "momentum" and type(ps).__name__ == "ServerState"
    assert ps.rounds_done == 3 and any(bool(v.abs().sum() > 0) for v in ps.velocity.values())
    resumed = InProcessEngine(spec).run(checkpoints=tmp_path, resume=True)
    assert all(torch.equal(resumed.final[k], v) for k, v in whole.final.items())
    assert resumed.links == whole.links


BAD_STATE = '''
    import threading
    from dataclasses import dataclass, field
    from pydantic import BaseModel
    from fedhop.api import Algorithm, Bundle, NodeContext, NoOptions


    @dataclass
    class State:
        model: Bundle
        lock: object = field(default_factory=threading.Lock)


    def init(ctx: NodeContext) -> State:
        return State(ctx.initial_params())


    def round_(ctx: NodeContext, s: State) -> State:
        return s


    ALGORITHM = Algorithm(name="bad-state", options=NoOptions, init=init, round=round_, needs_edges=False)
'''


def test_a_state_that_cannot_be_saved_is_refused_before_round_1_naming_the_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    mod = user_module(tmp_path, monkeypatch, "fh_bad_state", BAD_STATE)
    spec = RunSpec.parse(spec_dict(f"{mod}:ALGORITHM", {}, clients=2, rounds=2, data=DIGITS))
    with pytest.raises(SpecError, match=r"algorithm\.name: fh_bad_state:ALGORITHM: the state init returns cannot be "
                                        r"saved in a checkpoint: state\.lock: a lock cannot be saved"):
        check_user_code(spec)
    rounds: list[int] = []
    with pytest.raises(StateError, match=r"state\.lock"):  # the engine's own check, before round 1
        InProcessEngine(spec).run(after_commit=rounds.append)
    assert rounds == []
    path = tmp_path / "spec.toml"
    path.write_text(spec.to_toml())
    capsys.readouterr()
    for command in ("simulate", "launch"):  # refused before anything starts: exit 2, one line, no traceback
        out = tmp_path / f"run-{command}"
        assert main([command, str(path), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "state.lock: a lock cannot be saved" in err and "Traceback" not in err
        assert not out.exists()


def test_a_state_class_outside_the_algorithm_package_is_refused_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user_module(tmp_path, monkeypatch, "fh_state_elsewhere", '''
        from dataclasses import dataclass
        import torch


        @dataclass
        class Elsewhere:
            x: torch.Tensor
    ''')
    mod = user_module(tmp_path, monkeypatch, "fh_uses_elsewhere", BAD_STATE.replace(
        "lock: object = field(default_factory=threading.Lock)", "other: object = None").replace(
        "return State(ctx.initial_params())",
        "from fh_state_elsewhere import Elsewhere\n        return State(ctx.initial_params(), Elsewhere(torch.ones(2)))"
    ).replace("import threading", "import torch"))
    spec = RunSpec.parse(spec_dict(f"{mod}:ALGORITHM", {}, clients=2, rounds=1, data=DIGITS))
    with pytest.raises(SpecError, match=r"state\.other: Elsewhere is a dataclass of module 'fh_state_elsewhere'"):
        check_user_code(spec)


@dataclasses.dataclass
class _Plain:
    w: torch.Tensor
    n: int


class _Model(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    w: torch.Tensor
    lr: float


def test_user_dataclasses_pydantic_models_and_dicts_round_trip_once_trusted() -> None:
    value = {"dc": _Plain(torch.arange(3.0), 2), "pm": _Model(w=torch.ones(2), lr=0.1), "d": {"k": [1, 2.5]}}
    with pytest.raises(StateError, match=r"state\['dc'\]: _Plain is a dataclass of module 'tests\.unit\."):
        to_tree(value, {})
    trust_module(__name__)  # what running a user algorithm of this package does
    tensors: dict[str, torch.Tensor] = {}
    back = from_tree(to_tree(value, tensors), tensors)
    assert isinstance(back["dc"], _Plain) and back["dc"].n == 2 and torch.equal(back["dc"].w, torch.arange(3.0))
    assert isinstance(back["pm"], _Model) and back["pm"].lr == 0.1 and torch.equal(back["pm"].w, torch.ones(2))
    assert back["d"] == {"k": [1, 2.5]}


def test_fedhop_api_exports_what_it_documents() -> None:
    for name in api.__all__:
        assert getattr(api, name) is not None, name
        assert name in (api.__doc__ or "") or name in ("Handler", "NodeId", "Scalar", "SETUP_ROUND") or \
            f":func:`{name}`" in (api.__doc__ or ""), f"fedhop.api.{name} is not documented in the module docstring"


COUNTING = '''
    from dataclasses import dataclass

    import torch

    from fedhop.api import Algorithm, Bundle, NodeContext, NoOptions, Reply, Scalar, task


    @dataclass
    class ClientState:
        tasks: int = 0
        drift: torch.Tensor | None = None


    @dataclass
    class State:
        model: Bundle
        seen: dict


    @task("fh_counting.step")
    def step(ctx: NodeContext, params: Bundle, args: dict[str, Scalar]) -> Reply:
        st: ClientState = ctx.state
        st.tasks += 1
        noise = torch.randn(1, generator=ctx.rng("drift", ctx.round))
        st.drift = noise if st.drift is None else st.drift + noise
        return Reply({k: v + st.drift.to(v.dtype) for k, v in params.items()}, {"tasks": st.tasks})


    def init(ctx: NodeContext) -> State:
        return State(ctx.initial_params(), {})


    def round_(ctx: NodeContext, s: State) -> State:
        replies = ctx.comm.scatter(ctx.children, "fh_counting.step", s.model, expect=s.model)
        first = next(iter(replies.values()))
        seen = {**s.seen, **{n: int(r.scalars["tasks"]) for n, r in replies.items()}}
        return State(first.bundle, seen)


    ALGORITHM = Algorithm(name="counting", options=NoOptions, init=init, round=round_, needs_edges=False,
                          node_state=lambda role: ClientState())
'''


def test_client_state_of_a_user_protocol_is_checkpointed_and_restored(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    mod = user_module(tmp_path, monkeypatch, "fh_counting", COUNTING)
    spec = RunSpec.parse(spec_dict(f"{mod}:ALGORITHM", {}, clients=3, rounds=5, seed=4, data=DIGITS,
                                   model={"name": "mlp", "hidden": [4]}))
    check_user_code(spec)
    whole = InProcessEngine(spec).run()

    def crash(t: int) -> None:
        if t == 2:
            raise Crash

    ckpts = tmp_path / "ck"
    with pytest.raises(Crash):
        InProcessEngine(spec).run(checkpoints=ckpts, after_commit=crash)
    _, state = read_checkpoint(ckpts / "ckpt_00000002.fhck")
    client = state.nodes["client-1"].state
    assert type(client).__name__ == "ClientState" and client.tasks == 3 and client.drift.shape == (1,)
    assert state.state.seen == {"client-0": 3, "client-1": 3, "client-2": 3}
    resumed = InProcessEngine(spec).run(checkpoints=ckpts, resume=True)
    assert all(torch.equal(resumed.final[k], v) for k, v in whole.final.items())  # the drift chain went on
