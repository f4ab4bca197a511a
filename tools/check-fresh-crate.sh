#!/usr/bin/env bash
# Tries the README's `#[kernel]` example the way a new user would (issue 4, acceptance 1):
# `cargo new` a crate in a temporary directory, depend on kgen by path, paste the README's
# example (the ```rust block after the `fresh-crate:main.rs` marker) as src/main.rs, then
#   1. `cargo run --release` must print PTX for sm_90a (no GPU and no CUDA toolkit needed;
#      with no GPU the example's launch runs on the interpreter), and ptxas must assemble it;
#   2. the example's `insta::assert_snapshot!` test must create its snapshot on the first
#      run (INSTA_UPDATE=always) and pass against it on the second (INSTA_UPDATE=no).
# Usage: tools/check-fresh-crate.sh [PTXAS]   (CARGO_TARGET_DIR is shared with the workspace)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ptxas="${1:-${KGEN_PTXAS:-$root/.tools/cuda/bin/ptxas}}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"

cd "$work"
cargo new -q --vcs none kgen-user
cd kgen-user
cat >>Cargo.toml <<TOML
kgen = { path = "$root" }

[dev-dependencies]
insta = "1"
TOML
# The example: the first ```rust block after the marker line in README.md.
awk '/fresh-crate:main.rs/ {found=1; next}
     found && /^```rust/ {inblock=1; next}
     inblock && /^```/ {exit}
     inblock {print}' "$root/README.md" >src/main.rs
if [ ! -s src/main.rs ]; then
  echo "error: README.md has no \`fresh-crate:main.rs\` example" >&2
  exit 1
fi

cargo run -q --release >out.txt 2>err.txt || { cat out.txt err.txt >&2; exit 1; }
cat err.txt >&2
grep -q '^\.target sm_90a' out.txt || { echo "error: no sm_90a PTX printed" >&2; cat out.txt >&2; exit 1; }
# The PTX is everything from the `//` header up to the end of the entry.
sed -n '/^\/\/$/,/^}$/p' out.txt >k.ptx
"$ptxas" -arch=sm_90a k.ptx -o /dev/null
echo "fresh crate: PTX for sm_90a printed and assembled ($(wc -l <k.ptx) lines)"
grep -v '^\(//\|\.\|	\|{\|}\|$\)' out.txt | sed 's/^/fresh crate output: /' | head -n 20 || true

INSTA_UPDATE=always cargo test -q --release >/dev/null 2>&1 || true
ls src/snapshots/*.snap >/dev/null
INSTA_UPDATE=no cargo test -q --release 2>&1 | tail -n 3
echo "fresh crate: insta snapshot of the PTX written and matched"
