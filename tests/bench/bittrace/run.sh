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
    rows[e] = sorted(recs, key=lambda r: r["call"])
print(f"== {base.split('/')[-1]}")
keys = ["state", "thread", "threads", "omp_max", "mkldnn", "params", "x", "y", "loss", "grads", "repeat_same",
        "fresh_copy_same", "new_thread_same", "fresh_grads"]
for s, l in zip(rows["simulate"], rows["launch"]):
    print(f" call {s['call']}")
    for k in keys:
        mark = "" if s[k] == l[k] else "   <-- differs"
        print(f'   {k:16s} {str(s[k])}\n{" "*19}{str(l[k])}{mark}')
    diff = [k for k in s["grad_each"] if s["grad_each"][k] != l["grad_each"][k]]
    print(f"   grads differ in {diff}")
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
