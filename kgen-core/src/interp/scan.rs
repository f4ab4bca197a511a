//! Scans (`Op::Scan`): `cumsum`, `cumprod`, `cummax`, `cummin` and the bitwise scans,
//! along one axis of a tile.
//!
//! Assumes: a well-formed [`Val`] (the checker and the validator refuse other dtypes;
//! here they are an [`InterpError`], not a panic).
//! Guarantees: the semantics documented on `ir::Op::Scan` and `ir::ScanOp`: element `i`
//! along the axis combines elements `0..=i` (`reverse`: `i..n`); `exclusive` leaves
//! element `i` out and folds from the op's start value (0, 1, -inf / +inf or the
//! integer's lowest / highest value, all ones, 0), so the first element of an exclusive
//! scan is that start value. Float `add` and `mul` accumulate in f64 and round each
//! result once to the dtype (f32, f16, bf16): more exact than the GPU, which accumulates
//! in f32 in a tree order, so the two agree to within f32 summation error, not bit for
//! bit. Float `max` / `min` skip NaN (`BinaryOp::Max`'s rule, +0 above -0); integers
//! wrap; `and` / `or` / `xor` are bitwise on integers and logical on bool. Every
//! result is exact for max, min and the integer and bitwise ops.

use super::eval::{fmax, fmin};
use super::value::{round_f64, Data, Val};
use super::InterpError;
use crate::ir::ScanOp;

fn bad(msg: String) -> InterpError {
    InterpError::Malformed(msg)
}

/// Where the lines of a scan along one axis lie in a row-major tile: `outer` blocks of
/// `len * inner` elements; line `(o, i)` holds elements `(o * len + r) * inner + i`.
#[derive(Clone, Copy)]
struct Lines {
    outer: usize,
    len: usize,
    inner: usize,
    reverse: bool,
    exclusive: bool,
}

impl Lines {
    /// Runs the scan over every line: `lift` maps an element to the accumulator,
    /// `comb(acc, x)` combines, `start` is the exclusive scan's first value, `out` maps
    /// an accumulator back to an element.
    fn run<T: Copy, A: Copy>(
        self,
        v: &[T],
        start: A,
        lift: impl Fn(T) -> A,
        comb: impl Fn(A, A) -> A,
        out: impl Fn(A) -> T,
    ) -> Vec<T> {
        let mut res: Vec<Option<T>> = vec![None; v.len()];
        for o in 0..self.outer {
            for i in 0..self.inner {
                let at = |r: usize| (o * self.len + r) * self.inner + i;
                let mut acc: Option<A> = self.exclusive.then_some(start);
                for k in 0..self.len {
                    let r = if self.reverse { self.len - 1 - k } else { k };
                    let x = lift(v[at(r)]);
                    let next = match acc {
                        None => x,
                        Some(a) => comb(a, x),
                    };
                    let shown = if self.exclusive {
                        acc.unwrap_or(start)
                    } else {
                        next
                    };
                    res[at(r)] = Some(out(shown));
                    acc = Some(next);
                }
            }
        }
        // Every element lies on exactly one line, so every slot is filled.
        res.into_iter()
            .zip(v)
            .map(|(r, &x)| r.unwrap_or(x))
            .collect()
    }
}

/// The integer scans, for one integer element type.
macro_rules! int_scan {
    ($lines:expr, $op:expr, $v:expr, $t:ty) => {{
        let l: Lines = $lines;
        let v: &[$t] = $v;
        let id = |x: $t| x;
        match $op {
            ScanOp::Add => l.run(v, 0, id, <$t>::wrapping_add, id),
            ScanOp::Mul => l.run(v, 1, id, <$t>::wrapping_mul, id),
            ScanOp::Max => l.run(v, <$t>::MIN, id, <$t>::max, id),
            ScanOp::Min => l.run(v, <$t>::MAX, id, <$t>::min, id),
            ScanOp::And => l.run(v, !0, id, |a, b| a & b, id),
            ScanOp::Or => l.run(v, 0, id, |a, b| a | b, id),
            ScanOp::Xor => l.run(v, 0, id, |a, b| a ^ b, id),
        }
    }};
}

/// `scan(op, a, axis)`, optionally reversed and exclusive.
pub(crate) fn scan(
    op: ScanOp,
    a: &Val,
    axis: u8,
    reverse: bool,
    exclusive: bool,
) -> Result<Val, InterpError> {
    let ax = axis as usize;
    if ax >= a.shape.len() {
        return Err(bad(format!("scan axis {axis} of {:?}", a.shape)));
    }
    if !op.accepts(a.dtype) {
        return Err(bad(format!("scan.{} of {}", op.name(), a.dtype)));
    }
    let lines = Lines {
        outer: a.shape[..ax].iter().map(|&d| d as usize).product(),
        len: a.shape[ax] as usize,
        inner: a.shape[ax + 1..].iter().map(|&d| d as usize).product(),
        reverse,
        exclusive,
    };
    let dt = a.dtype;
    let data = match &a.data {
        Data::I32(v) => Data::I32(int_scan!(lines, op, v, i32)),
        Data::U32(v) => Data::U32(int_scan!(lines, op, v, u32)),
        Data::I64(v) => Data::I64(int_scan!(lines, op, v, i64)),
        Data::Bool(v) => Data::Bool(match op {
            ScanOp::And => lines.run(v, true, |x| x, |a, b| a & b, |x| x),
            ScanOp::Or => lines.run(v, false, |x| x, |a, b| a | b, |x| x),
            ScanOp::Xor => lines.run(v, false, |x| x, |a, b| a ^ b, |x| x),
            _ => return Err(bad(format!("scan.{} of bool", op.name()))),
        }),
        Data::F(v) => {
            let round = |x: f64| round_f64(dt, x);
            let keep = |x: f32| x;
            Data::F(match op {
                ScanOp::Add => lines.run(v, 0.0, f64::from, |a, b| a + b, round),
                ScanOp::Mul => lines.run(v, 1.0, f64::from, |a, b| a * b, round),
                ScanOp::Max => lines.run(v, f32::NEG_INFINITY, keep, fmax, keep),
                ScanOp::Min => lines.run(v, f32::INFINITY, keep, fmin, keep),
                _ => return Err(bad(format!("scan.{} of {dt}", op.name()))),
            })
        }
    };
    Val::new(dt, a.shape.clone(), data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    fn v(dt: DType, shape: &[u32], data: Data) -> Val {
        Val::new(dt, shape.to_vec(), data).unwrap()
    }

    /// Small hand-written lines where every rule shows: the start values, NaN skipping,
    /// wrapping, the order of a reversed scan.
    #[test]
    fn rules_on_short_lines() {
        let n = f32::NAN;
        let x = v(DType::F32, &[4], Data::F(vec![n, 1.0, n, 3.0]));
        let f = |op, r, e| match scan(op, &x, 0, r, e).unwrap().data {
            Data::F(d) => d,
            _ => unreachable!(),
        };
        let same = |a: Vec<f32>, b: Vec<f32>| {
            assert_eq!(a.len(), b.len());
            for (p, q) in a.iter().zip(&b) {
                assert!(p == q || (p.is_nan() && q.is_nan()), "{a:?} vs {b:?}");
            }
        };
        same(f(ScanOp::Max, false, false), vec![n, 1.0, 1.0, 3.0]);
        same(
            f(ScanOp::Max, false, true),
            vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0, 1.0],
        );
        same(f(ScanOp::Min, true, false), vec![1.0, 1.0, 3.0, 3.0]);
        same(
            f(ScanOp::Min, true, true),
            vec![1.0, 3.0, 3.0, f32::INFINITY],
        );
        // A sum of NaNs is NaN; an exclusive sum's first element is +0.0.
        same(f(ScanOp::Add, false, false), vec![n, n, n, n]);
        let z = v(DType::F32, &[2], Data::F(vec![-0.0, -0.0]));
        match scan(ScanOp::Add, &z, 0, false, true).unwrap().data {
            Data::F(d) => assert!(d.iter().all(|x| *x == 0.0 && x.is_sign_positive())),
            _ => unreachable!(),
        }
        match scan(ScanOp::Add, &z, 0, false, false).unwrap().data {
            Data::F(d) => assert!(d.iter().all(|x| *x == 0.0 && x.is_sign_negative())),
            _ => unreachable!(),
        }
        let i = v(DType::I32, &[3], Data::I32(vec![i32::MAX, 1, 5]));
        assert_eq!(
            scan(ScanOp::Add, &i, 0, false, false).unwrap().data,
            Data::I32(vec![i32::MAX, i32::MIN, i32::MIN + 5])
        );
        assert_eq!(
            scan(ScanOp::Max, &i, 0, true, true).unwrap().data,
            Data::I32(vec![5, 5, i32::MIN])
        );
        let b = v(DType::Bool, &[4], Data::Bool(vec![true, false, true, true]));
        assert_eq!(
            scan(ScanOp::Xor, &b, 0, false, false).unwrap().data,
            Data::Bool(vec![true, true, false, true])
        );
        assert_eq!(
            scan(ScanOp::And, &b, 0, true, true).unwrap().data,
            Data::Bool(vec![false, true, true, true])
        );
    }

    #[test]
    fn refuses_what_the_checker_refuses() {
        let b = v(DType::Bool, &[2], Data::Bool(vec![true, false]));
        assert!(scan(ScanOp::Add, &b, 0, false, false).is_err());
        let f = v(DType::F16, &[2], Data::F(vec![1.0, 2.0]));
        assert!(scan(ScanOp::Xor, &f, 0, false, false).is_err());
        assert!(scan(ScanOp::Add, &f, 1, false, false).is_err());
    }
}
