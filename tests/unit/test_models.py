"""Models: parameter counts against the papers, determinism, shapes, no buffers, clear errors."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torch.func import functional_call

from fedhop.common.data import DataSpec, build_federated_data
from fedhop.common.models import MODELS, ModelSpec, build_model
from fedhop.common.models.nets import MaxPoolSame


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def conv(cin: int, cout: int, k: int) -> int:
    return cin * cout * k * k + cout


def fc(din: int, dout: int) -> int:
    return din * dout + dout


def test_alexnet_small_count_cifar10() -> None:
    # Zhang et al. 2017 report 1,387,786 parameters for the small AlexNet (FedCluster sec. IV-A)
    m = build_model(ModelSpec(name="alexnet-small"), (3, 32, 32), 10, 0)
    assert n_params(m) == 1_387_786
    assert m.fc1.weight.shape == (384, 7 * 7 * 64)  # 32 -> crop 28 -> 14 -> 7 with SAME pooling


def test_alexnet_small_count_mnist() -> None:
    m = build_model(ModelSpec(name="alexnet-small"), (1, 28, 28), 10, 0)
    assert n_params(m) == 1_384_586  # docs/specs/fedcluster.md 4.2 / T8


@pytest.mark.parametrize("shape, classes, expected", [
    # Fed-CHS App. A: MNIST conv64-conv256 (5x5, valid) 28->24->12->8->4, FC 512, 128
    ((1, 28, 28), 10, conv(1, 64, 5) + conv(64, 256, 5) + fc(256 * 16, 512) + fc(512, 128) + fc(128, 10)),
    # CIFAR: conv64-conv64 32->28->14->10->5, FC 384, 192
    ((3, 32, 32), 10, conv(3, 64, 5) + conv(64, 64, 5) + fc(64 * 25, 384) + fc(384, 192) + fc(192, 10)),
    ((3, 32, 32), 100, conv(3, 64, 5) + conv(64, 64, 5) + fc(64 * 25, 384) + fc(384, 192) + fc(192, 100)),
])
def test_lenet_counts(shape: tuple[int, ...], classes: int, expected: int) -> None:
    assert n_params(build_model(ModelSpec(name="lenet"), shape, classes, 0)) == expected


def test_other_counts() -> None:
    # McMahan et al. 2017 quote 1,663,370 parameters for their MNIST CNN
    assert n_params(build_model(ModelSpec(name="cnn2"), (1, 28, 28), 10, 0)) == 1_663_370
    assert n_params(build_model(ModelSpec(name="cnn3"), (3, 32, 32), 10, 0)) == (
        conv(3, 16, 3) + conv(16, 32, 3) + conv(32, 64, 3) + fc(64 * 16, 500) + fc(500, 10))
    assert n_params(build_model(ModelSpec(name="mlp200"), (1, 28, 28), 10, 0)) == (
        fc(784, 200) + fc(200, 200) + fc(200, 10))
    assert n_params(build_model(ModelSpec(name="mlp", hidden=[256, 512]), (3, 32, 32), 100, 0)) == (
        fc(3072, 256) + fc(256, 512) + fc(512, 100))
    assert n_params(build_model(ModelSpec(name="logreg"), (64,), 10, 0)) == fc(64, 10)
    assert n_params(build_model(ModelSpec(name="linear", bias=False), (50,), 0, 0)) == 50


CASES = [("logreg", (64,), 10), ("linear", (20,), 0), ("mlp", (64,), 10), ("mlp", (20,), 0),
         ("mlp200", (1, 8, 8), 10), ("lenet", (3, 32, 32), 10), ("alexnet-small", (3, 32, 32), 10),
         ("cnn2", (1, 28, 28), 10), ("cnn3", (3, 32, 32), 10), ("cnn2", (1, 8, 8), 10)]


@pytest.mark.parametrize("name, shape, classes", CASES)
def test_shapes_determinism_no_buffers(name: str, shape: tuple[int, ...], classes: int) -> None:
    spec = ModelSpec(name=name)
    state = torch.random.get_rng_state()
    a = build_model(spec, shape, classes, 1)
    b = build_model(spec, shape, classes, 1)
    c = build_model(spec, shape, classes, 2)
    assert torch.equal(state, torch.random.get_rng_state()), "build_model must not touch the global RNG"
    assert list(a.buffers()) == []
    pa, pb, pc = dict(a.named_parameters()), dict(b.named_parameters()), dict(c.named_parameters())
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert any(not torch.equal(pa[k], pc[k]) for k in pa)
    x = torch.randn(5, *shape, generator=torch.Generator().manual_seed(0))
    out = a(x)
    assert out.shape == ((5, classes) if classes else (5,))
    assert torch.isfinite(out).all()
    # algorithms call the model through its named parameters
    zeroed = {k: torch.zeros_like(v) for k, v in pa.items()}
    assert torch.count_nonzero(functional_call(a, zeroed, (x,))) == 0


def test_default_init_follows_pytorch_bounds() -> None:
    m = build_model(ModelSpec(name="mlp", hidden=[300]), (100,), 10, 0)
    bound = 1 / 100 ** 0.5
    w = m.fc1.weight
    assert w.abs().max() <= bound and w.abs().max() > 0.98 * bound
    assert abs(w.mean().item()) < 0.01 * bound * 10
    assert m.out.weight.abs().max() <= 1 / 300 ** 0.5


def test_zero_init() -> None:
    m = build_model(ModelSpec(name="logreg", init="zeros"), (64,), 10, 0)
    assert all(torch.count_nonzero(p) == 0 for p in m.parameters())


def test_every_registered_model_builds_without_buffers() -> None:
    for name in MODELS:
        shape, classes = ((20,), 0) if name == "linear" else ((3, 32, 32), 10)
        m = build_model(ModelSpec(name=name), shape, classes, 0)
        assert list(m.buffers()) == [], name
        assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in m.parameters())


def test_conv_model_on_flat_data_is_clear() -> None:
    for name in ("lenet", "alexnet-small", "cnn2", "cnn3"):
        with pytest.raises(ValueError, match=r"image input.*digits-img"):
            build_model(ModelSpec(name=name), (64,), 10, 0)


def test_too_small_input_is_clear() -> None:
    with pytest.raises(ValueError, match="too small.*padding"):
        build_model(ModelSpec(name="lenet"), (1, 8, 8), 10, 0)
    m = build_model(ModelSpec(name="lenet", options={"padding": "same"}), (1, 8, 8), 10, 0)
    assert m(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_task_mismatch_is_clear() -> None:
    with pytest.raises(ValueError, match="logreg"):
        build_model(ModelSpec(name="linear"), (20,), 10, 0)
    with pytest.raises(ValueError, match="regression"):
        build_model(ModelSpec(name="logreg"), (20,), 0, 0)


def test_bad_names_and_options() -> None:
    with pytest.raises(ValidationError) as e:
        ModelSpec(name="resnet152")
    msg = str(e.value)
    assert "resnet152" in msg and "alexnet-small" in msg and "lenet" in msg and "mlp" in msg
    with pytest.raises(ValidationError, match="variant"):
        ModelSpec(name="lenet", options={"variant": "imagenet"})
    with pytest.raises(ValidationError, match="channels"):
        ModelSpec(name="cnn2", options={"channels": [1, 2, 3]})
    with pytest.raises(ValidationError, match="hidden"):
        ModelSpec(name="mlp", hidden=[0])
    with pytest.raises(ValidationError, match="widht"):
        ModelSpec(widht=3)


def test_alexnet_crops_the_centre() -> None:
    m = build_model(ModelSpec(name="alexnet-small"), (3, 32, 32), 10, 0)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[..., :2, :] = 5.0  # outside the centre 28x28 window
    y[..., :, 30:] = -5.0
    assert torch.equal(m(x), m(y))
    assert torch.allclose(m(x), m(x[..., 2:30, 2:30]))


def test_tf_same_pooling_pads_bottom_right() -> None:
    # TF SAME for 28 -> 14 with a 3x3/2 window pads one row/col at the bottom/right only, so output
    # (i, j) covers rows 2i..2i+2: a peak at (2, 2) shows in outputs (0, 0) and (1, 1).
    x = torch.zeros(1, 1, 28, 28)
    x[0, 0, 2, 2] = 1.0
    out = MaxPoolSame(3, 2)(x)
    assert out.shape == (1, 1, 14, 14)
    assert out[0, 0, 0, 0] == 1 and out[0, 0, 1, 1] == 1 and out.sum() == 4
    neg = MaxPoolSame(3, 2)(-torch.ones(1, 1, 7, 7))
    assert neg.shape == (1, 1, 4, 4) and (neg == -1).all()  # padding never wins a max


def test_logreg_learns_digits() -> None:
    """End to end: data + model + plain full-batch gradient descent reach a sane accuracy."""
    fd = build_federated_data(DataSpec(dataset="digits", partition="iid"), 1, 0)
    m = build_model(ModelSpec(name="logreg"), fd.input_shape, fd.num_classes, 0)
    opt = torch.optim.SGD(m.parameters(), lr=2.0)
    tr = fd.clients[0]
    for _ in range(60):
        opt.zero_grad()
        nn.functional.cross_entropy(m(tr.x), tr.y).backward()
        opt.step()
    acc = (m(fd.test.x).argmax(1) == fd.test.y).float().mean().item()
    assert acc > 0.9


def test_cnn_on_digits_img_forward_backward() -> None:
    fd = build_federated_data(DataSpec(dataset="digits-img", partition="iid"), 2, 0)
    m = build_model(ModelSpec(name="cnn2"), fd.input_shape, fd.num_classes, 0)
    loss = nn.functional.cross_entropy(m(fd.clients[0].x[:32]), fd.clients[0].y[:32])
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
