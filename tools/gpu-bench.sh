#!/usr/bin/env bash
# The one-command GPU benchmark, for the H100 test machine (no Rust there: it runs the
# prebuilt .device/kgen). Runs the PyTorch peers (bench/torch_peers.py) and then
# `kgen bench` on the same GPU, writes everything under $OUT, and prints the
# side-by-side table last.
#
# Prepare on the development machine:
#   cargo build --release && mkdir -p .device && cp target/release/kgen .device/
# then run `bash tools/gpu-bench.sh` on the device with `.device` carried.
#
# Time: < 9 minutes. The torch peers run in two passes with their own time limits
# (torch_peers.py rewrites its JSON after every peer, so a pass cut short keeps what it
# measured): eager / fused / foreach / cuBLAS first, then the torch.compile peers, whose
# cold Inductor compiles are the slow part. Knobs (environment):
#   KGEN_BIN (.device/kgen)   OUT (/tmp/kgen-gpu-bench)   FILTER (both tools' filter)
#   QUICK=1 (median of 20 runs instead of 50, both tools)   NO_COMPILE=1 (skip pass 2)
#   EAGER_TIMEOUT (150 s)   COMPILE_TIMEOUT (210 s)   KGEN_TIMEOUT (400 s: the GEMM and
#   linear rows tune too)
set -uo pipefail
cd "$(dirname "$0")/.."
# cuBLAS (the GEMM peer, loaded by kgen through cudarc at run time): the toolkit's, or
# the one torch's wheels ship.
cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null || true)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64${cublas_dir:+:$cublas_dir}"
BIN=${KGEN_BIN:-.device/kgen}
OUT=${OUT:-/tmp/kgen-gpu-bench}
mkdir -p "$OUT"
start=$(date +%s)
if [ ! -x "$BIN" ]; then
    echo "gpu-bench: no kgen binary at $BIN; build it on the development machine:" >&2
    echo "  cargo build --release && mkdir -p .device && cp target/release/kgen .device/" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv,noheader >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

quick=()
[ "${QUICK:-0}" = 1 ] && quick=(--quick)
torch_filter=()
kgen_filter=()
if [ -n "${FILTER:-}" ]; then
    torch_filter=(--filter "$FILTER")
    kgen_filter=(--filter "$FILTER")
fi

# Pass 1: every non-compile peer (copy, AdamW fused/foreach, eager, cuBLAS, Newton-Schulz,
# torch.optim.Muon).
timeout "${EAGER_TIMEOUT:-150}" python3 bench/torch_peers.py --no-compile "${quick[@]}" \
    "${torch_filter[@]}" --json "$OUT/peers_eager.json" >"$OUT/torch_eager.log" 2>&1
eager_rc=$?
# Pass 2: the torch.compile peers (copy_d2d_1GiB runs again: torch_peers always runs it).
compile_rc=skipped
if [ "${NO_COMPILE:-0}" != 1 ]; then
    filt=(--filter :compile)
    # With FILTER, keep pass 2 to the compile peers of the filtered workloads.
    [ -n "${FILTER:-}" ] && filt=(--filter "${FILTER}")
    timeout "${COMPILE_TIMEOUT:-210}" python3 bench/torch_peers.py "${quick[@]}" "${filt[@]}" \
        --json "$OUT/peers_compile.json" >"$OUT/torch_compile.log" 2>&1
    compile_rc=$?
fi
# The host cost of a launch from the peers (CUDA C++ if nvcc is here, Triton, torch,
# cupy): kgen bench prints them beside its own launch cost.
timeout 120 python3 bench/launch_peers.py --json "$OUT/launch_peers.json" \
    >"$OUT/launch_peers.log" 2>&1
# One peers file: pass 1's records, pass 2's compile records, the launch peers.
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
records = []
for name, keep in (("peers_eager.json", lambda r: True),
                   ("peers_compile.json", lambda r: r.get("peer") == "compile"),
                   ("launch_peers.json", lambda r: True)):
    path = os.path.join(out, name)
    try:
        with open(path, encoding="utf-8") as f:
            records += [r for r in json.load(f) if keep(r)]
    except (OSError, ValueError) as e:
        print(f"gpu-bench: {name}: {e}", file=sys.stderr)
with open(os.path.join(out, "peers.json"), "w", encoding="utf-8") as f:
    json.dump(records, f, indent=1)
print(f"gpu-bench: {len(records)} torch records in {out}/peers.json")
PY

# Same-size copy floors (the small workloads' floor in this harness; docs/PERFORMANCE.md).
timeout 60 python3 bench/copy_floor.py >"$OUT/copy_floor.log" 2>&1

# CUDA_CACHE_DISABLE=1: the driver's own PTX JIT cache (~/.nv/ComputeCache) would
# otherwise answer a "cold" first launch for PTX an earlier run already compiled.
CUDA_CACHE_DISABLE=1 timeout "${KGEN_TIMEOUT:-400}" "$BIN" bench "${quick[@]}" "${kgen_filter[@]}" \
    --peers "$OUT/peers.json" --json "$OUT/kgen.json" --csv "$OUT/kgen.csv" \
    >"$OUT/kgen.log" 2>"$OUT/kgen.err"
kgen_rc=$?

echo "== torch peers, pass 1 (eager/fused/foreach/cuBLAS): rc=$eager_rc =="
tail -n 45 "$OUT/torch_eager.log"
echo "== torch peers, pass 2 (torch.compile): rc=$compile_rc =="
[ -f "$OUT/torch_compile.log" ] && tail -n 20 "$OUT/torch_compile.log"
echo "== kgen bench progress / errors (tail) =="
tail -n 8 "$OUT/kgen.err"
echo "== same-size copy floors (bench/copy_floor.py) =="
cat "$OUT/copy_floor.log"
echo "== launch cost from the peers on this host (bench/launch_peers.py) =="
cat "$OUT/launch_peers.log"
echo "== kgen bench (full log $OUT/kgen.log): rc=$kgen_rc =="
cat "$OUT/kgen.log"
echo "gpu-bench: torch eager rc=$eager_rc, torch compile rc=$compile_rc, kgen rc=$kgen_rc," \
     "$(( $(date +%s) - start )) s; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
