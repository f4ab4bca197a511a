//! Interpreter tests, TF32 `dot`: the rounding (`round_tf32`, `split_tf32`) bit by bit,
//! and a GEMM with `input_precision = tf32` / `tf32x3` from source (checker, pipeline
//! pass, interpreter) against float64 on awkward sizes, random non-zero data and
//! poisoned outputs.
//!
//! The tolerances, with `S = |c| + Σ_k |a_ik·b_kj|` per output element:
//! - `tf32`: each operand is rounded to 11 significant bits (relative error at most
//!   2⁻¹¹), so each product is within about 2⁻¹⁰ of the exact one; the products of two
//!   TF32 values are exact in f32 and the K + 1 terms are summed in f32 (relative error
//!   of each partial sum at most 2⁻²⁴ per addition). Bound: `(2⁻¹⁰ + (K + 1)·2⁻²⁴)·S`.
//!   Against the float64 product of the *rounded* operands only the summation remains:
//!   `(K + 1)·2⁻²⁴·S`, which pins the rounding itself (a truncating or ties-to-even
//!   rounding leaves the bound on some element of these sizes).
//! - `tf32x3`: `x = hi + lo + r` with `|r| ≤ 2⁻²²·|x|`, and the dropped `a_lo·b_lo` is at
//!   most 2⁻²²·|a·b|: about 2⁻²⁰ of each product, plus the sums of 3K + 1 terms.

use super::tests::{poisoned, rnd, tensor, written};
use super::*;
use crate::pipeline::{compile_to_ir, CompileOptions};
use crate::span::SourceFile;
use crate::target::Arch;

#[test]
fn round_tf32_rounds_to_nearest_with_ties_away_from_zero() {
    let ulp = 2f32.powi(-10); // of [1, 2) in TF32
    let cases = [
        (1.0, 1.0),
        (1.0 + ulp / 2.0, 1.0 + ulp),       // a tie: away from zero
        (-(1.0 + ulp / 2.0), -(1.0 + ulp)), // also for negatives
        (1.0 + 3.0 * ulp / 2.0, 1.0 + 2.0 * ulp), // a tie from an odd significand
        (1.0 + ulp / 2.0 - 2f32.powi(-23), 1.0), // just below the tie
        (1.0 + ulp / 2.0 + 2f32.powi(-23), 1.0 + ulp),
        (2.0 - 2f32.powi(-23), 2.0), // carries into the exponent
        (f32::MAX, f32::INFINITY),   // and out of the range
        (f32::INFINITY, f32::INFINITY),
        (f32::NEG_INFINITY, f32::NEG_INFINITY),
        (0.0, 0.0),
        (f32::from_bits(0x0000_1000), f32::from_bits(0x0000_2000)), // a subnormal tie
    ];
    for (x, want) in cases {
        let got = round_tf32(x);
        assert_eq!(got.to_bits(), want.to_bits(), "round_tf32({x:e}) = {got:e}");
    }
    assert!(round_tf32(f32::NAN).is_nan());
    assert_eq!(round_tf32(-0.0).to_bits(), (-0.0f32).to_bits());
    // Idempotent, the low 13 bits clear, within half a TF32 ulp.
    for v in rnd(4000, 7, 1e3) {
        let x = v as f32;
        let r = round_tf32(x);
        assert_eq!(r.to_bits() & 0x1fff, 0, "{x:e}");
        assert_eq!(round_tf32(r).to_bits(), r.to_bits());
        assert!(((r - x) / x).abs() <= 2f32.powi(-11), "{x:e} -> {r:e}");
    }
}

#[test]
fn split_tf32_keeps_22_bits_of_the_value() {
    for v in rnd(4000, 8, 1e3) {
        let x = v as f32;
        let (hi, lo) = split_tf32(x);
        assert_eq!((hi.to_bits() & 0x1fff, lo.to_bits() & 0x1fff), (0, 0));
        let err = (x as f64 - hi as f64 - lo as f64).abs();
        assert!(
            err <= (x as f64).abs() * 2f64.powi(-22),
            "{x:e}: {hi:e} + {lo:e}"
        );
    }
    // Infinity gives a NaN low part, as `sub.rn.f32` of inf - inf does on the GPU.
    let (hi, lo) = split_tf32(f32::INFINITY);
    assert!(hi.is_infinite() && lo.is_nan());
}

const GEMM: &str = r#"
kernel gemm_tf32<BM: int = 64, BN: int = 32, BK: int = 16, X3: bool = false>(
    a: tensor<f32, 2, contiguous>, b: tensor<f32, 2, contiguous>,
    c: tensor<f32, 2, contiguous>, out: tensor<f32, 2, contiguous>,
) {
    let mut acc = load(c, [bid(0), bid(1)], [BM, BN]);
    for k in 0..cdiv(shape(a, 1), BK) {
        let ta = load(a, [bid(0), k], [BM, BK]);
        let tb = load(b, [k, bid(1)], [BK, BN]);
        if X3 {
            acc = dot(ta, tb, acc, input_precision = tf32x3);
        } else {
            acc = dot(ta, tb, acc, input_precision = tf32);
        }
    }
    store(out, [bid(0), bid(1)], acc);
}
"#;

/// Random values of magnitude 0.25 to 2 and either sign, rounded to f32 (so every
/// significand bit is in use, and none is zero).
fn data(n: usize, seed: u64) -> Vec<f64> {
    rnd(n, seed, 1.0)
        .into_iter()
        .map(|v| (v.signum() * (0.25 + 1.75 * v.abs())) as f32 as f64)
        .collect()
}

/// The worst error over the output, relative to each element's `S` (module docs), of
/// the interpreter's GEMM against float64 of `round(a) @ round(b) + c`.
fn gemm_errors(m: usize, n: usize, k: usize, x3: bool) -> (f64, f64) {
    let file = SourceFile::new("gemm_tf32.kg", GEMM);
    let opts = CompileOptions::new(Arch::Sm80).define("X3", x3);
    let (func, _) = compile_to_ir(&file, &opts).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let text = func.to_string();
    assert!(
        text.contains("scratch_fetch"),
        "the pipeline stages the tf32 dot"
    );
    let name = if x3 { "tf32x3" } else { "tf32" };
    assert!(text.contains(&format!("input_precision {name}")), "{text}");
    assert_eq!(text.contains("tf32x3"), x3, "{text}");
    let (xa, xb, xc) = (data(m * k, 1), data(k * n, 2), data(m * n, 3));
    let mut args = vec![
        tensor(DType::F32, &[m, k], &xa),
        tensor(DType::F32, &[k, n], &xb),
        tensor(DType::F32, &[m, n], &xc),
        poisoned(DType::F32, &[m, n]),
    ];
    let grid = [m.div_ceil(64) as u32, n.div_ceil(32) as u32, 1];
    run(&func, grid, &mut args).unwrap();
    let out = written(&args[3]);
    let round = |v: f64| {
        if x3 {
            v
        } else {
            round_tf32(v as f32) as f64
        }
    };
    let (mut worst_exact, mut worst_rounded) = (0f64, 0f64);
    for i in 0..m {
        for j in 0..n {
            let terms = (0..k).map(|l| (xa[i * k + l], xb[l * n + j]));
            let exact: f64 = xc[i * n + j] + terms.clone().map(|(p, q)| p * q).sum::<f64>();
            let rounded: f64 =
                xc[i * n + j] + terms.clone().map(|(p, q)| round(p) * round(q)).sum::<f64>();
            let s: f64 = xc[i * n + j].abs() + terms.map(|(p, q)| (p * q).abs()).sum::<f64>();
            let got = out[i * n + j];
            worst_exact = worst_exact.max((got - exact).abs() / s);
            worst_rounded = worst_rounded.max((got - rounded).abs() / s);
        }
    }
    (worst_exact, worst_rounded)
}

const SIZES: [(usize, usize, usize); 5] = [
    (1, 1, 1),
    (7, 127, 1000),
    (127, 1000, 7),
    (1000, 7, 127),
    (33, 65, 129),
];

#[test]
fn a_tf32_gemm_matches_float64_within_tf32_rounding() {
    let mut rounding_seen = false;
    for (m, n, k) in SIZES {
        let (exact, rounded) = gemm_errors(m, n, k, false);
        let sums = (k as f64 + 1.0) * 2f64.powi(-24);
        assert!(
            exact <= 2f64.powi(-10) + sums,
            "{m}x{n}x{k}: {exact:e} from the exact product"
        );
        assert!(
            rounded <= sums,
            "{m}x{n}x{k}: {rounded:e} from the product of the rounded operands"
        );
        // With K ≥ 7 some output is off the exact value by more than f32 sums explain:
        // the operands really were rounded.
        rounding_seen |= exact > 8.0 * sums;
    }
    assert!(rounding_seen, "no output shows TF32 rounding");
}

#[test]
fn a_tf32x3_gemm_is_about_as_accurate_as_f32() {
    for (m, n, k) in SIZES {
        let (exact, _) = gemm_errors(m, n, k, true);
        let bound = 2f64.powi(-20) + (3.0 * k as f64 + 1.0) * 2f64.powi(-24);
        assert!(exact <= bound, "{m}x{n}x{k}: {exact:e} (bound {bound:e})");
    }
}
