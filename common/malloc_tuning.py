"""Give freed bulk buffers back to the OS at once (glibc), so a node's RSS follows what it holds (issue 11).

Bundles travel as ~1 MiB chunk frames, built and freed by several threads (gRPC's, the session readers', the
task worker). glibc raises its mmap threshold after the first such buffer is freed, after which 1 MiB blocks
come from per-thread heap arenas that keep their freed memory: on the 100 MB FedAvg job that was one to two
models' worth of RSS per process holding nothing. A fixed threshold keeps every block of 256 KiB or more in
its own mapping, unmapped when freed. Elsewhere than glibc (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("fedhop.memory")

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
THRESHOLD_BYTES = 256 << 10


def fix_mmap_threshold(threshold: int = THRESHOLD_BYTES) -> bool:
    """Set glibc's mmap threshold to ``threshold`` (which also stops its dynamic growth); False where the C
    library is not glibc or refuses."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD, %d) refused", threshold)
    return ok
