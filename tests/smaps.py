"""Reading this process's memory map in tests (Linux): how much of one mapping is resident."""

from __future__ import annotations

from pathlib import Path


def mapped_rss(address: int) -> int:
    """The resident bytes of the mapping that holds ``address`` (its Rss line in /proc/self/smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        head = line.split(" ", 1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            if lo <= address < hi:
                rss = next(x for x in lines[i + 1:] if x.startswith("Rss:"))
                return int(rss.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x} in /proc/self/smaps")
