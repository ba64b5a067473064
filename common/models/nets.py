"""The built-in models. All are plain ``nn.Sequential`` stacks with named layers, no BatchNorm and no
buffers: an algorithm sees a model only through ``named_parameters()`` and ``torch.func.functional_call``.
Classification models output logits ``[n, num_classes]``; regression models (``num_classes == 0``)
output ``[n]``.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from fedhop.common.model_spec import ModelSpec
from fedhop.common.models.registry import register_model
from fedhop.common.options.models import AlexNetOptions, CNN2Options, LeNetOptions  # noqa: F401  (re-exported)


class Squeeze(nn.Module):
    """``[n, 1] -> [n]`` for regression heads."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-1)


class CenterCrop(nn.Module):
    """Centre crop of the last two dims to ``size`` (a no-op on inputs not larger than ``size``)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        top, left = max(0, (h - self.size) // 2), max(0, (w - self.size) // 2)
        return x[..., top: top + min(h, self.size), left: left + min(w, self.size)]


class MaxPoolSame(nn.Module):
    """TensorFlow ``max_pool(..., padding="SAME")``: output ``ceil(in / stride)``, the extra padding on the
    bottom/right, padded with -inf (as used by the small AlexNet of Zhang et al. 2017)."""

    def __init__(self, kernel: int, stride: int) -> None:
        super().__init__()
        self.kernel, self.stride = kernel, stride

    def _pads(self, n: int) -> tuple[int, int]:
        out = -(-n // self.stride)
        total = max((out - 1) * self.stride + self.kernel - n, 0)
        return total // 2, total - total // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (t, b), (l, r) = self._pads(x.shape[-2]), self._pads(x.shape[-1])
        x = F.pad(x, (l, r, t, b), value=float("-inf"))
        return F.max_pool2d(x, self.kernel, self.stride)


def _classes_out(name: str, num_classes: int, regression_ok: bool = True) -> int:
    if num_classes == 0 and not regression_ok:
        raise ValueError(f"model {name!r} is a classifier; the dataset is a regression task (use 'linear')")
    return num_classes if num_classes > 0 else 1


def _seq(layers: list[tuple[str, nn.Module]], num_classes: int) -> nn.Sequential:
    if num_classes == 0:
        layers.append(("squeeze", Squeeze()))
    return nn.Sequential(OrderedDict(layers))


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(f"model {name!r} needs image input [channels, height, width]; the dataset gives "
                         f"shape {tuple(input_shape)} (use an image dataset such as 'digits-img', 'mnist' or "
                         "'cifar10', or a flat model such as 'mlp')")
    c, h, w = input_shape
    return c, h, w


def _pool_out(n: int, k: int, s: int, p: int, d: int = 1) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _layer_shape(mod: nn.Module, shape: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """Output shape of one feature layer, or None for a layer type this helper does not know."""
    c, h, w = shape
    if isinstance(mod, nn.Conv2d):
        assert isinstance(mod.padding, tuple)
        hw = [_pool_out(n, mod.kernel_size[i], mod.stride[i], mod.padding[i], mod.dilation[i])
              for i, n in enumerate((h, w))]
        if c != mod.in_channels:
            raise ValueError(f"expected {mod.in_channels} channels, got {c}")
        return mod.out_channels, hw[0], hw[1]
    if isinstance(mod, nn.MaxPool2d) and isinstance(mod.kernel_size, int) and not mod.ceil_mode:
        st = mod.stride if isinstance(mod.stride, int) else mod.kernel_size
        pd = mod.padding if isinstance(mod.padding, int) else 0
        return c, _pool_out(h, mod.kernel_size, st, pd), _pool_out(w, mod.kernel_size, st, pd)
    if isinstance(mod, MaxPoolSame):
        return c, -(-h // mod.stride), -(-w // mod.stride)
    if isinstance(mod, CenterCrop):
        return c, min(h, mod.size), min(w, mod.size)
    if isinstance(mod, nn.ReLU | nn.LocalResponseNorm | nn.Identity):
        return shape
    return None


def _flat_size(name: str, features: nn.Sequential, input_shape: tuple[int, ...]) -> int:
    """Size of ``features``' output for one input. Shapes are computed layer by layer (a meta-device
    forward would pull in PyTorch's Python decompositions, seconds of import time); unknown layer types
    fall back to a real forward of one dummy sample."""
    shape = _image_shape(name, input_shape)
    for mod in features:
        nxt = _layer_shape(mod, shape)
        if nxt is None:
            return _flat_size_by_forward(name, features, input_shape)
        if min(nxt) < 1:
            raise ValueError(f"input shape {tuple(input_shape)} is too small for model {name!r} (shape "
                             f"{shape} before {type(mod).__name__}); try options.padding = 'same' or a "
                             "larger input")
        shape = nxt
    return shape[0] * shape[1] * shape[2]


def _flat_size_by_forward(name: str, features: nn.Module, input_shape: tuple[int, ...]) -> int:
    dev = next(features.parameters()).device
    dummy = torch.zeros(1, *input_shape, device=dev)
    try:
        with torch.no_grad():
            out = features(dummy)
    except RuntimeError as e:
        raise ValueError(f"input shape {tuple(input_shape)} is too small for model {name!r} ({e}); "
                         "try options.padding = 'same' or a larger input") from None
    if out.numel() == 0:
        raise ValueError(f"input shape {tuple(input_shape)} is too small for model {name!r}")
    return int(out[0].numel())


def _mlp_layers(d_in: int, hidden: list[int], d_out: int, bias: bool) -> list[tuple[str, nn.Module]]:
    layers: list[tuple[str, nn.Module]] = [("flatten", nn.Flatten())]
    for i, h in enumerate(hidden, start=1):
        layers += [(f"fc{i}", nn.Linear(d_in, h, bias=bias)), (f"relu{i}", nn.ReLU())]
        d_in = h
    layers.append(("out", nn.Linear(d_in, d_out, bias=bias)))
    return layers


@register_model("logreg", description="softmax (multinomial logistic) regression: one linear layer")
def logreg(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    out = _classes_out("logreg", num_classes, regression_ok=False)
    return _seq(_mlp_layers(math.prod(input_shape), [], out, spec.bias), num_classes)


@register_model("linear", description="linear regression x -> w.x + b, output [n]")
def linear(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if num_classes != 0:
        raise ValueError("model 'linear' is linear regression (num_classes 0); use 'logreg' for "
                         f"classification ({num_classes} classes)")
    return _seq(_mlp_layers(math.prod(input_shape), [], 1, spec.bias), 0)


@register_model("mlp", description="fully connected ReLU network with hidden widths ModelSpec.hidden")
def mlp(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    out = _classes_out("mlp", num_classes)
    return _seq(_mlp_layers(math.prod(input_shape), list(spec.hidden), out, spec.bias), num_classes)


@register_model("mlp200", description="MLP 200-200 (Fed-CHS App. A, MNIST)")
def mlp200(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    out = _classes_out("mlp200", num_classes)
    return _seq(_mlp_layers(math.prod(input_shape), [200, 200], out, spec.bias), num_classes)


def _conv_block(i: int, c_in: int, c_out: int, k: int, padding: str, bias: bool, pool: nn.Module,
                ) -> list[tuple[str, nn.Module]]:
    pad = k // 2 if padding == "same" else 0
    return [(f"conv{i}", nn.Conv2d(c_in, c_out, k, padding=pad, bias=bias)), (f"relu_c{i}", nn.ReLU()),
            (f"pool{i}", pool)]


def _conv_net(name: str, features: list[tuple[str, nn.Module]], dense: list[int],
              input_shape: tuple[int, ...], num_classes: int, bias: bool) -> nn.Module:
    flat = _flat_size(name, nn.Sequential(OrderedDict(features)), input_shape)
    out = _classes_out(name, num_classes)
    layers = [*features, ("flatten", nn.Flatten())]
    d = flat
    for i, h in enumerate(dense, start=1):
        layers += [(f"fc{i}", nn.Linear(d, h, bias=bias)), (f"relu{i}", nn.ReLU())]
        d = h
    layers.append(("out", nn.Linear(d, out, bias=bias)))
    return _seq(layers, num_classes)


@register_model("lenet", options=LeNetOptions,
                description="Fed-CHS LeNet: mnist conv64-conv256-512-128, cifar conv64-conv64-384-192")
def lenet(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Fed-CHS App. A (docs/specs/fedchs.md sec. 4 Models): two 5x5 conv + 2x2 max-pool stages, then two FC
    layers, ReLU everywhere. MNIST: 64 and 256 kernels, FC 512 and 128. CIFAR-10/100: 64 and 64
    kernels, FC 384 and 192 (the TF CIFAR-10 tutorial CNN)."""
    o: LeNetOptions = spec.model_options()
    c, _, _ = _image_shape("lenet", input_shape)
    variant = o.variant if o.variant != "auto" else ("mnist" if c == 1 else "cifar")
    ch, dense = ((64, 256), [512, 128]) if variant == "mnist" else ((64, 64), [384, 192])
    feats = (_conv_block(1, c, ch[0], 5, o.padding, spec.bias, nn.MaxPool2d(2))
             + _conv_block(2, ch[0], ch[1], 5, o.padding, spec.bias, nn.MaxPool2d(2)))
    return _conv_net("lenet", feats, dense, input_shape, num_classes, spec.bias)


@register_model("alexnet-small", options=AlexNetOptions,
                description="small AlexNet of Zhang et al. 2017 (FedCluster sec. IV-A): 1,387,786 parameters "
                "on CIFAR-10")
def alexnet_small(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """FedCluster's "AlexNet model [42]" (docs/specs/fedcluster.md 4.2): the inputs are centre-cropped 32 -> 28
    as in [42]; conv 5x5x64 SAME, ReLU, max-pool 3x3/2 SAME, LRN; the same again; FC 384, FC 192, FC C.
    LRN is TF's ``depth_radius=4, bias=1, alpha=0.001/9, beta=0.75`` = PyTorch ``LocalResponseNorm(9,
    0.001, 0.75, 1.0)``. Parameters: 1,387,786 for 3x32x32 -> 10; 1,384,586 for 1x28x28 -> 10."""
    o: AlexNetOptions = spec.model_options()
    c, _, _ = _image_shape("alexnet-small", input_shape)
    feats: list[tuple[str, nn.Module]] = [("crop", CenterCrop(o.crop))] if o.crop else []
    for i, c_in in ((1, c), (2, 64)):
        feats += _conv_block(i, c_in, 64, 5, "same", spec.bias, MaxPoolSame(3, 2))
        if o.lrn:
            feats.append((f"lrn{i}", nn.LocalResponseNorm(9, alpha=0.001, beta=0.75, k=1.0)))
    return _conv_net("alexnet-small", feats, [384, 192], input_shape, num_classes, spec.bias)


@register_model("cnn2", options=CNN2Options,
                description="two-layer CNN (McMahan et al. 2017): conv32-conv64 5x5, pool 2, FC 512")
def cnn2(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """FGDRO App. G's "two layer CNN" (architecture unspecified; docs/specs/fgdro.md 4.1). This is the
    FedAvg CNN of McMahan et al. 2017: two 5x5 convolutions (32, 64 channels), each followed by ReLU and
    2x2 max-pooling, an FC layer of 512 with ReLU, and the output layer (1,663,370 parameters on MNIST)."""
    o: CNN2Options = spec.model_options()
    c, _, _ = _image_shape("cnn2", input_shape)
    feats = (_conv_block(1, c, o.channels[0], o.kernel, o.padding, spec.bias, nn.MaxPool2d(2))
             + _conv_block(2, o.channels[0], o.channels[1], o.kernel, o.padding, spec.bias, nn.MaxPool2d(2)))
    return _conv_net("cnn2", feats, [o.fc], input_shape, num_classes, spec.bias)


@register_model("cnn3", description="FOCUS App. F CNN: conv16-conv32-conv64 3x3 with pool 2, FC 500")
def cnn3(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The "three-layer convolutional neural network" of FOCUS App. F (docs/specs/focus.md 5.2, authors'
    CNN_CIFAR10): three 3x3 convs (16, 32, 64; padding 1) each with ReLU and 2x2 max-pooling, FC 500,
    ReLU, output (541,094 parameters on CIFAR-10)."""
    c, _, _ = _image_shape("cnn3", input_shape)
    feats = (_conv_block(1, c, 16, 3, "same", spec.bias, nn.MaxPool2d(2))
             + _conv_block(2, 16, 32, 3, "same", spec.bias, nn.MaxPool2d(2))
             + _conv_block(3, 32, 64, 3, "same", spec.bias, nn.MaxPool2d(2)))
    return _conv_net("cnn3", feats, [500], input_shape, num_classes, spec.bias)
