#!/usr/bin/env bash
# Installs ptxas from the pinned PyPI wheel nvidia-cuda-nvcc==13.0.88 into .tools/cuda/bin,
# unless it is already there. Needs only python3 and pip. Prints the ptxas path.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.tools/cuda"
ptxas="$dest/bin/ptxas"
if [ -x "$ptxas" ] && "$ptxas" --version 2>/dev/null | grep -q 'V13.0.88'; then
  echo "$ptxas"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$tmp" nvidia-cuda-nvcc==13.0.88 >&2
python3 - "$tmp" "$dest" <<'PY'
import sys, zipfile, glob, os, stat
tmp, dest = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(tmp, "nvidia_cuda_nvcc-13.0.88-*.whl"))[0]
os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.endswith("/bin/ptxas"):
            out = os.path.join(dest, "bin", "ptxas")
            with z.open(name) as src, open(out, "wb") as dst:
                dst.write(src.read())
            os.chmod(out, os.stat(out).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PY
"$ptxas" --version >&2
echo "$ptxas"
