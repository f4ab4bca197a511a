#!/usr/bin/env python3
"""Derives the two polynomial tables of kgen's GPU `erf` (ERF_SMALL, ERF_LARGE in
kgen-core/src/back/ptx/lower/arith.rs) and reports the worst error of the f32
evaluation against Python's double-precision `math.erf`.

    pip install numpy && python3 tools/erf_fit.py

The scheme (written for kgen from the math; no library code):
- |x| < 1:          erf(x) = x + x * P(x^2), P of degree 6 fitted to erf(x)/x - 1 in
                    relative error of erf;
- 1 <= |x| <= 4:    erf(|x|) = 1 - 2^Q(|x|), Q of degree 9 fitted to log2(erfc(a)) over
                    [1, 3.92] in absolute error (past 3.92, 1 - erfc rounds to 1 in f32;
                    |x| is clamped to 4), sign restored with copysign.
Both fits are minimax by iteratively reweighted least squares (Lawson's algorithm) on a
Chebyshev-clustered grid; coefficients are rounded to f32, and the evaluation is
emulated in f32 with fused multiply-adds (Horner), as the PTX computes it.
"""
import math

import numpy as np

SPLIT, HI, CLAMP = 1.0, 3.92, 4.0


def lawson(f, lo, hi, deg, var, weight, iters=40, n=4000):
    t = np.cos(np.linspace(np.pi, 0, n))
    xs = lo + (hi - lo) * (t + 1) / 2
    v = np.array([var(x) for x in xs])
    y = np.array([f(x) for x in xs])
    w = np.array([weight(x) for x in xs])
    vand = np.vander(v, deg + 1, increasing=True)
    lw = np.ones(n)
    for _ in range(iters):
        s = w * np.sqrt(lw)
        c, *_ = np.linalg.lstsq(vand * s[:, None], y * s, rcond=None)
        err = np.abs((vand @ c - y) * w)
        lw = lw * err
        lw /= lw.sum()
    return c


def fma32(a, b, c):
    # The product of two f32 values is exact in f64; one f64 add, then one rounding to
    # f32 (a double rounding only on exact ties, which do not occur here).
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def horner(cs, x):
    r = cs[-1]
    for c in reversed(cs[:-1]):
        r = fma32(r, x, c)
    return r


def erf32(x, small, large):
    x = np.float32(x)
    a = abs(x)
    if a < SPLIT:
        return fma32(x, horner(small, np.float32(x * x)), x)
    q = horner(large, min(a, np.float32(CLAMP)))
    r = np.float32(np.float32(1.0) - np.float32(2.0 ** np.float64(q)))
    return np.float32(math.copysign(r, x))


def main():
    small = lawson(
        lambda x: math.erf(x) / x - 1.0,
        1e-6, SPLIT, 6,
        lambda x: x * x,
        lambda x: x / math.erf(x),
    )
    large = lawson(lambda a: math.log2(math.erfc(a)), SPLIT, HI, 9, lambda a: a, lambda a: 1.0)
    small = [np.float32(c) for c in small]
    large = [np.float32(c) for c in large]
    print("ERF_SMALL =", [repr(float(c)) for c in small])
    print("           (f32:", ", ".join(str(c) for c in small), ")")
    print("ERF_LARGE =", [repr(float(c)) for c in large])
    print("           (f32:", ", ".join(str(c) for c in large), ")")
    worst, at = 0.0, 0.0
    for x in np.linspace(0, 5, 100001, dtype=np.float32):
        r = erf32(x, small, large)
        e = math.erf(float(x))
        ulp = float(np.spacing(np.float32(abs(e)))) if e != 0 else 2.0**-149
        u = abs(float(r) - e) / ulp
        if u > worst:
            worst, at = u, float(x)
    print(f"worst error with an exact exp2: {worst:.2f} ulp at x = {at}")


if __name__ == "__main__":
    main()
