//! Interpreter tests, part 2: reductions (both axes, NaN lines, f16/bf16 sums in f32,
//! pairwise accuracy), shape operations, `dot` against a naive f64 matmul, and `for` /
//! `if` regions.
//!
//! Assumes: the helpers of `tests.rs`.
//! Guarantees: outputs are poisoned before each run and checked element by element.

use super::tests::*;
use super::*;
use crate::ir::{BinaryOp, ReduceOp};
use crate::types::Scalar;

// ------------------------------------------------------------------ reductions

/// `out = reduce(op, load(x [r, c]), axis)` stored as a 1-D tensor (or a 1-element one).
fn reduce_kernel(
    d: DType,
    dout: DType,
    rows: u32,
    cols: u32,
    op: ReduceOp,
    axis: u8,
    pad: Scalar,
) -> Function {
    let mut k = Kb::new();
    let x = k.t(d, 2);
    let o = k.t(dout, 1);
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    let v = k.load(&mut b, x, vec![z, z], d, &[rows, cols], pad);
    let len = if axis == 0 { cols } else { rows };
    let r = k.op(&mut b, Op::Reduce { op, value: v, axis }, tt(dout, &[len]));
    k.store(&mut b, o, vec![z], r);
    k.finish(b)
}

fn reference(op: ReduceOp, line: &[f64]) -> f64 {
    let valid: Vec<(usize, f64)> = line
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .collect();
    match op {
        ReduceOp::Sum => line.iter().sum(),
        ReduceOp::Max => valid.iter().map(|p| p.1).fold(f64::NAN, f64::max),
        ReduceOp::Min => valid.iter().map(|p| p.1).fold(f64::NAN, f64::min),
        ReduceOp::ArgMax => valid
            .iter()
            .fold(None, |b: Option<(usize, f64)>, &(i, v)| match b {
                Some((_, bv)) if v <= bv => b,
                _ => Some((i, v)),
            })
            .map_or(0.0, |p| p.0 as f64),
        ReduceOp::ArgMin => valid
            .iter()
            .fold(None, |b: Option<(usize, f64)>, &(i, v)| match b {
                Some((_, bv)) if v >= bv => b,
                _ => Some((i, v)),
            })
            .map_or(0.0, |p| p.0 as f64),
    }
}

#[test]
fn reductions_along_both_axes() {
    let (rows, cols) = (7usize, 13usize);
    // Small integers (with ties) so sums are exact and arg ties are exercised.
    let xs: Vec<f64> = rnd(rows * cols, 9, 5.0).iter().map(|v| v.round()).collect();
    for d in [DType::F32, DType::I32, DType::F16] {
        for op in [
            ReduceOp::Sum,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::ArgMax,
            ReduceOp::ArgMin,
        ] {
            for axis in [0u8, 1] {
                let dout = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
                    DType::I32
                } else {
                    d
                };
                // The tile is larger than the tensor: padding must not leak in, so use the
                // operation's neutral element.
                let pad = match op {
                    ReduceOp::Max | ReduceOp::ArgMax => {
                        if d == DType::I32 {
                            int(i32::MIN as i64, d)
                        } else {
                            f(f64::NEG_INFINITY, d)
                        }
                    }
                    ReduceOp::Min | ReduceOp::ArgMin => {
                        if d == DType::I32 {
                            int(i32::MAX as i64, d)
                        } else {
                            f(f64::INFINITY, d)
                        }
                    }
                    ReduceOp::Sum => f(0.0, d).cast_like(d),
                };
                let func = reduce_kernel(d, dout, rows as u32, cols as u32, op, axis, pad);
                let len = if axis == 0 { cols } else { rows };
                let mut args = vec![tensor(d, &[rows, cols], &xs), poisoned(dout, &[len])];
                run(&func, [1, 1, 1], &mut args).unwrap();
                let out = written(&args[1]);
                for (j, &o) in out.iter().enumerate() {
                    let line: Vec<f64> = if axis == 0 {
                        (0..rows).map(|r| xs[r * cols + j]).collect()
                    } else {
                        xs[j * cols..(j + 1) * cols].to_vec()
                    };
                    assert_eq!(o, reference(op, &line), "{d} {op:?} axis {axis} line {j}");
                }
            }
        }
    }
}

#[test]
fn reductions_of_nan_lines() {
    let n = f64::NAN;
    // rows: [nan, 1, 3, 3], [nan, nan, nan, nan], [2, nan, 5, nan]
    let xs = [n, 1.0, 3.0, 3.0, n, n, n, n, 2.0, n, 5.0, n];
    let pad = f(0.0, DType::F32);
    let cases = [
        (ReduceOp::Max, DType::F32, vec![3.0, n, 5.0]),
        (ReduceOp::Min, DType::F32, vec![1.0, n, 2.0]),
        (ReduceOp::ArgMax, DType::I32, vec![2.0, 0.0, 2.0]),
        (ReduceOp::ArgMin, DType::I32, vec![1.0, 0.0, 0.0]),
    ];
    for (op, dout, want) in cases {
        let func = reduce_kernel(DType::F32, dout, 3, 4, op, 1, pad);
        let mut args = vec![tensor(DType::F32, &[3, 4], &xs), poisoned(dout, &[3])];
        run(&func, [1, 1, 1], &mut args).unwrap();
        let out = written(&args[1]);
        for (o, w) in out.iter().zip(&want) {
            assert!(
                o == w || (o.is_nan() && w.is_nan()),
                "{op:?}: {out:?} vs {want:?}"
            );
        }
    }
}

#[test]
fn half_sum_accumulates_in_f32() {
    // 4097 ones in f16: an f16 accumulator would stall at 2048; f32 gives 4097 → 4096.
    for (d, want) in [
        (DType::F16, 4096.0),
        (DType::BF16, 4096.0),
        (DType::F32, 4097.0),
    ] {
        let func = reduce_kernel(d, d, 1, 4097, ReduceOp::Sum, 1, f(0.0, d));
        let mut args = vec![tensor(d, &[1, 4097], &vec![1.0; 4097]), poisoned(d, &[1])];
        run(&func, [1, 1, 1], &mut args).unwrap();
        assert_eq!(written(&args[1]), vec![want], "{d}");
    }
    // Integer sums wrap.
    let func = reduce_kernel(
        DType::I32,
        DType::I32,
        1,
        3,
        ReduceOp::Sum,
        1,
        int(0, DType::I32),
    );
    let mut args = vec![
        tensor(DType::I32, &[1, 3], &[i32::MAX as f64, 1.0, 1.0]),
        poisoned(DType::I32, &[1]),
    ];
    run(&func, [1, 1, 1], &mut args).unwrap();
    assert_eq!(written(&args[1]), vec![i32::MIN as f64 + 1.0]);
}

#[test]
fn long_float_sums_are_accurate() {
    // Pairwise summation keeps the error of 4097 terms near f32 rounding.
    let xs = rnd(4097 * 3, 11, 100.0);
    let func = reduce_kernel(
        DType::F32,
        DType::F32,
        3,
        4097,
        ReduceOp::Sum,
        1,
        f(0.0, DType::F32),
    );
    let mut args = vec![
        tensor(DType::F32, &[3, 4097], &xs),
        poisoned(DType::F32, &[3]),
    ];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let out = written(&args[1]);
    for r in 0..3 {
        let exact: f64 = xs[r * 4097..(r + 1) * 4097]
            .iter()
            .map(|v| *v as f32 as f64)
            .sum();
        let abs: f64 = xs[r * 4097..(r + 1) * 4097].iter().map(|v| v.abs()).sum();
        assert!(
            (out[r] - exact).abs() <= abs * 1e-6,
            "row {r}: {} vs {exact}",
            out[r]
        );
    }
    // axis 0 of a tall tile (pairwise over rows)
    let func = reduce_kernel(
        DType::F32,
        DType::F32,
        1000,
        3,
        ReduceOp::Sum,
        0,
        f(0.0, DType::F32),
    );
    let xs = rnd(3000, 12, 1.0);
    let mut args = vec![
        tensor(DType::F32, &[1000, 3], &xs),
        poisoned(DType::F32, &[3]),
    ];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let out = written(&args[1]);
    for c in 0..3 {
        let exact: f64 = (0..1000).map(|r| xs[r * 3 + c] as f32 as f64).sum();
        assert!((out[c] - exact).abs() < 1e-4, "col {c}");
    }
}

// ------------------------------------------------------------------ shapes, dot, control flow

#[test]
fn shape_ops() {
    // arange [3,7) → expand_dims(0) [1,4] → broadcast [3,4] → permute [4,3] → reshape [12]
    let d = DType::I32;
    let mut k = Kb::new();
    let o = k.t(d, 1);
    let mut b = Block::default();
    let a = k.op(&mut b, Op::Arange { start: 3, end: 7 }, tt(d, &[4]));
    let e = k.op(&mut b, Op::ExpandDims(a, 0), tt(d, &[1, 4]));
    let br = k.op(&mut b, Op::Broadcast(e), tt(d, &[3, 4]));
    let rows = k.op(&mut b, Op::Arange { start: 0, end: 3 }, tt(d, &[3]));
    let re = k.op(&mut b, Op::ExpandDims(rows, 1), tt(d, &[3, 1]));
    let rb = k.op(&mut b, Op::Broadcast(re), tt(d, &[3, 4]));
    let hundred = k.op(&mut b, Op::Const(int(100, d)), st(d));
    let hs = k.op(&mut b, Op::Splat(hundred), tt(d, &[3, 4]));
    let rr = k.bin(&mut b, BinaryOp::Mul, rb, hs);
    let sum = k.bin(&mut b, BinaryOp::Add, br, rr); // sum[i][j] = 100 i + 3 + j
    let p = k.op(&mut b, Op::Permute(sum, vec![1, 0]), tt(d, &[4, 3]));
    let r = k.op(&mut b, Op::Reshape(p), tt(d, &[12]));
    let z = k.i32c(&mut b, 0);
    k.store(&mut b, o, vec![z], r);
    let func = k.finish(b);
    let mut args = vec![poisoned(d, &[12])];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let want: Vec<f64> = (0..4)
        .flat_map(|j| (0..3).map(move |i| (100 * i + 3 + j) as f64))
        .collect();
    assert_eq!(written(&args[0]), want);
}

#[test]
fn permute_3d() {
    let d = DType::F32;
    let (a0, a1, a2) = (2usize, 3usize, 5usize);
    let mut k = Kb::new();
    let (x, o) = (k.t(d, 3), k.t(d, 3));
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    let v = k.load(&mut b, x, vec![z, z, z], d, &[2, 3, 5], f(0.0, d));
    let p = k.op(&mut b, Op::Permute(v, vec![2, 0, 1]), tt(d, &[5, 2, 3]));
    k.store(&mut b, o, vec![z, z, z], p);
    let func = k.finish(b);
    let xs: Vec<f64> = (0..a0 * a1 * a2).map(|i| i as f64).collect();
    let mut args = vec![tensor(d, &[a0, a1, a2], &xs), poisoned(d, &[a2, a0, a1])];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let out = written(&args[1]);
    for i in 0..a2 {
        for j in 0..a0 {
            for l in 0..a1 {
                assert_eq!(out[(i * a0 + j) * a1 + l], xs[(j * a1 + l) * a2 + i]);
            }
        }
    }
}

fn dot_case(din: DType, dacc: DType, m: usize, kk: usize, n: usize) {
    let mut k = Kb::new();
    let (a, bt, c, o) = (k.t(din, 2), k.t(din, 2), k.t(dacc, 2), k.t(dacc, 2));
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    let pad = f(0.0, din).cast_like(din);
    let va = k.load(&mut b, a, vec![z, z], din, &[m as u32, kk as u32], pad);
    let vb = k.load(&mut b, bt, vec![z, z], din, &[kk as u32, n as u32], pad);
    let vc = k.load(
        &mut b,
        c,
        vec![z, z],
        dacc,
        &[m as u32, n as u32],
        f(0.0, dacc).cast_like(dacc),
    );
    let r = k.op(
        &mut b,
        Op::Dot {
            a: va,
            b: vb,
            acc: vc,
            precision: Default::default(),
        },
        tt(dacc, &[m as u32, n as u32]),
    );
    k.store(&mut b, o, vec![z, z], r);
    let func = k.finish(b);
    let round = |v: Vec<f64>, d: DType| -> Vec<f64> {
        v.iter()
            .map(|&x| crate::host::scalar_from_f64(d, x).to_f64())
            .collect()
    };
    let scale = if din.is_float() { 2.0 } else { 100.0 };
    let xa = round(
        rnd(m * kk, 21, scale)
            .iter()
            .map(|v| if din.is_float() { *v } else { v.round() })
            .collect(),
        din,
    );
    let xb = round(
        rnd(kk * n, 22, scale)
            .iter()
            .map(|v| if din.is_float() { *v } else { v.round() })
            .collect(),
        din,
    );
    let xc = round(
        rnd(m * n, 23, scale)
            .iter()
            .map(|v| if din.is_float() { *v } else { v.round() })
            .collect(),
        dacc,
    );
    let mut args = vec![
        tensor(din, &[m, kk], &xa),
        tensor(din, &[kk, n], &xb),
        tensor(dacc, &[m, n], &xc),
        poisoned(dacc, &[m, n]),
    ];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let out = written(&args[3]);
    for i in 0..m {
        for j in 0..n {
            let want: f64 =
                xc[i * n + j] + (0..kk).map(|l| xa[i * kk + l] * xb[l * n + j]).sum::<f64>();
            let got = out[i * n + j];
            let tol = if din.is_float() {
                1e-5 * (kk as f64) * scale * scale
            } else {
                0.0
            };
            assert!(
                (got - want).abs() <= tol,
                "{din} [{i},{j}]: {got} vs {want}"
            );
        }
    }
}

#[test]
fn dot_matches_naive_matmul() {
    dot_case(DType::F32, DType::F32, 5, 7, 3);
    dot_case(DType::F32, DType::F32, 33, 65, 17);
    dot_case(DType::F16, DType::F32, 16, 48, 9);
    dot_case(DType::BF16, DType::F32, 1, 1, 1);
    dot_case(DType::I32, DType::I32, 4, 9, 6);
}

#[test]
fn for_loop_carries_a_tile() {
    // out[0..B] = Σ_k x[k*B .. k*B+B] for k in lower..n_chunks step `step`.
    let d = DType::F32;
    let block = 7u32;
    let build = |lower: i64, step: i64| {
        let mut k = Kb::new();
        let (x, o) = (k.t(d, 1), k.t(d, 1));
        let nparam = k.scalar_param(DType::I32);
        let mut b = Block::default();
        let lo = k.i32c(&mut b, lower);
        let hi = k.op(&mut b, Op::ScalarParam(nparam), st(DType::I32));
        let stp = k.i32c(&mut b, step);
        let init = k.op(&mut b, Op::Const(f(0.5, d)), tt(d, &[block]));
        let iv = k.val(st(DType::I32));
        let acc = k.val(tt(d, &[block]));
        let mut body = Block {
            args: vec![iv, acc],
            insts: vec![],
        };
        let v = k.load(&mut body, x, vec![iv], d, &[block], f(0.0, d));
        let nacc = k.bin(&mut body, BinaryOp::Add, acc, v);
        k.op0(&mut body, Op::Yield(vec![nacc]));
        let res = k.ops(
            &mut b,
            Op::For {
                lower: lo,
                upper: hi,
                step: stp,
                inits: vec![init],
                body,
            },
            vec![tt(d, &[block])],
        );
        let z = k.i32c(&mut b, 0);
        k.store(&mut b, o, vec![z], res[0]);
        k.finish(b)
    };
    let n = 40usize; // 6 chunks of 7 (the last one partial)
    let xs: Vec<f64> = (0..n).map(|i| i as f64).collect();
    for (lower, step, chunks) in [
        (0i64, 1i64, 6i64),
        (1, 2, 6),
        (0, 1, 0),
        (5, 1, 3),
        (0, 3, 6),
    ] {
        let func = build(lower, step);
        let mut args = vec![
            tensor(d, &[n], &xs),
            poisoned(d, &[block as usize]),
            ArgValue::Scalar(int(chunks, DType::I32)),
        ];
        run(&func, [1, 1, 1], &mut args).unwrap();
        let out = written(&args[1]);
        for (j, &o) in out.iter().enumerate() {
            let mut want = 0.5;
            let mut kk = lower;
            while kk < chunks {
                let idx = kk as usize * block as usize + j;
                want += if idx < n { xs[idx] } else { 0.0 };
                kk += step;
            }
            assert_eq!(o, want, "lower {lower} step {step} upper {chunks} j {j}");
        }
    }
}

#[test]
fn if_runs_one_region() {
    let d = DType::I32;
    let mut k = Kb::new();
    let o = k.t(d, 1);
    let flag = k.scalar_param(DType::Bool);
    let mut b = Block::default();
    let c = k.op(&mut b, Op::ScalarParam(flag), st(DType::Bool));
    let mut then_body = Block::default();
    let t1 = k.op(&mut then_body, Op::Const(int(11, d)), tt(d, &[2]));
    k.op0(&mut then_body, Op::Yield(vec![t1]));
    let mut else_body = Block::default();
    let e1 = k.op(
        &mut else_body,
        Op::Arange { start: -2, end: 0 },
        tt(d, &[2]),
    );
    k.op0(&mut else_body, Op::Yield(vec![e1]));
    let r = k.ops(
        &mut b,
        Op::If {
            cond: c,
            then_body,
            else_body,
        },
        vec![tt(d, &[2])],
    );
    let z = k.i32c(&mut b, 0);
    k.store(&mut b, o, vec![z], r[0]);
    let func = k.finish(b);
    for (flag, want) in [(true, vec![11.0, 11.0]), (false, vec![-2.0, -1.0])] {
        let mut args = vec![poisoned(d, &[2]), ArgValue::Scalar(Scalar::Bool(flag))];
        run(&func, [1, 1, 1], &mut args).unwrap();
        assert_eq!(written(&args[0]), want);
    }
}
