//! Element-wise operations over whole values: unary and binary arithmetic, comparisons,
//! `where`, `fma` and casts. Each operation dispatches on the dtype and the operator once,
//! then runs a tight loop over the elements.
//!
//! Assumes: operands are well-formed [`Val`]s (see `value.rs`).
//! Guarantees: operand kinds and shapes are checked (a mismatch is `InterpError::Malformed`,
//! never a panic); results follow `ir::{UnaryOp, BinaryOp, CmpOp}`:
//! - floats compute in f32 (IEEE, round to nearest even); f16/bf16 results are computed in
//!   f32 and rounded to the dtype; transcendentals (`erf` included, by the `libm` crate)
//!   and `pow` are computed in f64 from the f32 value and rounded once; `fma` is fused in f32 (one rounding), then f16/bf16
//!   round to their dtype (as the GPU's `fma.rn.f32` + `cvt` does); integer `fma` wraps;
//! - bool `min`/`max` are and/or;
//! - float min/max ignore one NaN operand (both NaN → NaN), and order −0 below +0;
//! - integers wrap; division by zero gives all ones, remainder by zero gives the dividend;
//!   `MIN / -1` wraps; shifts by ≥ the width (amount read as unsigned) give 0, or the
//!   sign fill for a signed `Shr`; u32 compares unsigned;
//! - float comparisons are IEEE (`!=` is true when either operand is NaN, all others false).

use super::value::{cast, round_slice, Data, Val};
use super::InterpError;
use crate::ir::{BinaryOp, CmpOp, UnaryOp};
use crate::types::DType;

fn bad(msg: String) -> InterpError {
    InterpError::Malformed(msg)
}

/// IEEE minNum with −0 < +0.
#[inline]
pub(crate) fn fmin(a: f32, b: f32) -> f32 {
    if a < b || (a == b && a.is_sign_negative()) || b.is_nan() {
        a
    } else {
        b
    }
}

/// IEEE maxNum with +0 > −0.
#[inline]
pub(crate) fn fmax(a: f32, b: f32) -> f32 {
    if a > b || (a == b && a.is_sign_positive()) || b.is_nan() {
        a
    } else {
        b
    }
}

/// Integer element behaviour shared by i32, u32 and i64.
pub(crate) trait IntElem: Copy + PartialOrd + PartialEq + Default + 'static {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn rem(self, o: Self) -> Self;
    fn shl(self, o: Self) -> Self;
    fn shr(self, o: Self) -> Self;
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn not(self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
}

macro_rules! impl_int {
    ($t:ty, $u:ty, $signed:expr) => {
        impl IntElem for $t {
            #[inline]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline]
            fn div(self, o: Self) -> Self {
                if o == 0 {
                    !0
                } else {
                    self.wrapping_div(o)
                }
            }
            #[inline]
            fn rem(self, o: Self) -> Self {
                if o == 0 {
                    self
                } else {
                    self.wrapping_rem(o)
                }
            }
            #[inline]
            fn shl(self, o: Self) -> Self {
                let n = o as $u;
                if n >= <$t>::BITS as $u {
                    0
                } else {
                    self << n
                }
            }
            #[inline]
            fn shr(self, o: Self) -> Self {
                let n = o as $u;
                if n >= <$t>::BITS as $u {
                    if $signed {
                        self >> (<$t>::BITS - 1)
                    } else {
                        0
                    }
                } else {
                    self >> n
                }
            }
            #[inline]
            fn and(self, o: Self) -> Self {
                self & o
            }
            #[inline]
            fn or(self, o: Self) -> Self {
                self | o
            }
            #[inline]
            fn xor(self, o: Self) -> Self {
                self ^ o
            }
            #[inline]
            fn not(self) -> Self {
                !self
            }
            #[inline]
            fn neg(self) -> Self {
                (0 as $t).wrapping_sub(self)
            }
            #[inline]
            #[allow(unused_comparisons)]
            fn abs(self) -> Self {
                if self < 0 {
                    self.neg()
                } else {
                    self
                }
            }
        }
    };
}
impl_int!(i32, u32, true);
impl_int!(u32, u32, false);
impl_int!(i64, u64, true);

#[inline]
fn zip<T: Copy, R>(a: &[T], b: &[T], f: impl Fn(T, T) -> R) -> Vec<R> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

fn bin_int<T: IntElem>(op: BinaryOp, a: &[T], b: &[T]) -> Result<Vec<T>, InterpError> {
    Ok(match op {
        BinaryOp::Add => zip(a, b, T::add),
        BinaryOp::Sub => zip(a, b, T::sub),
        BinaryOp::Mul => zip(a, b, T::mul),
        BinaryOp::Div => zip(a, b, T::div),
        BinaryOp::Rem => zip(a, b, T::rem),
        BinaryOp::Min => zip(a, b, |x, y| if y < x { y } else { x }),
        BinaryOp::Max => zip(a, b, |x, y| if y > x { y } else { x }),
        BinaryOp::And => zip(a, b, T::and),
        BinaryOp::Or => zip(a, b, T::or),
        BinaryOp::Xor => zip(a, b, T::xor),
        BinaryOp::Shl => zip(a, b, T::shl),
        BinaryOp::Shr => zip(a, b, T::shr),
        BinaryOp::Pow => return Err(bad("pow on integers".into())),
        BinaryOp::FDiv => return Err(bad("fdiv on integers".into())),
    })
}

fn bin_float(op: BinaryOp, a: &[f32], b: &[f32]) -> Result<Vec<f32>, InterpError> {
    Ok(match op {
        BinaryOp::Add => zip(a, b, |x, y| x + y),
        BinaryOp::Sub => zip(a, b, |x, y| x - y),
        BinaryOp::Mul => zip(a, b, |x, y| x * y),
        // fdiv: correctly rounded here, within the 2 ulp the GPU's div.full.f32 promises.
        BinaryOp::Div | BinaryOp::FDiv => zip(a, b, |x, y| x / y),
        BinaryOp::Rem => zip(a, b, |x, y| x % y),
        BinaryOp::Min => zip(a, b, fmin),
        BinaryOp::Max => zip(a, b, fmax),
        BinaryOp::Pow => zip(a, b, |x, y| (x as f64).powf(y as f64) as f32),
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Shl | BinaryOp::Shr => {
            return Err(bad(format!("{op:?} on floats")))
        }
    })
}

fn same_type(what: &str, a: &Val, b: &Val) -> Result<(), InterpError> {
    if a.dtype != b.dtype || a.shape != b.shape {
        return Err(bad(format!(
            "{what} operands differ: {} {:?} vs {} {:?}",
            a.dtype, a.shape, b.dtype, b.shape
        )));
    }
    Ok(())
}

pub(crate) fn binary(op: BinaryOp, a: &Val, b: &Val) -> Result<Val, InterpError> {
    same_type("binary", a, b)?;
    let data = match (&a.data, &b.data) {
        (Data::I32(x), Data::I32(y)) => Data::I32(bin_int(op, x, y)?),
        (Data::U32(x), Data::U32(y)) => Data::U32(bin_int(op, x, y)?),
        (Data::I64(x), Data::I64(y)) => Data::I64(bin_int(op, x, y)?),
        (Data::F(x), Data::F(y)) => {
            let mut out = bin_float(op, x, y)?;
            if a.dtype != DType::F32 && !matches!(op, BinaryOp::Min | BinaryOp::Max) {
                round_slice(a.dtype, &mut out);
            }
            Data::F(out)
        }
        (Data::Bool(x), Data::Bool(y)) => Data::Bool(match op {
            BinaryOp::And | BinaryOp::Min => zip(x, y, |p, q| p & q),
            BinaryOp::Or | BinaryOp::Max => zip(x, y, |p, q| p | q),
            BinaryOp::Xor => zip(x, y, |p, q| p ^ q),
            _ => return Err(bad(format!("{op:?} on bool"))),
        }),
        _ => return Err(bad("binary operand kinds differ".into())),
    };
    Val::new(a.dtype, a.shape.clone(), data)
}

fn transcendental(a: &[f32], f: impl Fn(f64) -> f64) -> Vec<f32> {
    a.iter().map(|&x| f(x as f64) as f32).collect()
}

/// Results below 2^-126 in magnitude become 0 (keeping the sign), as the GPU's `.ftz`
/// transcendentals give them.
fn flush_subnormal(mut v: Vec<f32>) -> Vec<f32> {
    for x in &mut v {
        if x.is_subnormal() {
            *x = 0.0f32.copysign(*x);
        }
    }
    v
}

fn un_int<T: IntElem>(op: UnaryOp, a: &[T]) -> Result<Vec<T>, InterpError> {
    Ok(match op {
        UnaryOp::Neg => a.iter().map(|&x| x.neg()).collect(),
        UnaryOp::Not => a.iter().map(|&x| x.not()).collect(),
        UnaryOp::Abs => a.iter().map(|&x| x.abs()).collect(),
        _ => return Err(bad(format!("{op:?} on integers"))),
    })
}

pub(crate) fn unary(op: UnaryOp, a: &Val) -> Result<Val, InterpError> {
    let data = match &a.data {
        Data::Bool(x) => match op {
            UnaryOp::Not => Data::Bool(x.iter().map(|&b| !b).collect()),
            _ => return Err(bad(format!("{op:?} on bool"))),
        },
        Data::I32(x) => Data::I32(un_int(op, x)?),
        Data::U32(x) => Data::U32(un_int(op, x)?),
        Data::I64(x) => Data::I64(un_int(op, x)?),
        Data::F(x) => {
            let mut out: Vec<f32> = match op {
                UnaryOp::Neg => x.iter().map(|&v| -v).collect(),
                UnaryOp::Abs => x.iter().map(|&v| v.abs()).collect(),
                UnaryOp::Floor => x.iter().map(|&v| v.floor()).collect(),
                UnaryOp::Ceil => x.iter().map(|&v| v.ceil()).collect(),
                UnaryOp::Sqrt => x.iter().map(|&v| v.sqrt()).collect(),
                // The GPU's `ex2.approx.ftz`: results below 2^-126 are 0.
                UnaryOp::Exp => flush_subnormal(transcendental(x, f64::exp)),
                UnaryOp::Exp2 => flush_subnormal(transcendental(x, f64::exp2)),
                UnaryOp::Log => transcendental(x, f64::ln),
                UnaryOp::Log2 => transcendental(x, f64::log2),
                UnaryOp::Rsqrt => transcendental(x, |v| 1.0 / v.sqrt()),
                UnaryOp::Tanh => transcendental(x, f64::tanh),
                UnaryOp::Sigmoid => {
                    flush_subnormal(transcendental(x, |v| 1.0 / (1.0 + (-v).exp())))
                }
                UnaryOp::Sin => transcendental(x, f64::sin),
                UnaryOp::Cos => transcendental(x, f64::cos),
                UnaryOp::Erf => transcendental(x, libm::erf),
                UnaryOp::Not => return Err(bad("not on floats".into())),
            };
            round_slice(a.dtype, &mut out);
            Data::F(out)
        }
    };
    Val::new(a.dtype, a.shape.clone(), data)
}

fn cmp_vec<T: Copy + PartialOrd>(op: CmpOp, a: &[T], b: &[T]) -> Vec<bool> {
    match op {
        CmpOp::Eq => zip(a, b, |x, y| x == y),
        CmpOp::Ne => zip(a, b, |x, y| x != y),
        CmpOp::Lt => zip(a, b, |x, y| x < y),
        CmpOp::Le => zip(a, b, |x, y| x <= y),
        CmpOp::Gt => zip(a, b, |x, y| x > y),
        CmpOp::Ge => zip(a, b, |x, y| x >= y),
    }
}

pub(crate) fn compare(op: CmpOp, a: &Val, b: &Val) -> Result<Val, InterpError> {
    same_type("compare", a, b)?;
    let out = match (&a.data, &b.data) {
        (Data::Bool(x), Data::Bool(y)) => cmp_vec(op, x, y),
        (Data::I32(x), Data::I32(y)) => cmp_vec(op, x, y),
        (Data::U32(x), Data::U32(y)) => cmp_vec(op, x, y),
        (Data::I64(x), Data::I64(y)) => cmp_vec(op, x, y),
        (Data::F(x), Data::F(y)) => cmp_vec(op, x, y),
        _ => return Err(bad("compare operand kinds differ".into())),
    };
    Val::new(DType::Bool, a.shape.clone(), Data::Bool(out))
}

pub(crate) fn select(c: &Val, a: &Val, b: &Val) -> Result<Val, InterpError> {
    same_type("select", a, b)?;
    let Data::Bool(cond) = &c.data else {
        return Err(bad("select condition is not bool".into()));
    };
    if !c.is_scalar() && c.shape != a.shape {
        return Err(bad("select condition shape differs".into()));
    }
    if c.is_scalar() {
        return Ok(if cond.first().copied().unwrap_or(false) {
            a.clone()
        } else {
            b.clone()
        });
    }
    fn sel<T: Copy>(c: &[bool], a: &[T], b: &[T]) -> Vec<T> {
        c.iter()
            .zip(a.iter().zip(b))
            .map(|(&k, (&x, &y))| if k { x } else { y })
            .collect()
    }
    let data = match (&a.data, &b.data) {
        (Data::Bool(x), Data::Bool(y)) => Data::Bool(sel(cond, x, y)),
        (Data::I32(x), Data::I32(y)) => Data::I32(sel(cond, x, y)),
        (Data::U32(x), Data::U32(y)) => Data::U32(sel(cond, x, y)),
        (Data::I64(x), Data::I64(y)) => Data::I64(sel(cond, x, y)),
        (Data::F(x), Data::F(y)) => Data::F(sel(cond, x, y)),
        _ => return Err(bad("select operand kinds differ".into())),
    };
    Val::new(a.dtype, a.shape.clone(), data)
}

/// `p * q + r` in f32 with a single rounding (a true fused multiply-add), computed in f64
/// without a hardware FMA: the product is exact in f64, the sum's rounding error comes
/// from TwoSum, and a round-to-odd correction makes the final f64 → f32 rounding exact.
#[inline]
pub(crate) fn fma_f32(p: f32, q: f32, r: f32) -> f32 {
    let a = p as f64 * q as f64;
    let b = r as f64;
    let mut s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    if e != 0.0 && s.is_finite() {
        let bits = s.to_bits();
        if bits & 1 == 0 {
            // s ≠ 0 here; step toward the exact value, making the last bit odd.
            s = f64::from_bits(if (e > 0.0) == (s > 0.0) {
                bits + 1
            } else {
                bits - 1
            });
        }
    }
    s as f32
}

pub(crate) fn fma(a: &Val, b: &Val, c: &Val) -> Result<Val, InterpError> {
    same_type("fma", a, b)?;
    same_type("fma", a, c)?;
    fn imad<T: IntElem>(x: &[T], y: &[T], z: &[T]) -> Vec<T> {
        x.iter()
            .zip(y)
            .zip(z)
            .map(|((&p, &q), &r)| p.mul(q).add(r))
            .collect()
    }
    let data = match (&a.data, &b.data, &c.data) {
        // f16/bf16: fused in f32, then rounded to the dtype (like `fma.rn.f32` + `cvt`).
        (Data::F(x), Data::F(y), Data::F(z)) => {
            let mut out: Vec<f32> = x
                .iter()
                .zip(y)
                .zip(z)
                .map(|((&p, &q), &r)| fma_f32(p, q, r))
                .collect();
            round_slice(a.dtype, &mut out);
            Data::F(out)
        }
        (Data::I32(x), Data::I32(y), Data::I32(z)) => Data::I32(imad(x, y, z)),
        (Data::U32(x), Data::U32(y), Data::U32(z)) => Data::U32(imad(x, y, z)),
        (Data::I64(x), Data::I64(y), Data::I64(z)) => Data::I64(imad(x, y, z)),
        _ => return Err(bad("fma on bool".into())),
    };
    Val::new(a.dtype, a.shape.clone(), data)
}

pub(crate) fn cast_val(a: &Val, to: DType) -> Result<Val, InterpError> {
    Val::new(to, a.shape.clone(), cast(&a.data, a.dtype, to))
}
