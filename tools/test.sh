#!/usr/bin/env bash
# The whole test suite; CI runs it through .ci/run. Needs Rust, python3 and pip (no GPU,
# no CUDA toolkit):
#   1. installs ptxas from the pinned wheel nvidia-cuda-nvcc==13.0.88 into .tools/cuda/bin
#      (tools/install-ptxas.sh) and exports KGEN_PTXAS for the tests that assemble PTX;
#   2. cargo test --workspace --release;
#   3. builds the release `kgen` and runs `kgen selftest` (every bundled kernel's cases on
#      the interpreter against the float64 references; on a GPU machine also on the GPU)
#      and `kgen` alone (the README's main job, the training demo; fails if the loss does
#      not go down);
#   4. runs tools/launch-with-cupy.py's cases through `kgen run --input/--save-outputs`
#      against numpy (installs numpy with pip if it is missing);
#   5. compiles every kernel of every kernels-src/*.kg for sm_80 and sm_90a with
#      `kgen compile` and pipes it into ptxas as a smoke test;
#   6. builds the README's `#[kgen::kernel]` example in a fresh `cargo new` crate, runs it
#      (PTX for sm_90a, a launch on the interpreter) and its insta snapshot test.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
start=$SECONDS
step() { printf '\n== %s (%ds)\n' "$*" "$((SECONDS - start))"; }

step "ptxas"
KGEN_PTXAS="$(bash tools/install-ptxas.sh)"
export KGEN_PTXAS
"$KGEN_PTXAS" --version | tail -n 1

step "cargo test --workspace --release"
cargo test --workspace --release

step "cargo build --release"
cargo build --release
kgen="${CARGO_TARGET_DIR:-target}/release/kgen"

step "kgen selftest"
"$kgen" selftest

step "kgen (the README's main job: the training demo, here on the interpreter)"
"$kgen"

step "the --emit abi launcher's cases through kgen run --input/--save-outputs (.npy), against numpy"
# (tools/launch-with-cupy.py: with cupy on a GPU machine; here its kgen-run form, which
# checks the script's references, the .npy round trip and the rounding of inputs.)
python3 -c 'import numpy' 2>/dev/null || python3 -m pip install --quiet numpy
python3 tools/launch-with-cupy.py "$kgen" --launcher kgen-run

step "kgen compile | ptxas, every bundled kernel, sm_80 and sm_90a"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
n=0
for f in kernels-src/*.kg; do
  # Every `kernel NAME` at the start of a line (a file may hold several kernels).
  kernels=$(sed -nE 's/^[[:space:]]*kernel[[:space:]]+([A-Za-z_][A-Za-z0-9_]*).*/\1/p' "$f")
  if [ -z "$kernels" ]; then
    echo "error: no kernel found in $f" >&2
    exit 1
  fi
  # `// target: sm_90a` at the top: a Hopper-only file (sm_80 must refuse it).
  archs="sm_80 sm_90a"
  if grep -qE '^// target: sm_90a' "$f"; then
    archs="sm_90a"
    for k in $kernels; do
      if "$kgen" compile "$f" --kernel "$k" --arch sm_80 >/dev/null 2>"$log"; then
        echo "FAIL $f $k sm_80: compiled, but the file is for sm_90a only" >&2
        exit 1
      fi
      grep -q "E0802" "$log" || { echo "FAIL $f $k sm_80: not an Unsupported error" >&2; cat "$log" >&2; exit 1; }
    done
  fi
  for k in $kernels; do
    for arch in $archs; do
      if ! "$kgen" compile "$f" --kernel "$k" --arch "$arch" \
           | "$KGEN_PTXAS" -arch="$arch" -v /dev/stdin -o /dev/null >"$log" 2>&1; then
        echo "FAIL $f $k $arch" >&2
        cat "$log" >&2
        exit 1
      fi
      regs=$(grep -oE 'Used [0-9]+ registers' "$log" | head -n 1 | grep -oE '[0-9]+' || echo "?")
      spills=$(grep -oE '[0-9]+ bytes spill stores' "$log" | head -n 1 | grep -oE '^[0-9]+' || echo "?")
      printf 'ok   %-24s %-20s %-7s %4s registers, %s bytes spilled\n' "$f" "$k" "$arch" "$regs" "$spills"
      n=$((n + 1))
    done
  done
done
echo "$n PTX files assembled"

step "the norm backward's bounded launch configurations assemble without spills"
# (rmsnorm_bwd: ONE_TILE=true is what the op launches for rows of at most BLOCK, false is
# the general kernel; layernorm_bwd has no ONE_TILE: its one-tile-only form spilled.)
for k in rmsnorm_bwd layernorm_bwd; do
  ones="false true"
  [ "$k" = layernorm_bwd ] && ones="false"
  for arch in sm_80 sm_90a; do
    for one in $ones; do
      define=()
      [ "$k" = rmsnorm_bwd ] && define=(-D "ONE_TILE=$one")
      "$kgen" compile "kernels-src/$k.kg" --arch "$arch" -D BLOCK=4096 "${define[@]}" --warps 16 \
        --min-blocks-per-sm 2 \
        | "$KGEN_PTXAS" -arch="$arch" -v /dev/stdin -o /dev/null >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
      spills=$(grep -oE '[0-9]+ bytes spill stores' "$log" | head -n 1 | grep -oE '^[0-9]+' || echo "?")
      regs=$(grep -oE 'Used [0-9]+ registers' "$log" | head -n 1 | grep -oE '[0-9]+' || echo "?")
      printf '%-14s %-7s BLOCK=4096 ONE_TILE=%-5s warps=16 min-blocks-per-sm=2: %s registers, %s bytes spilled\n' \
        "$k" "$arch" "$one" "$regs" "$spills"
      if [ "$spills" != "0" ]; then
        echo "error: $k (ONE_TILE=$one) spills with --min-blocks-per-sm 2" >&2
        exit 1
      fi
    done
  done
done

step "a fresh crate using #[kgen::kernel] (the README example)"
bash tools/check-fresh-crate.sh "$KGEN_PTXAS"

step "all tests passed"
