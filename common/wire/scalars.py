"""Small typed control values on the wire (``pb.Scalar``, ``map<string, Scalar>``): never tensors."""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np

from fedhop.common.wire.codec import CodecError
from fedhop.v1 import fedhop_pb2 as pb

Scalar = float | int | str | bool
_INT64 = (-(1 << 63), (1 << 63) - 1)


def to_scalar(value: object) -> pb.Scalar:
    """A Python/numpy bool, int (int64 range), float or str as a ``pb.Scalar``."""
    if isinstance(value, bool | np.bool_):
        return pb.Scalar(bool_value=bool(value))
    if isinstance(value, numbers.Integral):
        v = int(value)
        if not _INT64[0] <= v <= _INT64[1]:
            raise CodecError(f"integer scalar {v} does not fit in int64")
        return pb.Scalar(int_value=v)
    if isinstance(value, numbers.Real):
        return pb.Scalar(double_value=float(value))
    if isinstance(value, str):
        return pb.Scalar(string_value=value)
    raise CodecError(f"a scalar is a bool, int, float or str, got {type(value).__name__}: {value!r}")


def from_scalar(s: pb.Scalar) -> Scalar:
    kind = s.WhichOneof("value")
    if kind is None:
        raise CodecError("empty Scalar (no value set)")
    return getattr(s, kind)


def put_scalars(target: object, values: Mapping[str, object]) -> None:
    """Fill a ``map<string, Scalar>`` field (e.g. ``task.args``) from a dict."""
    for k, v in values.items():
        target[k].CopyFrom(to_scalar(v))  # type: ignore[index]


def get_scalars(source: Mapping[str, pb.Scalar]) -> dict[str, Scalar]:
    """A ``map<string, Scalar>`` field as a dict, keys sorted (protobuf maps have no order)."""
    return {k: from_scalar(source[k]) for k in sorted(source)}
