#!/usr/bin/env bash
# The checks of issue 19 that need a lent device machine, in one script so that one call of the device tool runs
# them all (docs/benchmarks.md, "GPU (H100/H200)" and "Bit-identity on a 16-core Intel host"):
#   1. the machine (GPU, CPU model and flags, versions);
#   2. bit-identity on its CPU: examples/npy_cnn, `fedhop simulate` against `fedhop launch` (MKL_CBWR unset and
#      AUTO,STRICT), launch against launch, 20 rounds, OMP_NUM_THREADS=1; MKL's own log (MKL_VERBOSE) of one local
#      step in each engine (part "bitid"; part "engines" is its short form: 8 and 20 rounds, MKL as it is); the tracer of a client's calls (tests/bench/bittrace, part "trace");
#      tests/bench/bitprobe.py ("probe"); the equivalence tests ("equivalence");
#   3. the GPU tests (what `make test-gpu` runs; part "gpu").
# Usage, from the repository root, with fedhop's dependencies importable by $PYTHON (default python3):
#   [PARTS="bitid engines trace probe equivalence gpu"] bash tests/gpu/device_check.sh OUTDIR
# On the lent H200 of 2026-11-27 parts bitid, probe, equivalence and gpu took ~470 s together.
# Through the device tool (its machine has a Python 3.12 with torch and no package index; list what else it has
# with `pip list` in the first call): download fedhop's other dependencies here into the git-ignored folder .whl,
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_28_x86_64 grpcio grpcio-health-checking protobuf pydantic cryptography xxhash \
#     starlette uvicorn prometheus-client setproctitle idna
# (keep one wheel per package: the install below names every file in .whl, and a second download with other
# platform tags can leave two builds of one version, as cryptography's manylinux2014 and _2_28 on 2026-11-27)
# then run, with carry [".whl"] and a timeout that leaves time to rerun:
#   pip install -q --no-index --target /tmp/site .whl/*.whl && \
#     PYTHONPATH=/tmp/site:$PWD PARTS="engines equivalence" bash tests/gpu/device_check.sh "$OUT"
# ($PWD: fedhop is not installed there, and the tracer's sitecustomize imports it before `python -m` adds the
# working directory. Part engines ~1 minute on the lent H200, trace 9 variants ~4, probe ~1. The twelfth session's
# two calls: docs/benchmarks.md, "Bit-identity on a 16-core Intel host".)
set -u
out=$(realpath "${1:?usage: device_check.sh OUTDIR}")
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
data=$work/data
spec=examples/npy_cnn/spec.toml
log=$out/bitid.log

{
  date -u; uptime; nvidia-smi -L
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket"
  grep -o -w -E "avx512[a-z_]*|avx2|amx[a-z_]*" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  "$py" -c "import sys, torch, numpy; print(sys.version); print('torch', torch.__version__, 'numpy', numpy.__version__,
'threads', torch.get_num_threads(), 'cuda', torch.cuda.is_available()); print(torch.__config__.show())"
} > "$out/machine.txt" 2>&1

"$py" examples/npy_cnn/images.py prepare "$data" > /dev/null || exit 1
parts=" ${PARTS:-bitid engines trace probe equivalence gpu} "
want() { [[ $parts == *" $1 "* ]]; }

# fh ENGINE NAME [args...]: one run of the example into $work/NAME (environment from the caller)
fh() {
  local engine=$1 name=$2; shift 2
  local t0=$SECONDS
  "$py" -m fedhop "$engine" "$spec" --out "$work/$name" --set "data.path=$data" --quiet "$@" \
    > "$work/$name.out" 2>&1 || { echo "  $name: $engine FAILED (exit $?)"; tail -5 "$work/$name.out"; }
  echo "  $name: $engine $* ($((SECONDS - t0)) s)"
}
# same A B: whether two runs' final models are equal bit for bit, and the largest difference
same() {
  "$py" - "$work/$1/model.pt" "$work/$2/model.pt" <<'EOF'
import sys
import torch
a, b = (torch.load(p, map_location="cpu", weights_only=True) for p in sys.argv[1:3])
diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
equal = all(torch.equal(a[k], b[k]) for k in a)
print(f"  => {sys.argv[1].split('/')[-2]} vs {sys.argv[2].split('/')[-2]}: "
      f"{'BIT-IDENTICAL' if equal else 'DIFFERENT'}, max |diff| {diff:.3g}")
EOF
}

want bitid && {
  echo "== bit-identity on this CPU: examples/npy_cnn, 8 rounds, 4 clients"
  for cbwr in unset AUTO,STRICT; do
    if [ $cbwr = unset ]; then unset MKL_CBWR; else export MKL_CBWR=$cbwr; fi
    echo "-- MKL_CBWR: $cbwr"
    fh simulate sim-$cbwr --set rounds=8
    fh launch lau-$cbwr --set rounds=8
    fh launch lau1-$cbwr --set rounds=8 --clients-per-process 1
    same sim-$cbwr lau-$cbwr
    same sim-$cbwr lau1-$cbwr
    same lau-$cbwr lau1-$cbwr
    fh simulate sim1c-$cbwr --set rounds=2 --set topology.clients=1
    fh launch lau1c-$cbwr --set rounds=2 --set topology.clients=1
    same sim1c-$cbwr lau1c-$cbwr
  done
  unset MKL_CBWR
  echo "-- 20 rounds (the issue's original comparison)"
  fh simulate sim20 && fh launch lau20
  same sim20 lau20
  echo "-- OMP_NUM_THREADS=1, 8 rounds"
  OMP_NUM_THREADS=1 fh simulate simomp1 --set rounds=8
  OMP_NUM_THREADS=1 fh launch lauomp1 --set rounds=8
  same simomp1 lauomp1
  echo "-- MKL_VERBOSE: 1 client, 1 round, 1 local step (MKL's calls of each process, in mkl/)"
  MKL_VERBOSE=1 fh simulate mklsim --set rounds=1 --set topology.clients=1 --set algorithm.options.local_steps=1
  MKL_VERBOSE=1 fh launch mkllau --set rounds=1 --set topology.clients=1 --set algorithm.options.local_steps=1
  same mklsim mkllau
} > "$log" 2>&1
# part "engines": the short form of "bitid" (MKL left as it is), what issue 19 asks on a 16-core Intel host
want engines && {
  echo "== simulate against launch on this CPU: examples/npy_cnn (device = \"cpu\" in its spec)"
  fh simulate esim8 --set rounds=8
  fh launch elau8 --set rounds=8
  fh launch elau8p1 --set rounds=8 --clients-per-process 1
  same esim8 elau8
  same esim8 elau8p1
  fh simulate esim20 && fh launch elau20
  same esim20 elau20
} > "$out/engines.log" 2>&1
if want bitid; then
  mkdir -p "$work/mkl"
  cp "$work"/mklsim.out "$work/mkl/" 2>/dev/null
  cp -r "$work"/mkllau/logs "$work/mkl/lau-logs" 2>/dev/null
  cp "$work"/mkllau.out "$work/mkl/" 2>/dev/null
  tar -czf "$out/mkl.tgz" -C "$work" mkl
fi

if want trace; then  # the folder comes back even when the kit ran out of time
  PYTHON=$py timeout 420 bash tests/bench/bittrace/run.sh "$work/trace" > "$out/trace.log" 2>&1
  echo "trace exit $?" >> "$out/trace.log"
  tar -czf "$out/trace.tgz" -C "$work" trace
fi

want probe && timeout 240 "$py" tests/bench/bitprobe.py "$data" > "$out/probe.log" 2>&1

want equivalence && timeout 300 "$py" -m pytest tests/integration/test_network_equivalence.py tests/integration/test_cpu_variants.py \
  -q -n 8 -p no:cacheprovider > "$out/equivalence.log" 2>&1

# 3. the GPU tests (make test-gpu)
if want gpu; then
  CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 400 "$py" -m pytest tests/gpu -v -s -rs -p no:cacheprovider \
    > "$out/gpu.log" 2>&1
  echo "gpu tests exit $?" >> "$out/gpu.log"
fi
uptime >> "$out/machine.txt"
