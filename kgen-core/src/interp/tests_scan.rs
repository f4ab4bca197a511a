//! Interpreter tests, part 4: scans against float64 / exact integer references, for
//! every combine op and dtype, forward and reversed, inclusive and exclusive, on
//! awkward lengths (1, 7, 127, 1000, 4097) and along each axis of 2-D and 3-D tiles.
//!
//! Assumes: the helpers of `tests.rs`.
//! Guarantees: outputs are poisoned before each run and every element is checked: float
//! `add` / `mul` to within one rounding to the dtype of the exact result (the
//! interpreter rounds each prefix once), everything else exactly (NaN rules, wrapping,
//! the start values of exclusive scans).

use super::tests::*;
use super::*;
use crate::host::HostTensor;
use crate::ir::ScanOp;
#[allow(unused_imports)]
use crate::types::Scalar;

/// `y = scan(load(x, [0, ...], shape))` over a whole tensor of `shape`.
fn scan_kernel(d: DType, shape: &[u32], op: ScanOp, axis: u8, rev: bool, excl: bool) -> Function {
    let mut k = Kb::new();
    let x = k.t(d, shape.len());
    let y = k.t(d, shape.len());
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    let pad = match d {
        DType::Bool => Scalar::Bool(false),
        d if d.is_float() => Scalar::Float(0.0, d),
        d => Scalar::Int(0, d),
    };
    let v = k.load(&mut b, x, vec![z; shape.len()], d, shape, pad);
    let s = k.op(
        &mut b,
        Op::Scan {
            op,
            value: v,
            axis,
            reverse: rev,
            exclusive: excl,
        },
        tt(d, shape),
    );
    k.store(&mut b, y, vec![z; shape.len()], s);
    k.finish(b)
}

/// Inputs for `op` on `d`: never zero for floats, with NaNs for float max/min, values
/// that wrap for integer add and mul, random bits for the bitwise ops.
fn inputs(d: DType, op: ScanOp, n: usize, seed: u64) -> Vec<Scalar> {
    let r = rnd(n, seed, 1.0);
    r.iter()
        .enumerate()
        .map(|(i, &u)| match d {
            DType::Bool => Scalar::Bool(u > 0.0),
            d if d.is_float() => {
                let v = match op {
                    ScanOp::Mul => 1.0 + u * 0.03,
                    ScanOp::Max | ScanOp::Min if i % 11 == 3 => f64::NAN,
                    _ => {
                        let v = u * 4.0;
                        if v.abs() < 1e-3 {
                            0.5
                        } else {
                            v
                        }
                    }
                };
                // The value the tensor will hold (rounded to the dtype).
                let t = HostTensor::from_f64(d, &[1], &[v]);
                Scalar::Float(t.read_f64(0), d)
            }
            d => {
                let bits = (u * 9.0e18) as i64;
                let v = match (op, d) {
                    (ScanOp::Mul, _) => (u * 7.0).round() as i64 | 1,
                    (ScanOp::Add, DType::I32) => bits >> 33,
                    (ScanOp::Add, DType::U32) => (bits >> 33).rem_euclid(1 << 32),
                    (ScanOp::Max | ScanOp::Min, _) => ((u * 50.0).round()) as i64,
                    (_, DType::U32) => bits.rem_euclid(1 << 32),
                    (_, DType::I32) => bits >> 32,
                    _ => bits,
                };
                Scalar::Int(v, d)
            }
        })
        .collect()
}

/// The value wrapped to `d`'s width (u32 as unsigned, i32 and i64 as signed).
fn wrap(v: i128, d: DType) -> i128 {
    match d {
        DType::I32 => v as i32 as i128,
        DType::U32 => v as u32 as i128,
        _ => v as i64 as i128,
    }
}

/// The expected value of one element.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    Float(f64),
    Int(i128),
    Bool(bool),
}

/// One step of the reference fold, in exact integer / bool arithmetic (wrapping to the
/// dtype) or in f64 for floats, with the language's NaN rule (`f64::max` skips NaN).
fn step(d: DType, op: ScanOp, a: Want, x: Scalar) -> Want {
    match (a, x) {
        (Want::Bool(a), x) => {
            let x = x.to_f64() != 0.0;
            Want::Bool(match op {
                ScanOp::And => a && x,
                ScanOp::Or => a || x,
                _ => a ^ x,
            })
        }
        (Want::Float(a), x) => {
            let x = x.to_f64();
            Want::Float(match op {
                ScanOp::Add => a + x,
                ScanOp::Mul => a * x,
                ScanOp::Max => a.max(x),
                _ => a.min(x),
            })
        }
        (Want::Int(a), x) => {
            let x = match x {
                Scalar::Int(i, _) => wrap(i as i128, d),
                _ => 0,
            };
            Want::Int(match op {
                ScanOp::Add => wrap(a + x, d),
                ScanOp::Mul => wrap(a * x, d),
                ScanOp::Max => a.max(x),
                ScanOp::Min => a.min(x),
                ScanOp::And => a & x,
                ScanOp::Or => a | x,
                ScanOp::Xor => a ^ x,
            })
        }
    }
}

/// The value of an element itself, as a reference accumulator.
fn lift(d: DType, x: Scalar) -> Want {
    match x {
        Scalar::Bool(b) => Want::Bool(b),
        Scalar::Int(i, _) => Want::Int(wrap(i as i128, d)),
        Scalar::Float(f, _) => Want::Float(f),
    }
}

/// The start value of an exclusive scan.
fn start(d: DType, op: ScanOp) -> Want {
    match d {
        DType::Bool => Want::Bool(op == ScanOp::And),
        d if d.is_float() => Want::Float(match op {
            ScanOp::Add => 0.0,
            ScanOp::Mul => 1.0,
            ScanOp::Max => f64::NEG_INFINITY,
            _ => f64::INFINITY,
        }),
        d => Want::Int(match op {
            ScanOp::Add | ScanOp::Or | ScanOp::Xor => 0,
            ScanOp::Mul => 1,
            ScanOp::And => wrap(-1, d),
            ScanOp::Max => match d {
                DType::I32 => i32::MIN as i128,
                DType::U32 => 0,
                _ => i64::MIN as i128,
            },
            ScanOp::Min => match d {
                DType::I32 => i32::MAX as i128,
                DType::U32 => u32::MAX as i128,
                _ => i64::MAX as i128,
            },
        }),
    }
}

/// Runs one scan on a random tile of `shape` and checks every element.
fn check(d: DType, shape: &[u32], op: ScanOp, axis: usize, rev: bool, excl: bool) {
    let func = scan_kernel(d, shape, op, axis as u8, rev, excl);
    let dims: Vec<usize> = shape.iter().map(|&e| e as usize).collect();
    let n: usize = dims.iter().product();
    let seed = (n as u64) * 31 + axis as u64 * 7 + op as u64;
    let xs = inputs(d, op, n, seed);
    let mut x = HostTensor::zeros(d, &dims);
    for (i, s) in xs.iter().enumerate() {
        x.write_scalar(i, *s);
    }
    let mut args = vec![ArgValue::Tensor(x), poisoned(d, &dims)];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let out = ht(&args[1]);
    let what = format!(
        "{d} {shape:?} scan.{} axis {axis} reverse {rev} exclusive {excl}",
        op.name()
    );
    let strides = crate::host::contiguous_strides(&dims);
    // Every line along the axis, walked in scan order with a running fold.
    for i0 in (0..n).filter(|&i| crate::host::unravel(i, &dims)[axis] == 0) {
        let mut order: Vec<usize> = (0..dims[axis]).map(|k| i0 + k * strides[axis]).collect();
        if rev {
            order.reverse();
        }
        let mut acc: Option<Want> = excl.then(|| start(d, op));
        let mut mag = 0.0f64;
        for (k, &i) in order.iter().enumerate() {
            let before = acc;
            let next = match acc {
                None => lift(d, xs[i]),
                Some(a) => step(d, op, a, xs[i]),
            };
            acc = Some(next);
            mag += xs[i].to_f64().abs();
            let want = if excl { before } else { Some(next) };
            let Some(want) = want else { continue };
            assert!(!is_poison(out, i), "{what}: element {i} not written");
            let got = out.read_scalar(i);
            let ok = match (want, got) {
                (Want::Bool(w), Scalar::Bool(g)) => w == g,
                (Want::Int(w), Scalar::Int(g, _)) => w == g as i128,
                (Want::Float(w), Scalar::Float(g, _)) if excl && k == 0 => {
                    // An exclusive scan's first element: the start value (+0.0 for add).
                    g == w && g.is_sign_positive() == w.is_sign_positive()
                }
                (Want::Float(w), Scalar::Float(g, _))
                    if matches!(op, ScanOp::Add | ScanOp::Mul) =>
                {
                    // One rounding to the dtype (half an ulp; f16's subnormal spacing
                    // near zero), plus the error of the f64 fold itself.
                    let (half_ulp, floor) = match d {
                        DType::F16 => (2f64.powi(-11), 3e-8),
                        DType::BF16 => (2f64.powi(-8), 0.0),
                        _ => (2f64.powi(-24), 0.0),
                    };
                    (g - w).abs() <= half_ulp * w.abs() + 1e-12 * mag + floor
                }
                // max / min pick one element (or NaN): exactly. Inputs are never zero.
                (Want::Float(w), Scalar::Float(g, _)) => g == w || (g.is_nan() && w.is_nan()),
                _ => false,
            };
            let c = crate::host::unravel(i, &dims);
            assert!(ok, "{what}: element {i} ({c:?}) is {got:?}, want {want:?}");
        }
    }
}

const DTYPES: [DType; 7] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::Bool,
];

const MODES: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

#[test]
fn every_op_and_dtype_on_awkward_rows() {
    for d in DTYPES {
        for op in ScanOp::ALL.into_iter().filter(|o| o.accepts(d)) {
            for n in [1u32, 7, 127, 1000, 4097] {
                for (rev, excl) in MODES {
                    check(d, &[n], op, 0, rev, excl);
                }
            }
        }
    }
}

#[test]
fn every_axis_of_2d_and_3d_tiles() {
    let shapes: [&[u32]; 4] = [&[7, 130], &[127, 9], &[3, 5, 70], &[33, 2, 9]];
    for shape in shapes {
        for axis in 0..shape.len() {
            for (d, op) in [
                (DType::F32, ScanOp::Add),
                (DType::BF16, ScanOp::Add),
                (DType::F16, ScanOp::Max),
                (DType::I32, ScanOp::Add),
                (DType::I64, ScanOp::Xor),
                (DType::U32, ScanOp::Min),
                (DType::Bool, ScanOp::Or),
                (DType::F32, ScanOp::Mul),
            ] {
                for (rev, excl) in MODES {
                    check(d, shape, op, axis, rev, excl);
                }
            }
        }
    }
}
