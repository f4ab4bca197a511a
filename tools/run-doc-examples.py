#!/usr/bin/env python3
"""Runs every docs/LANGUAGE.md example and tests/user_kernels/*.kg with a `// run:` line
through `kgen run`
(interpreter, and on a GPU machine the GPU too, compared with the interpreter).

usage: tools/run-doc-examples.py [KGEN_BINARY]   (default: target/release/kgen)
Exits non-zero if any example fails. Prints one line per example and a summary.
"""
import os, re, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
kgen = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "target/release/kgen")
doc = open(os.path.join(root, "docs/LANGUAGE.md")).read()
blocks = re.findall(r"^```kg\n(.*?)^```", doc, flags=re.S | re.M)
# Kernels written from LANGUAGE.md alone, as a new user would (tests/user_kernels/).
user_dir = os.path.join(root, "tests/user_kernels")
for f in sorted(os.listdir(user_dir)):
    if f.endswith(".kg"):
        blocks.append(open(os.path.join(user_dir, f)).read())
failed = 0
ran = 0
with tempfile.TemporaryDirectory() as tmp:
    for i, text in enumerate(blocks):
        m = re.search(r"^\s*// run:(.*)$", text, flags=re.M)
        if not m:
            continue
        name = re.search(r"kernel\s+(\w+)", text).group(1)
        path = os.path.join(tmp, f"{name}.kg")
        open(path, "w").write(text)
        cmd = [kgen, "run", path]
        for word in m.group(1).split():
            k, v = word.split("=", 1)
            if k in ("grid", "warps"):
                cmd += [f"--{k}", v]
            else:
                cmd += ["--arg", f"{k}={v}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        ran += 1
        ok = r.returncode == 0
        failed += not ok
        diff = [l.strip() for l in r.stdout.splitlines() if "GPU vs interpreter" in l]
        where = "gpu+interp" if diff else "interp"
        print(f"{'PASS' if ok else 'FAIL'}  {name:<16} {where:<10} {' | '.join(diff)[:150]}")
        if not ok:
            print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
print(f"doc examples: {ran - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
