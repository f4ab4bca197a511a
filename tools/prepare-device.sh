#!/usr/bin/env bash
# Builds what the GPU machine runs (it has no Rust) into .device/ (git-ignored):
#   .device/kgen                  the CLI (selftest, bench, run, compile)
#   .device/kgen-runtime-tests    kgen-runtime's unit-test binary (its `gpu_*` tests run
#                                 on a GPU and skip elsewhere)
# Then, on the device with `.device` carried: `bash tools/gpu-check.sh` and
# `bash tools/gpu-bench.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
mkdir -p .device
cargo build --release
cp "$target/release/kgen" .device/kgen
# The test binary's path is printed by cargo as "Executable ... (path)".
exe=$(cargo test --release -p kgen-runtime --lib --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "kgen_runtime":
        print(m["executable"])' | tail -n 1)
if [ -z "$exe" ]; then
  echo "prepare-device: could not find the kgen-runtime test binary" >&2
  exit 1
fi
cp "$exe" .device/kgen-runtime-tests
ls -la .device/kgen .device/kgen-runtime-tests
