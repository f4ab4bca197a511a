//! Whole-tile operations: creation and reshaping (`arange`, splat, broadcast, reshape,
//! expand_dims, permute), reductions and `dot`.
//!
//! Assumes: operands are well-formed [`Val`]s; result shapes come from the IR's result
//! types and are checked against the operands here.
//! Guarantees:
//! - reductions remove the axis (a 1-D tile gives a scalar). Float sums accumulate in f32
//!   with pairwise (tree) summation and round once to f16/bf16 at the end; integer sums
//!   wrap. `max`/`min` use the element-wise NaN rule (NaN skipped; all NaN → NaN).
//!   `argmax`/`argmin` give the first index of the extremum as i32, skipping NaN (an
//!   all-NaN line gives 0);
//! - `dot` computes `acc + a @ b`: float inputs multiply and accumulate in f32 with one
//!   fused multiply-add (`fma.rn.f32`) per step, k ascending, then round to the
//!   accumulator dtype; integer inputs are converted to the accumulator dtype and wrap.
//!   With a TF32 `input_precision` every operand element is first rounded by
//!   [`round_tf32`] (what the GPU's `cvt.rna.tf32.f32` computes), so each product is
//!   exact in f32 and only the order of the f32 sums differs from the tensor cores.

use super::eval::{fma_f32, fmax, fmin, IntElem};
use super::value::{cast, checked_numel, round_slice, Data, Kind, Val};
use super::InterpError;
use crate::ir::{InputPrecision, ReduceOp};
use crate::types::DType;

fn bad(msg: String) -> InterpError {
    InterpError::Malformed(msg)
}

/// Row-major element strides of a shape.
fn strides_of(shape: &[u32]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as usize;
    }
    s
}

/// For every element of `out_shape` (row-major), `Σ index[d] * src_strides[d]`.
fn strided_indices(out_shape: &[u32], src_strides: &[usize]) -> Vec<usize> {
    let n: usize = out_shape.iter().map(|&d| d as usize).product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let rank = out_shape.len();
    if rank == 0 {
        out.push(0);
        return out;
    }
    let mut idx = vec![0u32; rank];
    let inner = out_shape[rank - 1];
    let inner_stride = src_strides[rank - 1];
    loop {
        let base: usize = (0..rank - 1)
            .map(|d| idx[d] as usize * src_strides[d])
            .sum();
        out.extend((0..inner as usize).map(|i| base + i * inner_stride));
        // advance the outer odometer
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

pub(crate) fn arange(start: i64, end: i64) -> Result<Val, InterpError> {
    let n = end
        .checked_sub(start)
        .filter(|&n| n > 0)
        .ok_or_else(|| bad("empty arange".into()))?;
    let n = u32::try_from(n).map_err(|_| bad("arange too long".into()))?;
    checked_numel(&[n])?;
    let data = Data::I32(
        (0..n as i64)
            .map(|i| start.wrapping_add(i) as i32)
            .collect(),
    );
    Val::new(DType::I32, vec![n], data)
}

pub(crate) fn splat(a: &Val, shape: &[u32]) -> Result<Val, InterpError> {
    if !a.is_scalar() {
        return Err(bad("splat of a tile".into()));
    }
    let n = checked_numel(shape)?;
    Val::new(a.dtype, shape.to_vec(), a.data.repeat(0, n))
}

pub(crate) fn broadcast(a: &Val, shape: &[u32]) -> Result<Val, InterpError> {
    if a.shape.len() != shape.len()
        || a.is_scalar()
        || a.shape.iter().zip(shape).any(|(&s, &t)| s != t && s != 1)
    {
        return Err(bad(format!("broadcast {:?} to {shape:?}", a.shape)));
    }
    let n = checked_numel(shape)?;
    if a.shape == shape {
        return Ok(a.clone());
    }
    if a.numel() == 1 {
        return Val::new(a.dtype, shape.to_vec(), a.data.repeat(0, n));
    }
    let mut st = strides_of(&a.shape);
    for (d, s) in st.iter_mut().enumerate() {
        if a.shape[d] == 1 {
            *s = 0;
        }
    }
    let idx = strided_indices(shape, &st);
    Val::new(a.dtype, shape.to_vec(), a.data.take(&idx))
}

/// Reshape and expand_dims: same elements, new shape.
pub(crate) fn reshape(a: &Val, shape: &[u32]) -> Result<Val, InterpError> {
    if checked_numel(shape)? != a.numel() || shape.is_empty() {
        return Err(bad(format!("reshape {:?} to {shape:?}", a.shape)));
    }
    Val::new(a.dtype, shape.to_vec(), a.data.clone())
}

pub(crate) fn expand_dims(a: &Val, axis: u8, shape: &[u32]) -> Result<Val, InterpError> {
    let mut want = a.shape.clone();
    if a.is_scalar() || axis as usize > want.len() {
        return Err(bad(format!("expand_dims {:?} at {axis}", a.shape)));
    }
    want.insert(axis as usize, 1);
    if want != shape {
        return Err(bad(format!(
            "expand_dims {:?} at {axis} to {shape:?}",
            a.shape
        )));
    }
    reshape(a, shape)
}

pub(crate) fn permute(a: &Val, perm: &[u8]) -> Result<Val, InterpError> {
    let rank = a.shape.len();
    let mut seen = perm.to_vec();
    seen.sort_unstable();
    if rank == 0 || seen != (0..rank as u8).collect::<Vec<_>>() {
        return Err(bad(format!("permute {:?} by {perm:?}", a.shape)));
    }
    let src = strides_of(&a.shape);
    let shape: Vec<u32> = perm.iter().map(|&p| a.shape[p as usize]).collect();
    let st: Vec<usize> = perm.iter().map(|&p| src[p as usize]).collect();
    let idx = strided_indices(&shape, &st);
    Val::new(a.dtype, shape, a.data.take(&idx))
}

// ---------------------------------------------------------------- reductions

/// Pairwise sum of a contiguous run (f32 arithmetic).
fn pairwise(v: &[f32]) -> f32 {
    if v.len() <= 8 {
        let Some((&first, rest)) = v.split_first() else {
            return 0.0;
        };
        return rest.iter().fold(first, |s, &x| s + x);
    }
    let h = v.len() / 2;
    pairwise(&v[..h]) + pairwise(&v[h..])
}

/// Pairwise sum over rows `lo..hi` of a `[len, inner]` block, element-wise over `inner`.
fn pairwise_rows(v: &[f32], inner: usize, lo: usize, hi: usize) -> Vec<f32> {
    if hi - lo <= 8 {
        let mut acc = v[lo * inner..(lo + 1) * inner].to_vec();
        for r in lo + 1..hi {
            for (a, &x) in acc.iter_mut().zip(&v[r * inner..(r + 1) * inner]) {
                *a += x;
            }
        }
        return acc;
    }
    let mid = lo + (hi - lo) / 2;
    let mut a = pairwise_rows(v, inner, lo, mid);
    let b = pairwise_rows(v, inner, mid, hi);
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
    a
}

/// Folds each line of a `[outer, len, inner]` view with `f`, starting from the first
/// element of the line.
fn fold_lines<T: Copy>(
    v: &[T],
    outer: usize,
    len: usize,
    inner: usize,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let blk = &v[o * len * inner..(o + 1) * len * inner];
        let mut acc = blk[..inner].to_vec();
        for r in 1..len {
            for (a, &x) in acc.iter_mut().zip(&blk[r * inner..(r + 1) * inner]) {
                *a = f(*a, x);
            }
        }
        out.extend(acc);
    }
    out
}

/// First index of the best element of each line; `better(x, best)` says x replaces best;
/// `skip(x)` elements never count (NaN). A line with only skipped elements gives 0.
fn arg_lines<T: Copy>(
    v: &[T],
    outer: usize,
    len: usize,
    inner: usize,
    skip: impl Fn(T) -> bool,
    better: impl Fn(T, T) -> bool,
) -> Vec<i32> {
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best: Option<(T, usize)> = None;
            for r in 0..len {
                let x = v[(o * len + r) * inner + i];
                if skip(x) {
                    continue;
                }
                match best {
                    Some((b, _)) if !better(x, b) => {}
                    _ => best = Some((x, r)),
                }
            }
            out.push(best.map_or(0, |(_, r)| r as i32));
        }
    }
    out
}

fn reduce_int<T: IntElem + Ord>(
    op: ReduceOp,
    v: &[T],
    o: usize,
    l: usize,
    i: usize,
) -> (Option<Vec<T>>, Option<Vec<i32>>) {
    match op {
        ReduceOp::Sum => (Some(fold_lines(v, o, l, i, T::add)), None),
        ReduceOp::Max => (Some(fold_lines(v, o, l, i, |a, b| a.max(b))), None),
        ReduceOp::Min => (Some(fold_lines(v, o, l, i, |a, b| a.min(b))), None),
        ReduceOp::ArgMax => (None, Some(arg_lines(v, o, l, i, |_| false, |x, b| x > b))),
        ReduceOp::ArgMin => (None, Some(arg_lines(v, o, l, i, |_| false, |x, b| x < b))),
    }
}

pub(crate) fn reduce(op: ReduceOp, a: &Val, axis: u8) -> Result<Val, InterpError> {
    let ax = axis as usize;
    if ax >= a.shape.len() {
        return Err(bad(format!("reduce axis {axis} of {:?}", a.shape)));
    }
    let outer: usize = a.shape[..ax].iter().map(|&d| d as usize).product();
    let len = a.shape[ax] as usize;
    let inner: usize = a.shape[ax + 1..].iter().map(|&d| d as usize).product();
    let mut shape = a.shape.clone();
    shape.remove(ax);
    if len == 0 {
        return Err(bad("reduce over an empty axis".into()));
    }
    macro_rules! int_case {
        ($v:expr, $variant:ident) => {
            match reduce_int(op, $v, outer, len, inner) {
                (Some(r), _) => Data::$variant(r),
                (_, Some(r)) => Data::I32(r),
                (None, None) => return Err(bad("reduce produced no result".into())),
            }
        };
    }
    let data = match &a.data {
        Data::Bool(_) => return Err(bad("reduce of bool".into())),
        Data::I32(v) => int_case!(v, I32),
        Data::U32(v) => int_case!(v, U32),
        Data::I64(v) => int_case!(v, I64),
        Data::F(v) => match op {
            ReduceOp::Sum => {
                let mut out = Vec::with_capacity(outer * inner);
                for o in 0..outer {
                    let blk = &v[o * len * inner..(o + 1) * len * inner];
                    if inner == 1 {
                        out.push(pairwise(blk));
                    } else {
                        out.extend(pairwise_rows(blk, inner, 0, len));
                    }
                }
                round_slice(a.dtype, &mut out);
                Data::F(out)
            }
            ReduceOp::Max => Data::F(fold_lines(v, outer, len, inner, fmax)),
            ReduceOp::Min => Data::F(fold_lines(v, outer, len, inner, fmin)),
            ReduceOp::ArgMax => {
                Data::I32(arg_lines(v, outer, len, inner, f32::is_nan, |x, b| x > b))
            }
            ReduceOp::ArgMin => {
                Data::I32(arg_lines(v, outer, len, inner, f32::is_nan, |x, b| x < b))
            }
        },
    };
    let dtype = match op {
        ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I32,
        _ => a.dtype,
    };
    Val::new(dtype, shape, data)
}

// ---------------------------------------------------------------- dot

fn matmul_int<T: IntElem>(a: &[T], b: &[T], acc: &mut [T], m: usize, k: usize, n: usize) {
    for i in 0..m {
        let row = &mut acc[i * n..(i + 1) * n];
        for kk in 0..k {
            let x = a[i * k + kk];
            for (r, &y) in row.iter_mut().zip(&b[kk * n..(kk + 1) * n]) {
                *r = r.add(x.mul(y));
            }
        }
    }
}

/// `x` rounded to TF32: 10 explicit significand bits (f32's top 10), to nearest with ties
/// away from zero, kept in f32 format with the low 13 bits zero. This is PTX's
/// `cvt.rna.tf32.f32`, which the GPU path applies to every operand element of a TF32
/// `dot` before `mma.sync.m16n8k8.tf32` (and before the FMAs of a TF32 `dot` that is not
/// on tensor cores): for a finite value, an integer add of half the dropped range
/// (`0x1000`) to the bits, which carries into the exponent (up to infinity) exactly as
/// rounding the magnitude away from zero on a tie does, then the low 13 bits cleared.
/// Infinities stay; NaN stays NaN. Subnormals round the same way (no flush).
pub fn round_tf32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x.is_infinite() {
        return x;
    }
    f32::from_bits(x.to_bits().wrapping_add(0x1000) & 0xffff_e000)
}

/// The TF32 split of `x` (`input_precision = tf32x3`): `hi = round_tf32(x)` and `lo =
/// round_tf32(x - hi)`, the GPU path's `cvt.rna.tf32.f32`, `sub.f32`, `cvt.rna.tf32.f32`.
/// For finite `hi`, `x - hi` is exact in f32 (`hi` is `x` rounded to fewer bits, in the
/// same binade or the next). An infinite `x`, or one that rounds to infinity, gives a NaN
/// or infinite `lo`, so its products are NaN, on the GPU as here.
pub fn split_tf32(x: f32) -> (f32, f32) {
    let hi = round_tf32(x);
    (hi, round_tf32(x - hi))
}

pub(crate) fn dot(
    a: &Val,
    b: &Val,
    acc: &Val,
    precision: InputPrecision,
) -> Result<Val, InterpError> {
    let (&[m, k], &[k2, n], &[m2, n2]) =
        (a.shape.as_slice(), b.shape.as_slice(), acc.shape.as_slice())
    else {
        return Err(bad("dot operands must be 2-D tiles".into()));
    };
    if k != k2 || m != m2 || n != n2 || a.dtype != b.dtype {
        return Err(bad(format!(
            "dot of {:?} and {:?} into {:?}",
            a.shape, b.shape, acc.shape
        )));
    }
    let (m, k, n) = (m as usize, k as usize, n as usize);
    let float_in = a.dtype.is_float();
    // The computation dtype: f32 for float inputs, the accumulator's otherwise.
    let ct = if float_in { DType::F32 } else { acc.dtype };
    if precision.is_tf32() && a.dtype != DType::F32 {
        return Err(bad(format!(
            "dot with input_precision {} of {} operands",
            precision.name(),
            a.dtype
        )));
    }
    let x = cast(&a.data, a.dtype, ct);
    let y = cast(&b.data, b.dtype, ct);
    let mut z = cast(&acc.data, acc.dtype, ct);
    match (&x, &y, &mut z) {
        (Data::F(x), Data::F(y), Data::F(z)) if precision.is_tf32() => {
            let x3 = precision == InputPrecision::Tf32x3;
            let (xh, xl): (Vec<f32>, Vec<f32>) = x.iter().map(|&v| split_tf32(v)).unzip();
            let (yh, yl): (Vec<f32>, Vec<f32>) = y.iter().map(|&v| split_tf32(v)).unzip();
            for i in 0..m {
                let row = &mut z[i * n..(i + 1) * n];
                for kk in 0..k {
                    let (ph, pl) = (xh[i * k + kk], xl[i * k + kk]);
                    let ys = kk * n..(kk + 1) * n;
                    for ((r, &qh), &ql) in row.iter_mut().zip(&yh[ys.clone()]).zip(&yl[ys]) {
                        // The small terms first, as the GPU issues them.
                        if x3 {
                            *r = fma_f32(pl, qh, *r);
                            *r = fma_f32(ph, ql, *r);
                        }
                        *r = fma_f32(ph, qh, *r);
                    }
                }
            }
        }
        (Data::F(x), Data::F(y), Data::F(z)) => {
            for i in 0..m {
                let row = &mut z[i * n..(i + 1) * n];
                for kk in 0..k {
                    let p = x[i * k + kk];
                    for (r, &q) in row.iter_mut().zip(&y[kk * n..(kk + 1) * n]) {
                        *r = fma_f32(p, q, *r);
                    }
                }
            }
        }
        (Data::I32(x), Data::I32(y), Data::I32(z)) => matmul_int(x, y, z, m, k, n),
        (Data::U32(x), Data::U32(y), Data::U32(z)) => matmul_int(x, y, z, m, k, n),
        (Data::I64(x), Data::I64(y), Data::I64(z)) => matmul_int(x, y, z, m, k, n),
        _ => return Err(bad(format!("dot of {} into {}", a.dtype, acc.dtype))),
    }
    let out = if z.kind() == Kind::F || ct != acc.dtype {
        cast(&z, ct, acc.dtype)
    } else {
        z
    };
    Val::new(acc.dtype, acc.shape.clone(), out)
}
