#!/usr/bin/env bash
# The whole test suite; CI runs it through .ci/run. Needs Rust, python3 and pip (no GPU,
# no CUDA toolkit):
#   1. installs ptxas from the pinned wheel nvidia-cuda-nvcc==13.0.88 into .tools/cuda/bin
#      (tools/install-ptxas.sh) and exports KGEN_PTXAS for the tests that assemble PTX;
#   2. cargo test --workspace --release;
#   3. builds the release `kgen` and runs `kgen selftest` (every bundled kernel's cases on
#      the interpreter against the float64 references; on a GPU machine also on the GPU)
#      and `kgen` alone (the README's main job, the GPT on the interpreter; fails if the
#      validation loss does not go down);
#   4. runs tools/launch-with-cupy.py's cases through `kgen run --input/--save-outputs`
#      against numpy (installs numpy with pip if it is missing);
#   5. tests/no_spills.rs on its own, with its summary: every specialization the op
#      library can launch and every generic combination of every bundled kernel,
#      compiled for sm_80 and sm_90a and assembled by ptxas with no spills and no stack
#      (KGEN_FULL=1: every alignment class and every int tuple the ops use, ~4x longer);
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
# (tests/no_spills.rs runs below on its own, where its summary is shown.)
cargo test --workspace --release -- --skip every_launchable_specialization_assembles_without_spills

step "cargo build --release"
cargo build --release
kgen="${CARGO_TARGET_DIR:-target}/release/kgen"

step "kgen selftest"
"$kgen" selftest

step "kgen (the README's main job: the GPT, here on the interpreter)"
"$kgen"

step "the --emit abi launcher's cases through kgen run --input/--save-outputs (.npy), against numpy"
# (tools/launch-with-cupy.py: with cupy on a GPU machine; here its kgen-run form, which
# checks the script's references, the .npy round trip and the rounding of inputs.)
python3 -c 'import numpy' 2>/dev/null || python3 -m pip install --quiet numpy
python3 tools/launch-with-cupy.py "$kgen" --launcher kgen-run

step "no spills: every launchable specialization, sm_80 and sm_90a, assembled by ptxas"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! cargo test --release --test no_spills -- --nocapture >"$log" 2>&1; then
  tail -n 200 "$log" >&2
  echo "error: tests/no_spills.rs failed" >&2
  exit 1
fi
grep -E "specializations \(" "$log"

step "a fresh crate using #[kgen::kernel] (the README example)"
bash tools/check-fresh-crate.sh "$KGEN_PTXAS"

step "all tests passed"
