"""Bit-identity probe for one CPU (issue 19, docs/benchmarks.md "Bit-identity on a 16-core Intel host"): does the
same arithmetic give the same bits in this process, again, in a forked child, on a worker thread, under one
thread, and from inputs at other alignments?

    python tests/bench/bitprobe.py DATA_DIR     # DATA_DIR written by examples/npy_cnn/images.py prepare

It runs itself in one fresh interpreter per ``MKL_CBWR`` setting (MKL reads the variable when it starts) and prints,
for each, one hash per context of (a) a dense product (257x1031 @ 1031x129, float32, through MKL) with its left
operand at element offsets 0-15, and (b) ten SGD steps of examples/npy_cnn's CNN on client 0's data. One hash per
row means the bits do not depend on that context; several mean they do. Nothing is asserted: it is a diagnostic
for a machine a test suite cannot reach (a lent device's Intel CPU).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ["OFF (unset, fedhop not imported)", "AUTO,STRICT"]


def _digest(tensors) -> str:
    return hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes() for t in tensors)).hexdigest()[:12]


def _products() -> list[str]:
    import torch
    g = torch.Generator().manual_seed(5)
    a = torch.randn(257, 1031, generator=g)
    b = torch.randn(1031, 129, generator=g)
    out = []
    for off in range(16):
        buf = torch.empty(a.numel() + off)
        view = buf[off:off + a.numel()].view_as(a)
        view.copy_(a)
        out.append(_digest([view @ b]))
    return out


def _train(data: Path, *, threads: int | None = None, offset: int = 0) -> str:
    import numpy as np
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(ROOT / "examples" / "npy_cnn"))
    from images import build
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        x = torch.from_numpy(np.load(data / "client_0_x.npy").astype(np.float32) / 255.0)
        y = torch.from_numpy(np.load(data / "client_0_y.npy"))
        torch.manual_seed(0)
        model = build((1, 12, 12), 4, 0)
        if offset:
            with torch.no_grad():
                for p in model.parameters():
                    buf = torch.empty(p.numel() + offset)
                    buf[offset:].copy_(p.reshape(-1))
                    p.data = buf[offset:].view_as(p)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        g = torch.Generator().manual_seed(1)
        for _ in range(10):
            idx = torch.randint(0, len(x), (16,), generator=g)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return _digest(list(model.parameters()))
    finally:
        torch.set_num_threads(saved)


def _in_fork(fn) -> str:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.write(w, fn().encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = f.read()
    os.waitpid(pid, 0)
    return got


def _in_thread(fn) -> str:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join()
    return box[0]


def _with_busy_threads(fn, n: int = 4):
    """fn() while n Python threads spin on the interpreter, so that the GIL changes hands every switch interval
    and the calling thread is descheduled and woken many times in the middle of its arithmetic (as a launch
    client's task thread is, beside its asyncio and gRPC threads)."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        return fn()
    finally:
        stop.set()
        for t in threads:
            t.join()


def child(data: Path, import_fedhop: bool) -> None:
    if import_fedhop:
        import fedhop  # noqa: F401  (as a role process does)
    import torch
    print(f"  MKL_CBWR={os.environ.get('MKL_CBWR')!r} threads={torch.get_num_threads()} "
          f"capability={torch.backends.cpu.get_cpu_capability()} mkldnn={torch.backends.mkldnn.is_available()}")
    # The forks first, while this process has not yet started OpenMP threads (GNU OpenMP is not fork-safe;
    # fedhop's fork server likewise forks before any arithmetic).
    forked_prod = _in_fork(lambda: _products()[0])
    forked = _in_fork(lambda: _train(data))
    forked_one = _in_fork(lambda: _train(data, threads=1))
    prods = _products()
    print(f"  product at offsets 0-15: {len(set(prods))} distinct hash(es): {' '.join(prods)}")
    print(f"  product in a forked child (offset 0): {forked_prod}")
    rows = {
        "train, this process": _train(data),
        "train, again": _train(data),
        "train, forked child": forked,
        "train, worker thread": _in_thread(lambda: _train(data)),
        "train, one thread": _train(data, threads=1),
        "train, params at +1 element": _train(data, offset=1),
        "train, params at +3 elements": _train(data, offset=3),
        "train, forked child, one thread": forked_one,
    }
    busy = [_with_busy_threads(lambda: _train(data)) for _ in range(6)]
    rows["train, 4 spinning threads beside (x6)"] = busy[0]
    print(f"  train beside 4 spinning Python threads, 6 times: {len(set(busy))} distinct hash(es) "
          f"{' '.join(sorted(set(busy)))}")
    for k, v in rows.items():
        print(f"  {k:34s} {v}")
    print(f"  train: {len(set(rows.values()))} distinct hash(es) over {len(rows)} contexts")


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), sys.argv[3] == "1")
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    data = Path(sys.argv[1]).resolve()
    for setting in SETTINGS:
        env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
        imp = "1"
        if setting.startswith("OFF"):
            imp = "0"
        else:
            env["MKL_CBWR"] = setting
        print(f"MKL_CBWR {setting}:", flush=True)
        subprocess.run([sys.executable, __file__, "--child", str(data), imp], env=env, check=True)


if __name__ == "__main__":
    main()
