#!/usr/bin/env bash
# Runs on the GPU test machine (no Rust there): the GPU self-test, compute-sanitizer
# memcheck, racecheck and synccheck over it, the PTX JIT of every bundled kernel, and kgen's PTX
# launched by cupy from `kgen compile --emit abi` (tools/launch-with-cupy.py). Full logs
# go to $OUT; a short summary is printed last.
#
# Prepare on the development machine: `bash tools/prepare-device.sh` (or at least
#   cargo build --release && mkdir -p .device && cp target/release/kgen .device/)
# then run `bash tools/gpu-check.sh` on the device with `.device` carried. With
# .device/kgen-runtime-tests present it also runs kgen-runtime's `gpu_*` tests.
set -uo pipefail
BIN=${KGEN_BIN:-.device/kgen}
OUT=${OUT:-/tmp/kgen-gpu-check}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

# Each step has a time limit (seconds; a device command may run 10 minutes in all).
timeout "${SELFTEST_TIMEOUT:-260}" "$BIN" selftest --gpu --full ${SELFTEST_ARGS:-} >"$OUT/selftest.log" 2>&1
selftest_rc=$?
timeout "${MEMCHECK_TIMEOUT:-200}" compute-sanitizer --tool memcheck --error-exitcode 99 "$BIN" selftest --gpu >"$OUT/memcheck.log" 2>&1
memcheck_rc=$?
timeout "${RACECHECK_TIMEOUT:-170}" compute-sanitizer --tool racecheck --error-exitcode 99 "$BIN" selftest --gpu >"$OUT/racecheck.log" 2>&1
racecheck_rc=$?
# Shared memory is shared between threads (staged tensor-core tiles, conversions,
# reductions): barrier misuse too.
timeout "${SYNCCHECK_TIMEOUT:-170}" compute-sanitizer --tool synccheck --error-exitcode 99 "$BIN" selftest --gpu >"$OUT/synccheck.log" 2>&1
synccheck_rc=$?

# kgen's PTX launched by cupy from `kgen compile --emit abi` alone, and the same cases
# through `kgen run --input/--save-outputs` (GPU and interpreter), against numpy.
timeout "${CUPY_TIMEOUT:-90}" python3 tools/launch-with-cupy.py "$BIN" >"$OUT/cupy-abi.log" 2>&1
cupy_rc=$?
timeout "${NPY_TIMEOUT:-90}" python3 tools/launch-with-cupy.py "$BIN" --launcher kgen-run >"$OUT/kgen-run-npy.log" 2>&1
npy_rc=$?

# Every pipeline depth of a TMA-fed wgmma loop (and cp.async), GPU against the
# interpreter, each under a short limit: a wrong mbarrier phase shows as a hang (rc 124).
depths_rc=0
for cfg in "--stages 1" "--stages 2" "--stages 3" "--stages 4" "--stages 2 --no-tma" \
           "--stages 2 --warps 4" "--stages 2 --ws" "--stages 3 --ws"; do
  # shellcheck disable=SC2086
  if ! timeout 30 "$BIN" run kernels-src/gemm.kg --grid 9 --arg a=300x200 --arg b=200x260 \
      --arg bias=260 --arg c=300x260 --arg z=1x1 $cfg >"$OUT/depths.tmp" 2>&1 \
      || ! grep -q "outside tolerance: ok" "$OUT/depths.tmp"; then
    depths_rc=1
    echo "FAIL gemm.kg $cfg (rc ${PIPESTATUS[0]}): $(tail -n 2 "$OUT/depths.tmp")" >>"$OUT/depths.log"
  else
    echo "ok gemm.kg $cfg" >>"$OUT/depths.log"
  fi
done

runtime_rc=skipped
if [ -x .device/kgen-runtime-tests ]; then
  timeout "${RUNTIME_TESTS_TIMEOUT:-120}" .device/kgen-runtime-tests gpu_ --test-threads 1 >"$OUT/runtime-tests.log" 2>&1
  runtime_rc=$?
fi

echo "== selftest (full) =="
tail -n 60 "$OUT/selftest.log"
echo "== memcheck: rc=$memcheck_rc =="
grep -E "ERROR SUMMARY|PASS|FAIL" "$OUT/memcheck.log" | tail -n 5
echo "== racecheck: rc=$racecheck_rc =="
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|hazard" "$OUT/racecheck.log" | tail -n 5
echo "== synccheck: rc=$synccheck_rc =="
grep -E "ERROR SUMMARY" "$OUT/synccheck.log" | tail -n 5
echo "== cupy launches from --emit abi (tools/launch-with-cupy.py): rc=$cupy_rc =="
grep -E "^(GPU|FAIL|skip)|ABI launches|cannot" "$OUT/cupy-abi.log" | tail -n 20
echo "== kgen run --input/--save-outputs on the GPU (--launcher kgen-run): rc=$npy_rc =="
grep -E "^FAIL|ABI launches" "$OUT/kgen-run-npy.log" | tail -n 10
echo "== pipeline depths (gemm.kg, GPU vs interpreter): rc=$depths_rc =="
cat "$OUT/depths.log"
echo "== kgen-runtime gpu_ tests: rc=$runtime_rc =="
[ -f "$OUT/runtime-tests.log" ] && grep -E "^test |test result" "$OUT/runtime-tests.log" | tail -n 15
echo "(rc 124: the step ran past its time limit)"
echo "selftest_rc=$selftest_rc memcheck_rc=$memcheck_rc racecheck_rc=$racecheck_rc synccheck_rc=$synccheck_rc cupy_abi_rc=$cupy_rc kgen_run_npy_rc=$npy_rc depths_rc=$depths_rc runtime_tests_rc=$runtime_rc"
