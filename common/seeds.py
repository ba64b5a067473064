"""Seeds derived from names: one 63-bit seed per stream, stable across processes, machines and Python versions."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any tuple of ints/strings, stable across processes and Python versions."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1
