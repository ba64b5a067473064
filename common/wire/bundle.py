"""Named tensor bundles: the unit that travels between nodes.

A bundle is an insertion-ordered ``dict[str, torch.Tensor]``. The *payload* of a bundle is the sum of its
tensors' raw byte sizes, which is what the papers count when they count communication.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

Bundle = dict[str, torch.Tensor]


def payload_bytes(bundle: Mapping[str, torch.Tensor]) -> int:
    """Raw tensor bytes of a bundle (element count x element size, summed)."""
    return sum(t.numel() * t.element_size() for t in bundle.values())


def clone(bundle: Mapping[str, torch.Tensor]) -> Bundle:
    """Deep copy: no tensor of the result aliases one of the input."""
    return {k: v.detach().clone() for k, v in bundle.items()}


def zeros_like(bundle: Mapping[str, torch.Tensor]) -> Bundle:
    return {k: torch.zeros_like(v) for k, v in bundle.items()}


def prefixed(prefix: str, bundle: Mapping[str, torch.Tensor]) -> Bundle:
    """Put ``bundle`` under a name prefix, e.g. ``prefixed("m.", momentum)``, to send several in one."""
    return {f"{prefix}{k}": v for k, v in bundle.items()}


def unprefixed(prefix: str, bundle: Mapping[str, torch.Tensor]) -> Bundle:
    """Inverse of :func:`prefixed`: the tensors whose names start with ``prefix``, prefix removed."""
    return {k[len(prefix):]: v for k, v in bundle.items() if k.startswith(prefix)}


def weighted_sum(items: Iterable[tuple[float, Mapping[str, torch.Tensor]]]) -> Bundle:
    """sum_i w_i * b_i over (weight, bundle) pairs, accumulated in the order given.

    Callers pass items in canonical (sorted node id) order so that every engine adds in the same order and
    the result is bit-identical.
    """
    out: Bundle | None = None
    for w, b in items:
        if out is None:
            out = {k: v.detach().clone().mul_(w) for k, v in b.items()}
        else:
            if b.keys() != out.keys():
                raise ValueError(f"bundles disagree on tensor names: {sorted(out)} vs {sorted(b)}")
            for k, v in b.items():
                out[k].add_(v, alpha=w)
    if out is None:
        raise ValueError("weighted_sum of no bundles")
    return out


def weighted_mean(items: Iterable[tuple[float, Mapping[str, torch.Tensor]]]) -> Bundle:
    """sum_i (w_i / sum_j w_j) b_i, in the order given."""
    pairs = list(items)
    total = float(sum(w for w, _ in pairs))
    if total <= 0:
        raise ValueError(f"weighted_mean needs a positive total weight, got {total}")
    return weighted_sum((w / total, b) for w, b in pairs)


def axpy(a: float, x: Mapping[str, torch.Tensor], y: Mapping[str, torch.Tensor]) -> Bundle:
    """y + a * x, a new bundle."""
    return {k: y[k] + a * x[k] for k in y}


def sub(x: Mapping[str, torch.Tensor], y: Mapping[str, torch.Tensor]) -> Bundle:
    """x - y, a new bundle."""
    return {k: x[k] - y[k] for k in x}


def flat(bundle: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """All tensors flattened and concatenated (float64 copy), for norms and tests."""
    if not bundle:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([v.detach().reshape(-1).to(torch.float64) for v in bundle.values()])


def non_finite(bundle: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of floating tensors holding NaN or Inf.

    A finite sum implies finite elements (NaN and Inf propagate through addition), and one reduction is
    several times faster than the elementwise test; only a non-finite sum (which a finite overflow can also
    cause) needs the elementwise test.
    """
    return [k for k, v in bundle.items() if v.is_floating_point() and not bool(torch.isfinite(v.sum()))
            and not bool(torch.isfinite(v).all())]
