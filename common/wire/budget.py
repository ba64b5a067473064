"""What one peer may have arriving at once: open bundles and their announced payload bytes.

A :class:`~fedhop.common.wire.messages.MessageAssembler` reserves a bundle's announced size here when its
header arrives, *before* the decoder allocates anything, and releases it when the message completes or fails.
One budget per peer: a parent's session with one child, or every ``Edge.HandOff`` stream from one neighbour.
"""

from __future__ import annotations

import threading


class InflightBudget:
    """Caps on the bundles one peer has in flight: at most ``max_open`` at once, ``max_bytes`` payload bytes in
    all (None: no cap). Thread-safe: the hand-offs of one neighbour arrive on several threads."""

    def __init__(self, max_open: int | None = None, max_bytes: int | None = None) -> None:
        self.max_open = max_open
        self.max_bytes = max_bytes
        self._open = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> str | None:
        """Take one bundle of ``nbytes``; None when it fits, else why not (nothing is taken then)."""
        with self._lock:
            if self.max_open is not None and self._open >= self.max_open:
                return (f"{self._open} bundles from this peer are already arriving "
                        f"(transport.max_open_bundles = {self.max_open})")
            if self.max_bytes is not None and self._bytes + nbytes > self.max_bytes:
                return (f"a bundle of {nbytes} bytes on top of the {self._bytes} bytes already arriving from this "
                        f"peer exceeds transport.max_inflight_bytes = {self.max_bytes}")
            self._open += 1
            self._bytes += nbytes
            return None

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._open -= 1
            self._bytes -= nbytes

    @property
    def in_flight(self) -> tuple[int, int]:
        """(open bundles, reserved payload bytes)."""
        with self._lock:
            return self._open, self._bytes
