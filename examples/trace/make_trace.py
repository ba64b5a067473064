"""Writes availability.csv: a stand-in for a recorded availability log (rounds x clients, 1 = online).

Clients 0-2 and 3-5 sit in two time zones whose online windows overlap by one round in four, and every
client misses a round now and then. Replace the file with your own log (CSV or .npy) of the same layout.
"""

from __future__ import annotations

import sys

import numpy as np


def make(rounds: int = 24, clients: int = 6, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = np.arange(rounds)[:, None]
    zone = (np.arange(clients) >= clients // 2)[None, :]
    online = np.where(zone, r % 4 >= 1, r % 4 <= 1)
    return (online & (rng.random((rounds, clients)) > 0.15)).astype(np.int64)


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "availability.csv"
    table = make()
    with open(path, "w") as f:
        f.write("# rounds x clients availability, 1 = online (written by make_trace.py)\n")
        f.writelines(",".join(map(str, row)) + "\n" for row in table)
    print(f"wrote {path}: {table.shape[0]} rounds x {table.shape[1]} clients")
