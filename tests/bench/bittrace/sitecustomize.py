"""Where a client's arithmetic first differs between engines (issue 19, "Bit-identity on a 16-core Intel host").

Put this folder first on PYTHONPATH and set BITTRACE_DIR: every Python process then wraps fedhop's
``loss_and_grad`` (common/algorithms/local.py) and writes, for its first BITTRACE_CALLS calls (default 3), one JSON
line per call to BITTRACE_DIR/trace-<pid>.jsonl: hashes of the parameters, the batch, the loss and the gradient,
the inputs' alignment and strides, the thread and torch's thread count, the thread's MXCSR (and a new thread's),
the CPUs each of six repeats started and ended on, and whether the same call repeated on the same tensors, and
on fresh contiguous copies of them, gives the same bits; for the first call, two logs of every ATen operator it
ran (inputs' and outputs' hashes: the first operator that parts two logs), the first log's inputs saved to
BITTRACE_DIR/ops-<pid>.pkl (run.sh replays the operator where the engines part in a process of its own).
Compare a simulate run's lines with a launch run's: the first field that differs is where the engines part.
BITTRACE_NO_MKLDNN=1 turns oneDNN off.
"""

import os

if os.environ.get("BITTRACE_DIR"):
    import hashlib
    import json
    import threading

    import torch

    if os.environ.get("BITTRACE_NO_MKLDNN") == "1":
        torch.backends.mkldnn.enabled = False
    import fedhop.common.algorithms.local as _local

    _orig = _local.loss_and_grad
    _calls = {"n": 0}
    _limit = int(os.environ.get("BITTRACE_CALLS", "3"))

    def _h(t: torch.Tensor) -> str:
        return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:10]

    def _hb(b: dict) -> str:
        return hashlib.sha256("".join(_h(v) for v in b.values()).encode()).hexdigest()[:10]

    def _layout(t: torch.Tensor) -> str:
        return f"{t.data_ptr() % 64}/{tuple(t.stride())}/{int(t.is_contiguous())}"

    def _omp_max() -> int:
        """omp_get_max_threads() of the calling thread (the OpenMP runtime torch loaded), -1 if none is found."""
        import ctypes
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "gomp" in line or "libiomp" in line}
        for lib in libs:
            try:
                return int(ctypes.CDLL(lib).omp_get_max_threads())
            except (OSError, AttributeError):
                continue
        return -1

    def _mxcsr() -> str:
        """The calling thread's MXCSR (rounding, flush-to-zero, denormals-are-zero; the sticky exception flags
        masked off), read with glibc's fegetenv: its x86-64 fenv_t holds the register at byte 28."""
        import ctypes
        buf = ctypes.create_string_buffer(32)
        ctypes.CDLL("libm.so.6").fegetenv(buf)
        return hex(int.from_bytes(buf.raw[28:32], "little") & ~0x3F)

    def _cpu() -> int:
        import ctypes
        return int(ctypes.CDLL(None).sched_getcpu())

    def _in_new_thread(fn):
        box = []
        t = threading.Thread(target=lambda: box.append(fn()))
        t.start()
        t.join()
        return box[0]

    def _ops(fn):
        """Run ``fn`` with every ATen operator it reaches (forward and autograd's backward, on this thread)
        logged: (operator, hashes of its tensor inputs, hashes of its tensor outputs). The first operator whose
        inputs hash the same in two logs and whose outputs do not is where they part."""
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves, tree_map

        class _Log(TorchDispatchMode):
            def __init__(self) -> None:
                super().__init__()
                self.rows: list = []
                self.calls: list = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                frozen = tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v,
                                  (args, kwargs or {}))  # the inputs as they were, to replay the operator
                out = func(*args, **(kwargs or {}))
                tensors = lambda v: [_h(t) for t in tree_leaves(v) if isinstance(t, torch.Tensor)]  # noqa: E731
                self.rows.append([str(func), tensors((args, kwargs)), tensors(out)])
                self.calls.append((str(func), *frozen))
                return out

        with _Log() as m:
            fn()
        return m.rows, m.calls

    def _traced(ws, params, x, y):
        omp = _omp_max()
        loss, grads = _orig(ws, params, x, y)
        _calls["n"] += 1
        if _calls["n"] <= _limit:
            try:
                _record(ws, params, x, y, loss, grads, omp)
            except Exception as e:  # the tracer never changes the run: its own failure is a line of the trace
                with open(os.path.join(os.environ["BITTRACE_DIR"], f"trace-{os.getpid()}.jsonl"), "a") as f:
                    f.write(json.dumps({"call": _calls["n"], "tracer_error": repr(e)}) + "\n")
        return loss, grads

    def _record(ws, params, x, y, loss, grads, omp):
        again = _orig(ws, params, x, y)
        fresh = _orig(ws, {k: v.detach().clone() for k, v in params.items()}, x.clone(), y.clone())
        other = _in_new_thread(lambda: _orig(ws, params, x, y))
        reps, cpus = set(), []
        for _ in range(6):
            cpus.append(_cpu())
            reps.add(_hb(_orig(ws, params, x, y)[1]))
            cpus.append(_cpu())
        tiny = torch.tensor([1e-39], dtype=torch.float32)
        state = {"matmul_precision": torch.get_float32_matmul_precision(),
                 "deterministic": torch.are_deterministic_algorithms_enabled(),
                 "ftz_daz": bool((tiny * 1.0 == 0).item()), "py_threads": threading.active_count(),
                 "interop": torch.get_num_interop_threads(), "mkl_cbwr": os.environ.get("MKL_CBWR"),
                 "distinct_of_6": len(reps), "mxcsr": _mxcsr(), "cpus_before_after": cpus,
                 "mxcsr_new_thread": _in_new_thread(_mxcsr)}
        rec = {"state": state,
            "pid": os.getpid(), "call": _calls["n"], "thread": threading.current_thread().name,
            "threads": torch.get_num_threads(), "omp_max": omp, "mkldnn": torch.backends.mkldnn.enabled,
            "params": _hb(params), "x": _h(x), "y": _h(y), "loss": float(loss).hex(), "grads": _hb(grads),
            "grad_each": {k: _h(v) for k, v in grads.items()},
            "repeat_same": _hb(again[1]) == _hb(grads), "fresh_copy_same": _hb(fresh[1]) == _hb(grads),
            "new_thread_same": _hb(other[1]) == _hb(grads),
            "fresh_grads": _hb(fresh[1]),
            "x_layout": _layout(x), "param_layout": {k: _layout(v) for k, v in params.items()},
        }
        if _calls["n"] == 1:  # every operator of the first call, twice: where the engines part, and repeats
            logs = [_ops(lambda: _orig(ws, params, x, y)) for _ in range(2)]
            rec["ops"] = [rows for rows, _ in logs]
            import pickle  # (torch.save cannot pickle a torch.memory_format argument)
            with open(os.path.join(os.environ["BITTRACE_DIR"], f"ops-{os.getpid()}.pkl"), "wb") as f:
                pickle.dump(logs[0][1], f)
        with open(os.path.join(os.environ["BITTRACE_DIR"], f"trace-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")

    _local.loss_and_grad = _traced
