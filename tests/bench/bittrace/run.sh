#!/usr/bin/env bash
# bash tests/bench/bittrace/run.sh OUTDIR: examples/npy_cnn, 1 client, 1 round, 2 local steps, simulate and launch
# under the tracer (sitecustomize.py beside this), in each variant of $VARIANTS (default: all below); prints each
# call's fields side by side. Variants: default; no-mkldnn (oneDNN off); omp1 (OMP_NUM_THREADS=1); nocuda
# (CUDA_VISIBLE_DEVICES= : no GPU visible); exec (launch --exec-children: new interpreters, no fork server);
# gcoff (FEDHOP_GC_FREEZE=0: no heap settle); perturb85, perturb170 (MALLOC_PERTURB_: glibc fills what malloc
# returns with that byte; final models that change with it mean a kernel reads memory it never wrote, which fresh
# pages hide in one process and another's heap churn shows in the other: compared across variants at the end);
# pin1 (every process of the run on one CPU, taskset -c 1: the task thread shares it with the client's other
# threads, so it is preempted mid-arithmetic, and never moves between CPUs: launch equal to simulate here, and
# different in the default, points at the vCPUs; more repeats differing, at state lost on a preemption).
# On the 16-core Intel of 2026-11-27 (docs/benchmarks.md) the launch client's gradient changed from one repeat
# of the same call to the next in the first three.
set -u
out=$(realpath "${1:?usage: run.sh OUTDIR}")
py=${PYTHON:-python3}
here=$(dirname "$(realpath "$0")")
data=$out/data
"$py" examples/npy_cnn/images.py prepare "$data" > /dev/null || exit 1
for variant in ${VARIANTS:-default no-mkldnn omp1 nocuda exec gcoff perturb85 perturb170 pin1}; do
  for e in simulate launch; do
    d=$out/$variant/$e; mkdir -p "$d"
    extra=(); args=(); pin=()
    case $variant in
      no-mkldnn) extra=(BITTRACE_NO_MKLDNN=1) ;;
      omp1) extra=(OMP_NUM_THREADS=1) ;;
      nocuda) extra=(CUDA_VISIBLE_DEVICES=) ;;
      gcoff) extra=(FEDHOP_GC_FREEZE=0) ;;
      perturb85) extra=(MALLOC_PERTURB_=85) ;;
      perturb170) extra=(MALLOC_PERTURB_=170) ;;
      exec) [ $e = launch ] && args=(--exec-children) ;;
      pin1) pin=(taskset -c 1) ;;
    esac
    "${pin[@]}" env BITTRACE_DIR="$d" PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "${extra[@]}" \
      "$py" -m fedhop $e examples/npy_cnn/spec.toml --out "$d/run" --set "data.path=$data" --set rounds=1 \
      --set topology.clients=1 --set algorithm.options.local_steps=2 --quiet "${args[@]}" > "$d/out.txt" 2>&1 \
      || echo "$variant $e failed"
  done
  "$py" - "$out/$variant" <<'PY'
import json, sys, glob, torch
base = sys.argv[1]
rows = {}
for e in ("simulate", "launch"):
    recs = [json.loads(l) for f in sorted(glob.glob(f"{base}/{e}/trace-*.jsonl")) for l in open(f)]
    for r in recs:
        if "tracer_error" in r:
            print(f"   {e}, call {r['call']}: THE TRACER FAILED: {r['tracer_error']}")
    rows[e] = sorted((r for r in recs if "tracer_error" not in r), key=lambda r: r["call"])
print(f"== {base.split('/')[-1]}")


def replay(base, i, outs):
    """Operator i of the first call, on each engine's saved inputs, five times here (a process of its own, main
    thread): whose outputs it gives, and whether it gives the same each time."""
    import hashlib
    import pickle
    from torch.utils._pytree import tree_leaves
    for e in ("simulate", "launch"):
        (f,) = glob.glob(f"{base}/{e}/ops-*.pkl") or [None]
        if f is None:
            continue
        with open(f, "rb") as fh:
            name, args, kwargs = pickle.load(fh)[i]
        op = torch.ops
        for part in name.split("."):
            op = getattr(op, part)
        got = []
        for _ in range(5):
            out = op(*args, **kwargs)
            got.append([hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()[:10]
                        for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        whose = [k for k, o in outs.items() if o == got[0]]
        print(f"   replayed here on {e}'s inputs, 5 times: {len({str(g) for g in got})} distinct result(s), "
              f"the first equal to {whose or 'neither engine'}'s")
keys = ["state", "thread", "threads", "omp_max", "mkldnn", "params", "x", "y", "loss", "grads", "repeat_same",
        "fresh_copy_same", "new_thread_same", "fresh_grads"]
for s, l in zip(rows["simulate"], rows["launch"]):
    print(f" call {s['call']}")
    for k in keys:
        mark = "" if s[k] == l[k] else "   <-- differs"
        print(f'   {k:16s} {str(s[k])}\n{" "*19}{str(l[k])}{mark}')
    diff = [k for k in s["grad_each"] if s["grad_each"][k] != l["grad_each"][k]]
    print(f"   grads differ in {diff}")
    if "ops" in s and "ops" in l:
        print(f"   operators of the call (simulate / launch): {len(s['ops'][0])} / {len(l['ops'][0])}")
        for what, a, b in (("simulate vs launch", s["ops"][0], l["ops"][0]),
                           ("simulate, two repeats", *s["ops"]), ("launch, two repeats", *l["ops"])):
            part = next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), None)
            if part is None:
                print(f"   {what}: every operator the same")
            else:
                u, v = a[part], b[part]
                print(f"   {what}: first parts at operator {part} {u[0]} (inputs "
                      f"{'the same' if u[1] == v[1] else 'differ'}; {v[0] if v[0] != u[0] else 'same operator'})")
                if what == "simulate vs launch" and u[0] == v[0]:
                    replay(base, part, {"simulate": u[2], "launch": v[2]})
a, b = (torch.load(f"{base}/{e}/run/model.pt", weights_only=True) for e in ("simulate", "launch"))
print(" final model:", "BIT-IDENTICAL" if all(torch.equal(a[k], b[k]) for k in a) else "DIFFERENT")
PY
done
"$py" - "$out" <<'PY'
import glob, hashlib, os, sys, torch
print("== final models by variant (a hash that changes with MALLOC_PERTURB_ alone: an uninitialised read)")
for p in sorted(glob.glob(f"{sys.argv[1]}/*/*/run/model.pt")):
    m = torch.load(p, weights_only=True)
    h = hashlib.sha256(b"".join(m[k].contiguous().numpy().tobytes() for k in sorted(m))).hexdigest()[:16]
    print(f"  {os.path.relpath(p, sys.argv[1]):40s} {h}")
PY
