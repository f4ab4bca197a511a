#!/usr/bin/env python3
"""Launches kgen's PTX without kgen's runtime, from `kgen compile --emit abi` alone.

For each case below: `kgen compile --emit ptx` and `--emit abi` (with the `--align` the
arguments allow, computed by the rule of docs/ARCHITECTURE.md, "The launch ABI"), then
cupy: RawModule(path=PTX).get_function(entry), the dynamic shared memory attribute when
the JSON asks for it, the parameters packed from the JSON's `params` alone, the block
from `launch.block`; on random data of awkward sizes, outputs poisoned first, compared
with a numpy float64 reference.

usage: tools/launch-with-cupy.py [KGEN] [--launcher cupy|kgen-run] [--filter TEXT]
  KGEN        the kgen binary (default: .device/kgen, else target/release/kgen)
  --launcher  cupy (default; needs a GPU and cupy) or kgen-run: the same cases through
              `kgen run --input ... --save-outputs` (.npy in and out; the GPU and the
              interpreter on a GPU machine, the interpreter alone elsewhere).
Prints one line per case and `<launcher> ABI launches: N passed, M failed`; exits 1 if
any failed, 2 if it cannot run at all.
"""
import json, os, struct, subprocess, sys, tempfile
from fractions import Fraction

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- bf16 on the host (numpy has no bfloat16) ---------------------------------------

def f64_to_bf16_bits(v):
    """The bf16 nearest to the float v (ties to even), as its 16 bits: exact rational
    arithmetic, one rounding (what kgen's host side does)."""
    if v != v:
        return 0x7FC0
    sign = 0x8000 if (v < 0 or (v == 0 and struct.pack(">d", v)[0] & 0x80)) else 0
    a = Fraction(abs(v))
    if a == 0:
        return sign
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    q = Fraction(2) ** (max(e, -126) - 7)  # the weight of the last significand bit
    r = round(a / q)  # Fraction rounding: half to even
    val = r * q
    if val >= Fraction(2) ** 128:
        return sign | 0x7F80
    bits32 = struct.unpack("<I", struct.pack("<f", float(val)))[0]  # exact in f32
    return sign | (bits32 >> 16)


def bf16_bits_array(x):
    """float64 array -> bf16 bits (uint16), each rounded once to nearest even."""
    return np.array([f64_to_bf16_bits(float(v)) for v in x.ravel()], dtype=np.uint16).reshape(x.shape)


def bf16_to_f64(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

# ---- the cases ------------------------------------------------------------------------
# Each case: kgen source; `inputs(rng, size)` -> dict of float64/int/bool numpy arrays
# (tensors, row-major) and python scalars; `grid(size)`; `reference(ins)` -> dict of
# expected outputs; `outputs`: output name -> shape; `strided`: tensors given to cupy
# as padded (non-contiguous) views.


def cdiv(a, b):
    return -(-a // b)


CASES = [
    dict(
        name="affine",
        src="""kernel affine<B: int = 256>(x: tensor<f32, 2>, a: f32, y: tensor<f32, 2, contiguous>) {
    store(y, [bid(0), bid(1)], load(x, [bid(0), bid(1)], [1, B]) * a + 1.0);
}
""",
        sizes=[(1, 1), (7, 1001), (3, 4097), (2, 1024)],
        inputs=lambda rng, s: dict(x=rng.uniform(-2, 2, s).astype(np.float32).astype(np.float64), a=-0.75),
        dtypes=dict(x="f32", a="f32", y="f32"),
        outputs=lambda s: dict(y=s),
        grid=lambda s: (s[0], cdiv(s[1], 256), 1),
        reference=lambda i: dict(y=i["x"] * i["a"] + 1.0),
        strided=["x"],
        tol=1e-6,
    ),
    dict(
        name="mixed_scalars",
        src="""kernel mixed<T: float = bf16>(a: T, flag: bool, n: i64, u: u32,
        x: tensor<T, [_, 64], contiguous>, y: tensor<f32, [_, 64], contiguous>) {
    let t = load(x, [bid(0), 0], [1, 64]) as f32;
    let s = where(flag, a as f32, 0.0) + (n as f32) + (u as f32);
    store(y, [bid(0), 0], t * s);
}
""",
        sizes=[(1, 64), (5, 64), (127, 64)],
        # 1 + 2^-8 + 2^-40 is 1 + 2^-7 in bf16 (one rounding to nearest even).
        inputs=lambda rng, s: dict(x=rng.uniform(-2, 2, s), a=1.0 + 2.0**-8 + 2.0**-40, flag=True, n=-3, u=5),
        dtypes=dict(x="bf16", y="f32", a="bf16", flag="bool", n="i64", u="u32"),
        outputs=lambda s: dict(y=s),
        grid=lambda s: (s[0], 1, 1),
        reference=lambda i: dict(
            y=bf16_to_f64(bf16_bits_array(i["x"]))
            * (bf16_to_f64(np.array([f64_to_bf16_bits(i["a"])], np.uint16))[0] + i["n"] + i["u"])
        ),
        strided=[],
        tol=1e-6,
    ),
    dict(
        name="dynamic_smem",
        src="""kernel big_smem(x: tensor<f32, 2, contiguous>, y: tensor<f32, 2, contiguous>) {
    let buf = scratch(16, [1, 1024], f32);
    scratch_store(buf, 3, load(x, [bid(0), 0], [1, 1024]));
    store(y, [bid(0), 0], scratch_load(buf, 3) * 2.0);
}
""",
        sizes=[(1, 1), (3, 777), (4, 1024)],
        inputs=lambda rng, s: dict(x=rng.uniform(-2, 2, s).astype(np.float32).astype(np.float64)),
        dtypes=dict(x="f32", y="f32"),
        outputs=lambda s: dict(y=s),
        grid=lambda s: (s[0], 1, 1),
        reference=lambda i: dict(y=i["x"] * 2.0),
        strided=[],
        tol=0.0,
        expect_dynamic=True,
    ),
    dict(
        name="f16_i32_bool_outputs",
        src="""kernel outs(h: f16, x: tensor<f16, 1, contiguous>, y: tensor<f16, 1, contiguous>,
        n: tensor<i32, 1, contiguous>, m: tensor<bool, 1, contiguous>) {
    let t = load(x, [bid(0)], [128]);
    store(y, [bid(0)], t * h);
    store(n, [bid(0)], arange(0, 128) + bid(0) * 128 - 100);
    store(m, [bid(0)], t > 0.0);
}
""",
        sizes=[(1,), (129,), (1000,)],
        inputs=lambda rng, s: dict(x=rng.uniform(-2, 2, s).astype(np.float16).astype(np.float64), h=0.3),
        dtypes=dict(x="f16", y="f16", n="i32", m="bool", h="f16"),
        outputs=lambda s: dict(y=s, n=s, m=s),
        grid=lambda s: (cdiv(s[0], 128), 1, 1),
        reference=lambda i: dict(
            y=(i["x"] * float(np.float16(i["h"]))).astype(np.float32).astype(np.float16).astype(np.float64),
            n=np.arange(i["x"].shape[0]) - 100,
            m=i["x"] > 0,
        ),
        strided=[],
        tol=0.0,
    ),
    dict(
        name="gdc_wait",
        src="""kernel gdc(x: tensor<f32, 1, contiguous>, y: tensor<f32, 1, contiguous>) {
    gdc_wait();
    store(y, [bid(0)], load(x, [bid(0)], [128]) + 1.0);
}
""",
        sizes=[(7,), (1000,)],
        inputs=lambda rng, s: dict(x=rng.uniform(-2, 2, s).astype(np.float32).astype(np.float64)),
        dtypes=dict(x="f32", y="f32"),
        outputs=lambda s: dict(y=s),
        grid=lambda s: (cdiv(s[0], 128), 1, 1),
        reference=lambda i: dict(y=(i["x"].astype(np.float32) + np.float32(1.0)).astype(np.float64)),
        strided=[],
        tol=0.0,
    ),
    dict(
        name="cluster_row_sum",
        arch_only="sm_90a",
        src="""// target: sm_90a
kernel row_sum(x: tensor<f32, 2>, y: tensor<f32, 1>) {
    let row = bid(0) / 4;
    let part = bid(0) % 4;
    let t = load(x, [row, part], [1, 256]);
    let all = cluster_gather(sum(t.reshape([256]), 0), 4);
    if part == 0 {
        store(y, [row], full([1], sum(all, 0)));
    }
}
""",
        sizes=[(1, 1000), (3, 17)],
        inputs=lambda rng, s: dict(x=rng.uniform(-2, 2, s).astype(np.float32).astype(np.float64)),
        dtypes=dict(x="f32", y="f32"),
        outputs=lambda s: dict(y=(s[0],)),
        grid=lambda s: (4 * s[0], 1, 1),
        reference=lambda i: dict(y=i["x"].sum(axis=1)),
        strided=["x"],
        tol=1e-4,
    ),
]

NP_OF = dict(f32=np.float32, f16=np.float16, i32=np.int32, i64=np.int64, u32=np.uint32, bool=np.bool_)


def kgen_cmd(kgen, args):
    r = subprocess.run([kgen] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"kgen {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def natural_align(shape, strides_bytes, base, elem, contiguous):
    """The largest alignment (≤ 16) the view satisfies, by the documented rule."""
    def p2(b):
        return 16 if b == 0 else min(16, b & -b)
    a = p2(base)
    for d in range(len(shape) - 1):
        if shape[d] > 1:
            a = min(a, p2(strides_bytes[d]))
    if contiguous:
        a = min(a, p2(shape[-1] * elem))
    return a


def check(name, got, want, tol):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return f"{name}: shape {got.shape}, want {want.shape}"
    if np.isnan(got).any() and not np.isnan(want).any():
        return f"{name}: {int(np.isnan(got).sum())} NaN (unwritten?)"
    err = np.abs(got - want)
    bad = err > tol * np.maximum(np.abs(want), 1.0)
    if bad.any():
        k = int(np.argmax(bad))
        return f"{name}: {int(bad.sum())} of {bad.size} differ, first at {k}: {got.ravel()[k]} vs {want.ravel()[k]}"
    return None


# ---- the cupy launcher ---------------------------------------------------------------

def run_cupy(kgen, case, size, arch, rng, tmp):
    import cupy as cp

    ins = case["inputs"](rng, size)
    outs_shape = case["outputs"](size)
    # Device arrays first (their alignment decides --align).
    dev = {}
    keep = []
    for t, dt in case["dtypes"].items():
        if t in ins and isinstance(ins[t], np.ndarray):
            host = ins[t]
        elif t in outs_shape:
            host = None
        else:
            continue
        shape = host.shape if host is not None else outs_shape[t]
        if dt == "bf16":
            npdt = np.uint16
        else:
            npdt = NP_OF[dt]
        if t in case["strided"] and len(shape) >= 1:
            padded = shape[:-1] + (shape[-1] * 2 + 3,)
            base = cp.zeros(padded, dtype=npdt)
            arr = base[..., ::2][..., : shape[-1]] if len(shape) >= 1 else base
            keep.append(base)
        else:
            arr = cp.zeros(shape, dtype=npdt)
        if host is not None:
            vals = bf16_bits_array(host) if dt == "bf16" else host.astype(npdt)
            arr[...] = cp.asarray(vals)
        else:
            poison = np.full(shape, np.nan) if dt in ("f32", "f16") else None
            if dt == "bf16":
                arr[...] = 0x7FC0
            elif poison is not None:
                arr[...] = cp.asarray(poison.astype(npdt))
            elif dt == "bool":
                arr[...] = True
            else:
                arr[...] = cp.asarray(np.full(shape, 0x5A5A5A5A % np.iinfo(npdt).max, dtype=npdt))
        dev[t] = arr
    src = os.path.join(tmp, case["name"] + ".kg")
    open(src, "w").write(case["src"])
    # --align for each contiguous tensor from its actual view (the documented rule);
    # the JSON says which tensors are contiguous, so ask it once without --align.
    abi0 = json.loads(kgen_cmd(kgen, ["compile", src, "--arch", arch, "--emit", "abi"]))
    aligns = []
    for t in abi0["tensors"]:
        a = dev[t["name"]]
        al = natural_align(a.shape, a.strides, a.data.ptr, a.itemsize, t["contiguous"])
        if t["contiguous"] and al < 16:
            aligns += ["--align", f"{t['name']}={al}"]
    base_args = ["compile", src, "--arch", arch] + aligns
    # One file per entry: cupy caches a module by its path, so a second specialization
    # written to the same path would load the first one ('named symbol not found').
    tag = "_".join([case["name"]] + [str(x) for x in size] + [a.replace("=", "") for a in aligns[1::2]])
    ptx_path = os.path.join(tmp, tag + ".ptx")
    kgen_cmd(kgen, base_args + ["--emit", "ptx", "-o", ptx_path])
    abi = json.loads(kgen_cmd(kgen, base_args + ["--emit", "abi"]))
    assert abi["schema"] == "kgen-abi" and abi["version"] == 1, abi["schema"]
    launch = abi["launch"]
    if case.get("expect_dynamic") and not launch["needs_max_dynamic_shared_attribute"]:
        return "expected dynamic shared memory in the ABI"
    kern = cp.RawModule(path=ptx_path).get_function(abi["entry"])
    if launch["dynamic_shared_bytes"]:
        kern.max_dynamic_shared_size_bytes = launch["dynamic_shared_bytes"]
    if launch["needs_non_portable_cluster_attribute"]:
        cp.cuda.driver.funcSetAttribute(kern.kernel.ptr, 14, 1)
    # Check the documented alignment contract before launching.
    for t in abi["tensors"]:
        a = dev[t["name"]]
        if natural_align(a.shape, a.strides, a.data.ptr, a.itemsize, t["contiguous"]) < t["align_bytes"]:
            return f"tensor {t['name']} does not meet align_bytes {t['align_bytes']}"
        for d, c in enumerate(t["dims"]):
            if c is not None and a.shape[d] != c:
                return f"tensor {t['name']}: dimension {d} must be {c}"
    args = []
    for p in abi["params"]:
        kind = p["kind"]
        if kind == "tensor_ptr":
            args.append(np.uint64(dev[p["source"]].data.ptr))
        elif kind == "tensor_dim":
            args.append(np.int32(dev[p["source"]].shape[p["dim"]]))
        elif kind == "tensor_stride":
            a = dev[p["source"]]
            args.append(np.int32(a.strides[p["dim"]] // a.itemsize))
        else:
            v = ins[p["source"]]
            dt = p["dtype"]
            if dt == "bf16":
                args.append(np.uint16(f64_to_bf16_bits(float(v))))
            elif dt == "f16":
                args.append(np.float16(v).view(np.uint16))  # numpy rounds f64 -> f16 once
            elif dt == "bool":
                args.append(np.uint32(1 if v else 0))
            else:
                args.append(NP_OF[dt](v))
        if np.asarray(args[-1]).itemsize != p["size"]:
            return f"param {p['name']}: {p['size']} bytes in the ABI, {np.asarray(args[-1]).itemsize} packed"
    grid = case["grid"](size)
    if grid[0] % launch["cluster_size"]:
        return f"grid {grid} not a multiple of the cluster size {launch['cluster_size']}"
    kern(grid, tuple(launch["block"]), tuple(args), shared_mem=launch["dynamic_shared_bytes"])
    cp.cuda.runtime.deviceSynchronize()
    want = case["reference"](ins)
    for name, w in want.items():
        dt = case["dtypes"][name]
        got = cp.asnumpy(dev[name])
        got = bf16_to_f64(got) if dt == "bf16" else got.astype(np.float64)
        tol = case["tol"] if dt in ("f32", "bf16", "f16") else 0.0
        e = check(name, got, w, tol)
        if e:
            return e
    return None


# ---- the kgen-run launcher (.npy in and out) ------------------------------------------

def run_kgen_run(kgen, case, size, arch, rng, tmp):
    ins = case["inputs"](rng, size)
    outs_shape = case["outputs"](size)
    src = os.path.join(tmp, case["name"] + ".kg")
    open(src, "w").write(case["src"])
    out_dir = os.path.join(tmp, f"out_{case['name']}_{'x'.join(map(str, size))}")
    cmd = ["run", src, "--grid", ",".join(map(str, case["grid"](size))), "--save-outputs", out_dir]
    for t, dt in case["dtypes"].items():
        if t in ins and isinstance(ins[t], np.ndarray):
            p = os.path.join(tmp, f"{t}.npy")
            # bf16 goes as float64: kgen rounds it once to nearest even on the way in.
            arr = ins[t] if dt == "bf16" else ins[t].astype(NP_OF[dt])
            np.save(p, arr)
            cmd += ["--input", f"{t}={p}"]
        elif t in ins:
            v = ins[t]
            cmd += ["--arg", f"{t}={'true' if v is True else 'false' if v is False else repr(v)}"]
        else:
            cmd += ["--arg", f"{t}={'x'.join(map(str, outs_shape[t]))}"]
    r = subprocess.run([kgen] + cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return f"kgen run failed: {r.stderr.strip()[-800:]}"
    want = case["reference"](ins)
    for name, w in want.items():
        got = np.load(os.path.join(out_dir, f"{name}.npy")).astype(np.float64)
        dt = case["dtypes"][name]
        tol = case["tol"] if dt in ("f32", "bf16", "f16") else 0.0
        e = check(name, got, w, tol)
        if e:
            return e
    return None


def main():
    args = sys.argv[1:]
    launcher = "cupy"
    filt = None
    kgen = None
    while args:
        a = args.pop(0)
        if a == "--launcher":
            launcher = args.pop(0)
        elif a == "--filter":
            filt = args.pop(0)
        else:
            kgen = a
    if kgen is None:
        kgen = next(
            (p for p in (os.path.join(ROOT, ".device/kgen"), os.path.join(ROOT, "target/release/kgen")) if os.path.exists(p)),
            None,
        )
    if kgen is None or not os.path.exists(kgen):
        print(f"launch-with-cupy: no kgen binary ({kgen}); build it or pass its path", file=sys.stderr)
        return 2
    if launcher not in ("cupy", "kgen-run"):
        print(f"launch-with-cupy: unknown launcher {launcher}", file=sys.stderr)
        return 2
    if launcher == "cupy":
        try:
            import cupy as cp
            cc = cp.cuda.Device().compute_capability
        except Exception as e:  # no cupy, no GPU, no driver
            print(f"launch-with-cupy: cupy cannot run here ({e}); try --launcher kgen-run", file=sys.stderr)
            return 2
        arch = "sm_90a" if cc == "90" else "sm_80" if cc.startswith("8") else None
        if arch is None:
            print(f"launch-with-cupy: compute capability {cc} is not a kgen target", file=sys.stderr)
            return 2
        gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        print(f"GPU {gpu}, compute capability {cc}: PTX for {arch}")
        run = run_cupy
    else:
        # kgen run picks the GPU's arch itself, sm_90a on the interpreter.
        arch = "sm_90a"
        run = run_kgen_run
    rng = np.random.default_rng(21)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            if filt and filt not in case["name"]:
                continue
            if case.get("arch_only") and launcher == "cupy" and case["arch_only"] != arch:
                print(f"skip  {case['name']:<22} ({case['arch_only']} only)")
                continue
            for size in case["sizes"]:
                try:
                    err = run(kgen, case, size, arch, rng, tmp)
                except Exception as e:
                    err = f"{type(e).__name__}: {e}"
                label = f"{case['name']} {list(size)}"
                if err:
                    failed += 1
                    print(f"FAIL  {label:<30} {err}")
                else:
                    passed += 1
                    print(f"ok    {label}")
    print(f"{launcher} ABI launches: {passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
