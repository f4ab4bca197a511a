//! The GPU's `erf`: its polynomials, evaluated in f32 exactly as the PTX does (Horner
//! with fused multiply-adds, one `ex2`), against the exact `erf` of the `libm` crate;
//! and the PTX of a kernel that uses it, assembled for both targets.

use super::lower::arith::{ERF_CLAMP, ERF_LARGE, ERF_SMALL, ERF_SPLIT};
use super::tests::assemble;
use crate::{compile, Arch, CompileOptions, SourceFile};

fn horner(c: &[f32], x: f32) -> f32 {
    let (top, rest) = c.split_last().expect("coefficients");
    rest.iter().rev().fold(*top, |acc, &k| acc.mul_add(x, k))
}

/// The lowering of `UnaryOp::Erf` (`arith.rs`), in f32; `ex2` is exact here, scaled by
/// `ex2_error` (1 + the relative error the hardware's `ex2.approx` may add).
fn gpu_erf(x: f32, ex2_error: f64) -> f32 {
    let a = x.abs();
    // setp.ltu: "less than, or unordered", true for NaN too.
    let small = a < ERF_SPLIT || a.is_nan();
    let near = x.mul_add(horner(&ERF_SMALL, x * x), x);
    let q = horner(&ERF_LARGE, a.min(ERF_CLAMP));
    let erfc = ((q as f64).exp2() * ex2_error) as f32;
    let far = (1.0 - erfc).copysign(x);
    if small {
        near
    } else {
        far
    }
}

/// |got - want| in units of the f32 spacing at `want`.
fn ulps(got: f32, want: f64) -> f64 {
    let w = want as f32;
    let spacing = if w == 0.0 {
        f32::from_bits(1) as f64
    } else {
        let b = w.abs().to_bits();
        (f32::from_bits(b + 1) - f32::from_bits(b)) as f64
    };
    (got as f64 - want).abs() / spacing
}

fn worst(ex2_error: f64) -> (f64, f32) {
    let mut worst = (0.0, 0.0);
    let mut check = |x: f32| {
        let e = ulps(gpu_erf(x, ex2_error), libm::erf(x as f64));
        if e > worst.0 {
            worst = (e, x);
        }
    };
    // Every 2^-14 over [-6, 6] (all the interesting range, both signs), then tiny and
    // subnormal arguments.
    for i in -(6 << 14)..=(6 << 14) {
        check(i as f32 / 16384.0);
    }
    let mut x = f32::from_bits(1) as f64;
    while x < 1e-3 {
        check(x as f32);
        check(-x as f32);
        x *= 1.37;
    }
    worst
}

#[test]
fn the_gpu_erf_is_within_two_ulp_of_the_exact_one() {
    let (exact, at) = worst(1.0);
    assert!(exact <= 1.5, "{exact} ulp at {at} with an exact ex2");
    // ex2.approx.ftz.f32: maximum relative error 2^-22 (PTX ISA) on either side.
    for err in [1.0 + 2f64.powi(-22), 1.0 - 2f64.powi(-22)] {
        let (e, at) = worst(err);
        assert!(e <= 2.0, "{e} ulp at {at} with ex2 off by {err}");
    }
}

#[test]
fn the_gpu_erf_keeps_signs_infinities_and_nan() {
    assert_eq!(gpu_erf(0.0, 1.0).to_bits(), 0.0f32.to_bits());
    assert_eq!(gpu_erf(-0.0, 1.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(gpu_erf(f32::INFINITY, 1.0), 1.0);
    assert_eq!(gpu_erf(f32::NEG_INFINITY, 1.0), -1.0);
    assert_eq!(gpu_erf(100.0, 1.0), 1.0);
    assert!(gpu_erf(f32::NAN, 1.0).is_nan());
    // Odd: erf(-x) = -erf(x) bit for bit.
    for i in 1..4000 {
        let x = i as f32 * 1.37e-3;
        assert_eq!(gpu_erf(-x, 1.0).to_bits(), (-gpu_erf(x, 1.0)).to_bits());
    }
}

#[test]
fn erf_lowers_to_polynomials_and_one_ex2_on_both_targets() {
    let src = "kernel k<T: float = f32>(x: tensor<T, 1>, y: tensor<T, 1>) {\n\
               let v = load(x, [bid(0)], [256]);\n\
               store(y, [bid(0)], erf(v));\n}\n";
    let file = SourceFile::new("erf.kg", src);
    for arch in Arch::ALL {
        for t in ["f32", "bf16"] {
            let opts = CompileOptions::new(arch).define("T", t);
            let k = compile(&file, &opts).unwrap_or_else(|d| panic!("{}", d.render(&file)));
            assert!(k.ptx.contains("ex2.approx.ftz.f32"), "{}", k.ptx);
            assert!(k.ptx.contains("copysign.f32"), "{}", k.ptx);
            assemble(&k.ptx, arch.name(), &format!("erf_{t}"));
        }
    }
}
