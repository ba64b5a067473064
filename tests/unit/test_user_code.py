"""Bring your own: user references in a spec, their errors (naming the field), preflight checks, code digest."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from fedhop.cli import main
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.engine.preflight import check_user_code
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec, SpecError
from fedhop.common.user_code import (
    CODE_DIGEST,
    UserCodeError,
    check_parent_code,
    check_same_code,
    code_digest,
    load_callable,
)
from tests.specs import spec_dict as base_spec_dict

FX = "tests.unit.byo_fixtures"


def spec_dict(**over) -> dict:
    d = base_spec_dict("fedavg", {"lr": 0.1, "local_steps": 2, "batch_size": 4}, clients=3, rounds=2, seed=3,
                       data={"source": f"{FX}:source", "num_classes": 3},
                       model={"name": f"{FX}:build", "dtype": "float64"})
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    return d


# -- importing references ----------------------------------------------------------------------------------

def test_load_callable_errors_name_the_field() -> None:
    with pytest.raises(UserCodeError, match=r"model\.name: cannot import module 'nowhere_pkg\.mod'.*PYTHONPATH"):
        load_callable("nowhere_pkg.mod:build", "model.name")
    with pytest.raises(UserCodeError, match=rf"data\.source: module '{FX}' has no attribute 'nope'"):
        load_callable(f"{FX}:nope", "data.source")
    with pytest.raises(UserCodeError, match=r"metrics\[0\]: .*NOT_CALLABLE is a int, not a function"):
        load_callable(f"{FX}:NOT_CALLABLE", "metrics[0]")
    with pytest.raises(UserCodeError, match=r"model\.loss: importing 'tests\.unit\.byo_broken_module' failed: "
                                            r"RuntimeError: this module is broken on purpose"):
        load_callable("tests.unit.byo_broken_module:f", "model.loss")
    assert load_callable(f"{FX}:build", "model.name").__name__ == "build"


@pytest.mark.parametrize(("over", "field"), [
    ({"model": {"name": "nowhere_pkg.mod:build"}}, "model.name"),
    ({"model": {"loss": f"{FX}:no_loss"}}, "model.loss"),
    ({"data": {"source": "nowhere_pkg:source"}}, "data.source"),
    ({"metrics": [f"{FX}:mean_margin", f"{FX}:absent_metric"]}, r"metrics\[1\]"),
])
def test_spec_with_unimportable_code_fails_at_parse(over: dict, field: str) -> None:
    with pytest.raises(SpecError, match=field):
        RunSpec.parse(spec_dict(**over))


@pytest.mark.parametrize(("over", "message"), [
    ({"data": {"source": "not a reference"}}, r"data\.source: 'not a reference' is not a Python reference"),
    ({"data": {"num_classes": None}}, r"data: num_classes: required with data\.source"),
    ({"data": {"partition": "shards"}}, r"data: partition: built-in dataset/partition fields do not apply"),
    ({"data": {"source": None, "dataset": "digits", "num_classes": 10}}, "num_classes applies to a data.source"),
    ({"model": {"hidden": [8]}}, r"model: hidden: applies to the built-in models only"),
    ({"metrics": [f"{FX}:loss"]}, r"metrics: entry 0: .* would be reported as 'loss'"),
    ({"metrics": [f"{FX}:mean_margin", "other.mod:mean_margin"]}, "would both be reported as 'mean_margin'"),
])
def test_spec_field_errors(over: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        RunSpec.parse(spec_dict(**over))


def test_full_dump_of_a_source_spec_parses_again() -> None:
    """What the PS sends in the Welcome (every field, defaults included) must validate on the child."""
    spec = RunSpec.parse(spec_dict())
    again = RunSpec.model_validate_json(spec.model_dump_json())
    assert again == spec
    assert RunSpec.from_toml(spec.to_toml()) == spec


# -- preflight: the errors a user hits before anything starts ----------------------------------------------

@pytest.mark.parametrize(("over", "message"), [
    ({"model": {"name": f"{FX}:build_not_module"}}, r"model\.name: .* returned str, not a torch\.nn\.Module"),
    ({"model": {"name": f"{FX}:build_batchnorm"}}, r"model\.name: .* has buffers .*running_mean"),
    ({"model": {"name": f"{FX}:build_wrong_width"}}, r"model\.name: .* outputs \(2, 4\), expected \(2, 3\)"),
    ({"data": {"source": f"{FX}:source_not_pair"}}, r"data\.source: the test set: returned dict, expected a pair"),
    ({"data": {"source": f"{FX}:source_list"}}, r"data\.source: the test set: x is a list"),
    ({"data": {"source": f"{FX}:source_client1_wide"}},
     r"data\.source: client 1's x is torch\.float64 with samples of shape \(4,\), the test set's x .* \(3,\)"),
    ({"data": {"source": f"{FX}:source_client2_float32"}},
     r"data\.source: client 2's x is torch\.float32 .* the test set's x is torch\.float64"),
    ({"data": {"source": f"{FX}:source_bad_labels"}},
     r"data\.source: the test set: labels span 5\.\.7, outside 0\.\.2"),
    ({"data": {"source": f"{FX}:source_int_x"}}, r"data\.source: the test set: x is torch\.uint8; it must be float"),
    ({"data": {"source": f"{FX}:source_raises"}},
     r"data\.source: .*source_raises failed for the test set: FileNotFoundError: no such file"),
    ({"data": {"source": f"{FX}:source_regression", "num_classes": 0}},
     r"model\.name: on a batch of the test set the model outputs \(2, 1\), expected \(2,\)"),
    ({"model": {"loss": f"{FX}:loss_per_sample"}}, r"model\.loss: returned a tensor of shape \(2,\)"),
    ({"metrics": [f"{FX}:metric_vector"]}, r"metrics: metric_vector returned Tensor; a metric returns one number"),
])
def test_preflight_errors(over: dict, message: str) -> None:
    spec = RunSpec.parse(spec_dict(**over))
    with pytest.raises(SpecError, match=message):
        check_user_code(spec)


def test_cli_bad_user_code_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = RunSpec.parse(spec_dict(data={"source": f"{FX}:source_client1_wide"}))
    path = tmp_path / "bad.toml"
    path.write_text(spec.to_toml())
    out = tmp_path / "run"
    assert main(["simulate", str(path), "--out", str(out), "--quiet"]) == 2
    assert "data.source: client 1's x" in capsys.readouterr().err
    assert not out.exists()  # nothing started
    path.write_text(spec.to_toml().replace(f"{FX}:build", "nowhere_pkg:build"))
    assert main(["launch", str(path), "--out", str(out), "--quiet"]) == 2
    assert "model.name: cannot import module 'nowhere_pkg'" in capsys.readouterr().err
    assert not out.exists()


# -- running user code ---------------------------------------------------------------------------------------

def test_user_model_loss_metrics_and_float64_data_train() -> None:
    spec = RunSpec.parse(spec_dict(model={"loss": f"{FX}:loss"}, rounds=3,
                                   metrics=[f"{FX}:accuracy_of_class0", f"{FX}:mean_margin"]))
    check_user_code(spec)
    result = InProcessEngine(spec).run()
    assert [r["round"] for r in result.rounds] == [1, 2, 3]
    for r in result.rounds:
        assert set(r) >= {"loss", "accuracy", "accuracy_of_class0", "mean_margin"}
    assert all(v.dtype == torch.float64 for v in result.final.values())
    # the reported numbers are the user's functions on the test set, recomputed here by hand
    ws = Workspace(spec, "cpu")
    out = ws.forward(result.final, ws.test.x)
    smoothed = torch.nn.functional.cross_entropy(out, ws.test.y, label_smoothing=0.1)
    last = result.rounds[-1]
    assert last["loss"] == pytest.approx(float(smoothed), rel=1e-12)
    assert last["mean_margin"] == pytest.approx(float(out.gather(1, ws.test.y[:, None]).mean()), rel=1e-12)
    assert ws.test.x.dtype == torch.float64


def test_user_model_is_identical_on_every_node_and_ignores_the_global_rng() -> None:
    spec = RunSpec.parse(spec_dict())
    torch.manual_seed(1)
    a = Workspace(spec, "cpu").initial_params()
    torch.manual_seed(2)
    before = torch.random.get_rng_state()
    b = Workspace(spec, "cpu").initial_params()
    assert torch.equal(torch.random.get_rng_state(), before)  # fork_rng restored it
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = Workspace(RunSpec.parse(spec_dict(seed=4)), "cpu").initial_params()
    assert not torch.equal(a["0.weight"], c["0.weight"])
    z = Workspace(RunSpec.parse(spec_dict(model={"init": "zeros"})), "cpu").initial_params()
    assert all(bool((v == 0).all()) for v in z.values())


# -- the code digest -------------------------------------------------------------------------------------------

def test_code_digest_tracks_the_named_modules_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert code_digest(RunSpec.parse({"rounds": 1})) == ""
    shutil.copy(Path(__file__).with_name("byo_fixtures.py"), tmp_path / "byo_digest_mod.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = RunSpec.parse(spec_dict(model={"name": "byo_digest_mod:build"}))
    d1 = code_digest(spec)
    assert len(d1) == 64 and d1 == code_digest(spec)
    assert d1 != code_digest(RunSpec.parse(spec_dict()))  # another module: another digest
    (tmp_path / "byo_digest_mod.py").write_text((tmp_path / "byo_digest_mod.py").read_text() + "\n# v2\n")
    d2 = code_digest(spec)
    assert d2 != d1
    check_same_code(d2, d2, "client-0")
    with pytest.raises(UserCodeError, match="client-0 runs different user code than the parameter server"):
        check_same_code(d1, d2, "client-0")
    sys.modules.pop("byo_digest_mod", None)


def test_a_joining_node_checks_the_digest_of_the_welcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_parent_code(RunSpec.parse({"rounds": 1}), {CODE_DIGEST: ""}, "client-0")  # no user code: nothing to differ
    shutil.copy(Path(__file__).with_name("byo_fixtures.py"), tmp_path / "byo_welcome_mod.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = RunSpec.parse(spec_dict(model={"name": "byo_welcome_mod:build"}))
    own = code_digest(spec)
    check_parent_code(spec, {CODE_DIGEST: own, "resume_round": 3}, "edge-1")
    with pytest.raises(UserCodeError, match="edge-1 runs different user code"):
        check_parent_code(spec, {CODE_DIGEST: "0" * 64}, "edge-1")
    with pytest.raises(UserCodeError, match="edge-1 runs different user code"):  # a parent that sent no digest
        check_parent_code(spec, {}, "edge-1")
    sys.modules.pop("byo_welcome_mod", None)
