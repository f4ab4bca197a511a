//! Runtime values of the interpreter: scalars and tiles as typed, row-major vectors, and
//! the element conversions (constants, casts, f16/bf16 rounding).
//!
//! Assumes: nothing about the IR; every constructor checks what it relies on.
//! Guarantees: a [`Val`] always satisfies its invariants — the [`Data`] variant matches
//! the dtype (`F` for f16/bf16/f32, `Bool`, `I32`, `U32`, `I64`), the element count is the
//! product of the shape (1 for a scalar, whose shape is empty), and f16/bf16 elements are
//! kept exactly representable in their dtype (rounded to nearest even). Conversions follow
//! `ir::Op::Cast`: float→narrower float and int→float round to nearest even (with a single
//! rounding), float→int truncates toward zero and saturates (NaN → 0), int→int wraps,
//! `bool`→number is 0/1 and number→`bool` is `!= 0`.

use super::InterpError;
use crate::types::{DType, Scalar, MAX_TILE_ELEMENTS};
use half::{bf16, f16};

/// Elements of one value, row-major. f16/bf16/f32 all live in `F` (f16/bf16 rounded).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    Bool(Vec<bool>),
    I32(Vec<i32>),
    U32(Vec<u32>),
    I64(Vec<i64>),
    F(Vec<f32>),
}

/// The storage kind a dtype uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Bool,
    I32,
    U32,
    I64,
    F,
}

pub(crate) fn kind_of(d: DType) -> Kind {
    match d {
        DType::Bool => Kind::Bool,
        DType::I32 => Kind::I32,
        DType::U32 => Kind::U32,
        DType::I64 => Kind::I64,
        DType::F16 | DType::BF16 | DType::F32 => Kind::F,
    }
}

impl Data {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Data::Bool(_) => Kind::Bool,
            Data::I32(_) => Kind::I32,
            Data::U32(_) => Kind::U32,
            Data::I64(_) => Kind::I64,
            Data::F(_) => Kind::F,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Data::Bool(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::U32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::F(v) => v.len(),
        }
    }

    /// Element `i` repeated `n` times (`i` must be in range; callers pass 0 of a scalar).
    pub(crate) fn repeat(&self, i: usize, n: usize) -> Data {
        match self {
            Data::Bool(v) => Data::Bool(vec![v[i]; n]),
            Data::I32(v) => Data::I32(vec![v[i]; n]),
            Data::U32(v) => Data::U32(vec![v[i]; n]),
            Data::I64(v) => Data::I64(vec![v[i]; n]),
            Data::F(v) => Data::F(vec![v[i]; n]),
        }
    }

    /// The elements at `idx` (every index in range, by construction of the caller).
    pub(crate) fn take(&self, idx: &[usize]) -> Data {
        fn t<T: Copy>(v: &[T], idx: &[usize]) -> Vec<T> {
            idx.iter().map(|&i| v[i]).collect()
        }
        match self {
            Data::Bool(v) => Data::Bool(t(v, idx)),
            Data::I32(v) => Data::I32(t(v, idx)),
            Data::U32(v) => Data::U32(t(v, idx)),
            Data::I64(v) => Data::I64(t(v, idx)),
            Data::F(v) => Data::F(t(v, idx)),
        }
    }

    /// Integer elements widened to i64 by value (u32 zero-extended); `None` for
    /// bool/float data.
    pub(crate) fn to_i64_vec(&self) -> Option<Vec<i64>> {
        match self {
            Data::I32(v) => Some(v.iter().map(|&x| x as i64).collect()),
            Data::U32(v) => Some(v.iter().map(|&x| x as i64).collect()),
            Data::I64(v) => Some(v.clone()),
            Data::Bool(_) | Data::F(_) => None,
        }
    }
}

/// A scalar (empty shape, one element) or a tile.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Val {
    pub dtype: DType,
    pub shape: Vec<u32>,
    pub data: Data,
}

/// Number of elements of a shape (1 for a scalar), refusing zero extents and shapes
/// beyond the tile limits.
pub(crate) fn checked_numel(shape: &[u32]) -> Result<usize, InterpError> {
    let n = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
    match n {
        Some(n) if n <= MAX_TILE_ELEMENTS && n > 0 && shape.len() <= 4 => Ok(n as usize),
        _ => Err(InterpError::Malformed(format!(
            "tile shape {shape:?} is beyond the limits"
        ))),
    }
}

impl Val {
    /// Builds a value, checking the invariants (dtype ↔ variant, count ↔ shape).
    pub(crate) fn new(dtype: DType, shape: Vec<u32>, data: Data) -> Result<Val, InterpError> {
        let n = checked_numel(&shape)?;
        if data.kind() != kind_of(dtype) || data.len() != n {
            return Err(InterpError::Malformed(format!(
                "internal: {} elements of kind {:?} for {dtype} {shape:?}",
                data.len(),
                data.kind()
            )));
        }
        Ok(Val { dtype, shape, data })
    }

    pub(crate) fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    pub(crate) fn numel(&self) -> usize {
        self.data.len()
    }

    /// A scalar constant converted to `dtype` with the cast rules.
    pub(crate) fn from_scalar(dtype: DType, s: Scalar) -> Val {
        Val {
            dtype,
            shape: Vec::new(),
            data: scalar_data(dtype, s, 1),
        }
    }

    /// The value of an integer or bool scalar, widened to i64.
    pub(crate) fn as_i64(&self) -> Option<i64> {
        if !self.is_scalar() {
            return None;
        }
        match &self.data {
            Data::I32(v) => v.first().map(|&x| x as i64),
            Data::U32(v) => v.first().map(|&x| x as i64),
            Data::I64(v) => v.first().copied(),
            Data::Bool(v) => v.first().map(|&b| b as i64),
            Data::F(_) => None,
        }
    }

    pub(crate) fn as_bool(&self) -> Option<bool> {
        match (&self.data, self.is_scalar()) {
            (Data::Bool(v), true) => v.first().copied(),
            _ => None,
        }
    }
}

/// `n` copies of scalar `s` converted to `dtype` with the cast rules.
pub(crate) fn scalar_data(dtype: DType, s: Scalar, n: usize) -> Data {
    let one = match s {
        Scalar::Bool(b) => cast(&Data::Bool(vec![b]), DType::Bool, dtype),
        Scalar::Int(v, d) => {
            let src = match d {
                DType::U32 => Data::U32(vec![v as u32]),
                DType::I32 => Data::I32(vec![v as i32]),
                _ => Data::I64(vec![v]),
            };
            let from = match d {
                DType::U32 => DType::U32,
                DType::I32 => DType::I32,
                _ => DType::I64,
            };
            cast(&src, from, dtype)
        }
        Scalar::Float(v, _) => match kind_of(dtype) {
            Kind::F => Data::F(vec![round_f64(dtype, v)]),
            // f64 → int truncates and saturates like f32 → int does (NaN → 0).
            Kind::I32 => Data::I32(vec![v as i32]),
            Kind::U32 => Data::U32(vec![v as u32]),
            Kind::I64 => Data::I64(vec![v as i64]),
            Kind::Bool => Data::Bool(vec![v != 0.0]),
        },
    };
    one.repeat(0, n)
}

/// Rounds an f64 to `dtype` (f16/bf16/f32) with one rounding, as an f32
/// ([`crate::round`]: `half`'s own `from_f64` can round twice).
pub(crate) fn round_f64(dtype: DType, v: f64) -> f32 {
    crate::round::round_f64(dtype, v) as f32
}

/// Rounds f32 values in place to f16/bf16 (no-op for other dtypes).
pub(crate) fn round_slice(dtype: DType, v: &mut [f32]) {
    match dtype {
        DType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        DType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        _ => {}
    }
}

/// An i64 as f64 with round-to-odd when it has more than 53 significant bits, so that a
/// second rounding to a ≤ 51-bit format (f32, f16, bf16) is a correct single rounding.
fn i64_to_f64_odd(v: i64) -> f64 {
    let a = v.unsigned_abs();
    let bits = 64 - a.leading_zeros();
    if bits <= 53 {
        return v as f64;
    }
    let drop = bits - 53;
    let mut m = a >> drop;
    if a & ((1u64 << drop) - 1) != 0 {
        m |= 1;
    }
    let r = (m as f64) * (2f64).powi(drop as i32);
    if v < 0 {
        -r
    } else {
        r
    }
}

/// Converts `data` (of dtype `from`) to dtype `to` with the language's cast rules.
pub(crate) fn cast(data: &Data, from: DType, to: DType) -> Data {
    macro_rules! int_to {
        ($v:expr, $to_f64:expr) => {
            match to {
                DType::Bool => Data::Bool($v.iter().map(|&x| x != 0).collect()),
                DType::I32 => Data::I32($v.iter().map(|&x| x as i32).collect()),
                DType::U32 => Data::U32($v.iter().map(|&x| x as u32).collect()),
                DType::I64 => Data::I64($v.iter().map(|&x| x as i64).collect()),
                DType::F32 => Data::F($v.iter().map(|&x| x as f32).collect()),
                DType::F16 | DType::BF16 => {
                    Data::F($v.iter().map(|&x| round_f64(to, $to_f64(x))).collect())
                }
            }
        };
    }
    match data {
        Data::Bool(v) => match to {
            DType::Bool => data.clone(),
            DType::I32 => Data::I32(v.iter().map(|&b| b as i32).collect()),
            DType::U32 => Data::U32(v.iter().map(|&b| b as u32).collect()),
            DType::I64 => Data::I64(v.iter().map(|&b| b as i64).collect()),
            _ => Data::F(v.iter().map(|&b| b as u8 as f32).collect()),
        },
        Data::I32(v) => int_to!(v, |x: i32| x as f64),
        Data::U32(v) => int_to!(v, |x: u32| x as f64),
        Data::I64(v) => int_to!(v, i64_to_f64_odd),
        Data::F(v) => match to {
            DType::Bool => Data::Bool(v.iter().map(|&x| x != 0.0).collect()),
            DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
            DType::U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
            DType::I64 => Data::I64(v.iter().map(|&x| x as i64).collect()),
            DType::F32 => data.clone(),
            DType::F16 | DType::BF16 => {
                let mut out = v.clone();
                if from != to {
                    round_slice(to, &mut out);
                }
                Data::F(out)
            }
        },
    }
}
