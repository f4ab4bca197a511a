//! Host-side rounding to f16 and bf16: one correct round-to-nearest-even conversion from
//! f64 (and from i64) that every host path uses (host tensors, scalar kernel arguments,
//! compile-time constants, the interpreter's constants, `kgen run`'s inputs).
//!
//! Why not `half`'s own conversions: `bf16::from_f64` drops the low 32 bits of the f64
//! before rounding (1 + 2⁻⁸ + 2⁻⁴⁰ becomes 1.0, not 1 + 2⁻⁷), and `f16::from_f64` rounds
//! twice, through f32 (1 + 2⁻¹¹ + 2⁻³⁰ becomes 1.0, not 1 + 2⁻¹⁰). Their f32 → f16/bf16
//! conversions (`from_f32`) are correct round-to-nearest-even; the tests below check that
//! too, against the same independent definition.
//!
//! Assumes nothing. Guarantees: the result is the representable value nearest to the
//! exact input, ties to the even significand; values at or beyond the largest finite
//! value plus half an ulp become ±infinity (IEEE overflow); tiny values round into the
//! subnormals or to a zero of the input's sign; NaN stays NaN (quiet, the payload's top
//! bits kept, the sign kept); infinities and signed zeros are kept.

use crate::types::DType;
use half::{bf16, f16};

/// A binary16-like format: significand bits after the point, exponent bits.
#[derive(Clone, Copy)]
struct Format {
    man: u32,
    exp: u32,
}

const F16: Format = Format { man: 10, exp: 5 };
const BF16: Format = Format { man: 7, exp: 8 };

impl Format {
    fn bias(self) -> i32 {
        (1 << (self.exp - 1)) - 1
    }
    fn inf_bits(self) -> u16 {
        (((1u32 << self.exp) - 1) << self.man) as u16
    }
}

/// The bits of `±mant × 2^exp2` rounded to `f` (round to nearest, ties to even).
fn round_exact(neg: bool, mant: u64, exp2: i32, f: Format) -> u16 {
    let sign = (neg as u16) << 15;
    if mant == 0 {
        return sign;
    }
    let bias = f.bias();
    let emin = 1 - bias;
    // The exponent of the leading bit: 2^e ≤ |value| < 2^(e+1).
    let e = exp2 + (63 - mant.leading_zeros() as i32);
    if e > bias {
        return sign | f.inf_bits();
    }
    // The weight of the last significand bit at this exponent (subnormals share emin's).
    let q = e.max(emin) - f.man as i32;
    let shift = q - exp2;
    let r: u64 = if shift <= 0 {
        // Exact: r < 2^(man + 1), so the shift cannot overflow.
        mant << (-shift) as u32
    } else if shift >= 66 {
        // |value| < 2^(exp2 + 64) ≤ 2^(q - 2): below half the smallest step.
        0
    } else {
        let m = mant as u128;
        let r = m >> shift;
        let rem = m & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        let up = rem > half || (rem == half && r & 1 == 1);
        (r + up as u128) as u64
    };
    let bits = if e >= emin {
        // r includes the implicit leading bit (2^man); a carry out of the significand
        // moves into the exponent by itself.
        (((e + bias - 1) as u64) << f.man) + r
    } else {
        r
    };
    if bits >= f.inf_bits() as u64 {
        return sign | f.inf_bits();
    }
    sign | bits as u16
}

fn from_f64_bits(v: f64, f: Format) -> u16 {
    let b = v.to_bits();
    let neg = b >> 63 == 1;
    let exp = ((b >> 52) & 0x7FF) as i32;
    let frac = b & ((1u64 << 52) - 1);
    if exp == 0x7FF {
        let sign = (neg as u16) << 15;
        if frac == 0 {
            return sign | f.inf_bits();
        }
        // A quiet NaN with the payload's top bits.
        let payload = (frac >> (52 - f.man)) as u16 | (1 << (f.man - 1));
        return sign | f.inf_bits() | payload;
    }
    if exp == 0 {
        round_exact(neg, frac, -1074, f)
    } else {
        round_exact(neg, frac | (1u64 << 52), exp - 1075, f)
    }
}

/// `v` rounded to the nearest f16 (ties to even).
pub fn f64_to_f16(v: f64) -> f16 {
    f16::from_bits(from_f64_bits(v, F16))
}

/// `v` rounded to the nearest bf16 (ties to even).
pub fn f64_to_bf16(v: f64) -> bf16 {
    bf16::from_bits(from_f64_bits(v, BF16))
}

/// `v` rounded to the nearest f16 (ties to even; one rounding, also beyond 2^53).
pub fn i64_to_f16(v: i64) -> f16 {
    f16::from_bits(round_exact(v < 0, v.unsigned_abs(), 0, F16))
}

/// `v` rounded to the nearest bf16 (ties to even; one rounding, also beyond 2^53).
pub fn i64_to_bf16(v: i64) -> bf16 {
    bf16::from_bits(round_exact(v < 0, v.unsigned_abs(), 0, BF16))
}

/// `v` rounded to a float dtype's nearest value (ties to even), as f64; other dtypes
/// return `v` unchanged.
pub fn round_f64(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F16 => f64_to_f16(v).to_f64(),
        DType::BF16 => f64_to_bf16(v).to_f64(),
        // Rust's `as` rounds f64 → f32 to nearest even, once.
        DType::F32 => v as f32 as f64,
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every finite non-negative value of a format, ascending (bits 0 .. +inf), as f64,
    /// followed by 2^(emax+1), the value an IEEE rounding compares against for
    /// overflow (with the infinity's bits, whose significand is even).
    fn ladder(f: Format, to_f64: fn(u16) -> f64) -> Vec<(f64, u16)> {
        let inf = f.inf_bits();
        let mut v: Vec<(f64, u16)> = (0..inf).map(|b| (to_f64(b), b)).collect();
        v.push((2f64.powi(f.bias() + 1), inf));
        v
    }

    /// The independent definition: the nearest rung of the ladder, ties to the even
    /// bit pattern, by exact comparisons only (2v and lo + hi are exact in f64).
    fn oracle(ladder: &[(f64, u16)], v: f64) -> u16 {
        assert!(!v.is_nan());
        let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
        let a = v.abs();
        let top = ladder.last().expect("ladder");
        if a >= top.0 {
            return sign | top.1;
        }
        let i = ladder.partition_point(|(x, _)| *x <= a) - 1;
        let (lo, lo_bits) = ladder[i];
        if lo == a {
            return sign | lo_bits;
        }
        let (hi, hi_bits) = ladder[i + 1];
        let (two_a, mid2) = (2.0 * a, lo + hi);
        let pick = if two_a < mid2 {
            lo_bits
        } else if two_a > mid2 {
            hi_bits
        } else if lo_bits & 1 == 0 {
            lo_bits
        } else {
            hi_bits
        };
        sign | pick
    }

    /// Inputs that stress rounding: every rung, midpoints, one f64 ulp either side of
    /// them, and random points between rungs, plus f64 subnormals, huge values and
    /// random bit patterns.
    fn inputs(ladder: &[(f64, u16)], seed: u64) -> Vec<f64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut out = vec![
            0.0,
            -0.0,
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let step = |x: f64, k: i64| f64::from_bits((x.to_bits() as i64 + k) as u64);
        for w in ladder.windows(2) {
            let (lo, hi) = (w[0].0, w[1].0);
            let mid = (lo + hi) / 2.0;
            out.extend([lo, mid, step(mid, 1), step(mid, -1)]);
            if rng.random_bool(0.1) {
                out.push(lo + (hi - lo) * rng.random::<f64>());
                out.push(step(mid, rng.random_range(-(1 << 30)..(1 << 30))));
            }
        }
        for _ in 0..100_000 {
            out.push(f64::from_bits(rng.random::<u64>()));
        }
        let negs: Vec<f64> = out.iter().map(|x| -x).collect();
        out.extend(negs);
        out.retain(|x| !x.is_nan());
        out
    }

    fn check_all(name: &str, f: Format, to_f64: fn(u16) -> f64, conv: fn(f64) -> u16) {
        let l = ladder(f, to_f64);
        let mut checked = 0;
        for v in inputs(&l, 7) {
            let want = oracle(&l, v);
            let got = conv(v);
            assert_eq!(got, want, "{name}({v:e} = {:#018x})", v.to_bits());
            checked += 1;
        }
        assert!(checked > 200_000, "{checked}");
    }

    #[test]
    fn f64_to_f16_is_round_to_nearest_even() {
        check_all(
            "f64_to_f16",
            F16,
            |b| f16::from_bits(b).to_f64(),
            |v| f64_to_f16(v).to_bits(),
        );
    }

    #[test]
    fn f64_to_bf16_is_round_to_nearest_even() {
        check_all(
            "f64_to_bf16",
            BF16,
            |b| bf16::from_bits(b).to_f64(),
            |v| f64_to_bf16(v).to_bits(),
        );
    }

    /// `half`'s f32 → f16/bf16 (used by the interpreter after every f32 operation) is
    /// round-to-nearest-even: every f32 that is a rung, a midpoint or one f32 ulp from
    /// one, and random f32 bit patterns.
    #[test]
    fn halfs_f32_conversions_are_round_to_nearest_even() {
        for (name, f, to_f64, conv) in [
            (
                "f16::from_f32",
                F16,
                (|b| f16::from_bits(b).to_f64()) as fn(u16) -> f64,
                (|x| f16::from_f32(x).to_bits()) as fn(f32) -> u16,
            ),
            (
                "bf16::from_f32",
                BF16,
                |b| bf16::from_bits(b).to_f64(),
                |x| bf16::from_f32(x).to_bits(),
            ),
        ] {
            let l = ladder(f, to_f64);
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            let mut xs: Vec<f32> = (0..200_000)
                .map(|_| f32::from_bits(rng.random::<u32>()))
                .collect();
            for w in l.windows(2) {
                let mid = ((w[0].0 + w[1].0) / 2.0) as f32;
                let s = |k: i32| f32::from_bits((mid.to_bits() as i32 + k) as u32);
                xs.extend([w[0].0 as f32, mid, s(1), s(-1)]);
            }
            for x in xs.into_iter().filter(|x| !x.is_nan()) {
                for x in [x, -x] {
                    assert_eq!(conv(x), oracle(&l, x as f64), "{name}({x:e})");
                }
            }
        }
    }

    /// The cases of issue 21 (each fails with `half`'s `from_f64`), ties and the
    /// boundaries, spelled out.
    #[test]
    fn the_double_rounding_cases_round_once() {
        let p = |e: i32| 2f64.powi(e);
        // bf16: half drops the low 32 bits, so the 2^-40 that breaks the tie is lost.
        let v = 1.0 + p(-8) + p(-40);
        assert_eq!(f64_to_bf16(v).to_f64(), 1.0 + p(-7));
        assert_ne!(
            half::bf16::from_f64(v).to_f64(),
            1.0 + p(-7),
            "half was fixed?"
        );
        // f16: through f32 the 2^-30 is lost and the tie goes to even (1.0).
        let v = 1.0 + p(-11) + p(-30);
        assert_eq!(f64_to_f16(v).to_f64(), 1.0 + p(-10));
        assert_ne!(
            half::f16::from_f64(v).to_f64(),
            1.0 + p(-10),
            "half was fixed?"
        );
        // Exact ties go to even, both ways.
        assert_eq!(f64_to_bf16(1.0 + p(-8)).to_f64(), 1.0);
        assert_eq!(f64_to_bf16(1.0 + 3.0 * p(-8)).to_f64(), 1.0 + p(-6));
        assert_eq!(f64_to_f16(1.0 + p(-11)).to_f64(), 1.0);
        // Overflow: 65504 is f16's largest; 65520 is the tie with 2^16 (odd: up to inf).
        assert_eq!(f64_to_f16(65519.99).to_f64(), 65504.0);
        assert!(f64_to_f16(65520.0).is_infinite());
        assert_eq!(f64_to_f16(-1e300).to_f64(), f64::NEG_INFINITY);
        // bf16: the largest is (2 - 2^-7) 2^127; (2 - 2^-8) 2^127 is the tie with 2^128.
        let bmax = (2.0 - p(-7)) * p(127);
        assert_eq!(f64_to_bf16(bmax).to_f64(), bmax);
        assert_eq!(
            f64_to_bf16((2.0 - p(-8)) * p(127) * (1.0 - p(-50))).to_f64(),
            bmax
        );
        assert!(f64_to_bf16((2.0 - p(-8)) * p(127)).is_infinite());
        // Subnormals and underflow keep the sign.
        assert_eq!(f64_to_f16(p(-24)).to_bits(), 1);
        assert_eq!(f64_to_f16(p(-25)).to_bits(), 0); // a tie with 0 (even)
        assert_eq!(f64_to_f16(p(-25) + p(-60)).to_bits(), 1);
        assert_eq!(f64_to_f16(-p(-26)).to_bits(), 0x8000);
        assert_eq!(f64_to_bf16(p(-133)).to_bits(), 1);
        assert_eq!(f64_to_bf16(5e-324).to_bits(), 0);
        // NaN stays NaN, sign kept.
        assert!(f64_to_f16(f64::NAN).is_nan() && f64_to_bf16(-f64::NAN).is_nan());
        assert!(f64_to_bf16(-f64::NAN).is_sign_negative());
        // A NaN whose payload sits only in the low bits is still a NaN.
        assert!(f64_to_bf16(f64::from_bits(0x7FF0_0000_0000_0001)).is_nan());
        // One rounding from i64 too: 2^60 + 2^52 + 1 is just above a bf16 tie; through
        // f64 the + 1 is lost and the tie goes to even.
        let big = (1i64 << 60) + (1i64 << 52) + 1;
        assert_eq!(i64_to_bf16(big).to_f64(), p(60) + p(53));
        assert_eq!(i64_to_bf16(-big).to_f64(), -(p(60) + p(53)));
        assert_eq!(i64_to_f16(2049).to_f64(), 2048.0);
        assert_eq!(i64_to_f16(2051).to_f64(), 2052.0);
        assert!(i64_to_f16(70000).is_infinite());
        assert_eq!(i64_to_bf16(i64::MIN).to_f64(), -p(63));
    }

    /// i64 → f16/bf16 against the oracle on integers (exact as i128 comparisons).
    #[test]
    fn i64_conversions_are_round_to_nearest_even() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for (f, to_f64, conv) in [
            (
                F16,
                (|b| f16::from_bits(b).to_f64()) as fn(u16) -> f64,
                (|v| i64_to_f16(v).to_bits()) as fn(i64) -> u16,
            ),
            (
                BF16,
                |b| bf16::from_bits(b).to_f64(),
                |v| i64_to_bf16(v).to_bits(),
            ),
        ] {
            let l = ladder(f, to_f64);
            for _ in 0..200_000 {
                let bits = rng.random_range(0..64);
                let v = (rng.random::<u64>() >> bits) as i64;
                let v = if rng.random_bool(0.5) {
                    v
                } else {
                    v.wrapping_neg()
                };
                let a = v.unsigned_abs() as i128;
                let sign = if v < 0 { 0x8000 } else { 0 };
                // Integers ≥ 1: the neighbours around them are integers or exact.
                // x ≤ a ⟺ ceil(x) ≤ a for an integer a (exact; 2^128 saturates).
                let i = l.partition_point(|(x, _)| (x.ceil() as i128) <= a);
                let want = if i == l.len() {
                    sign | l[l.len() - 1].1
                } else {
                    let (lo, lb) = l[i - 1];
                    let (hi, hb) = l[i];
                    let (lo, hi) = (lo as i128, hi as i128);
                    // Exact (lo == a) or nearer the lower neighbour.
                    if lo == a || 2 * a < lo + hi {
                        sign | lb
                    } else if 2 * a > lo + hi {
                        sign | hb
                    } else {
                        sign | if lb & 1 == 0 { lb } else { hb }
                    }
                };
                if v == 0 {
                    continue;
                }
                assert_eq!(conv(v), want, "{v}");
            }
        }
    }

    /// Compile-time constants of a 16-bit dtype round once too (the checker materializes
    /// them through `host::scalar_from_f64`): the PTX's constant and the interpreter's
    /// value are 1 + 2^-7 and 1 + 2^-10, not 1.0 (issue 21).
    #[test]
    fn compile_time_constants_round_once() {
        use crate::host::{ArgValue, HostTensor};
        use crate::{compile, compile_to_ir, interp, Arch, CompileOptions, SourceFile};
        let p = |e: i32| 2f64.powi(e);
        for (d, v, want) in [
            ("bf16", 1.0 + p(-8) + p(-40), 1.0 + p(-7)),
            ("f16", 1.0 + p(-11) + p(-30), 1.0 + p(-10)),
        ] {
            let file = SourceFile::new(
                "c.kg",
                format!(
                    "kernel c(y: tensor<f32, 1, contiguous>) {{\n\
                     store(y, [0], full([4], {v}, {d}) as f32);\n}}\n"
                ),
            );
            let bits = format!("0f{:08X}", (want as f32).to_bits());
            for arch in Arch::ALL {
                let k = compile(&file, &CompileOptions::new(arch))
                    .unwrap_or_else(|e| panic!("{}", e.render(&file)));
                assert!(k.ptx.contains(&bits), "{d}: {bits} not in\n{}", k.ptx);
            }
            let (f, _) = compile_to_ir(&file, &CompileOptions::new(Arch::Sm90a)).unwrap();
            let mut args = vec![ArgValue::Tensor(HostTensor::zeros(DType::F32, &[4]))];
            interp::run(&f, [1, 1, 1], &mut args).unwrap();
            let ArgValue::Tensor(y) = &args[0] else {
                unreachable!()
            };
            assert_eq!(y.to_f64_vec(), vec![want; 4], "{d}");
        }
    }
}
