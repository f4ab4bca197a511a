//! Interpreter tests, part 3: memory access (tile loads/stores with edge masking and
//! padding, strided views, gather/scatter with masks and out-of-bounds coordinates,
//! atomic_add across blocks), grid order, every `InterpError` variant, a softmax check and
//! an (ignored) throughput measurement.
//!
//! Assumes: the helpers of `tests.rs`.
//! Guarantees: outputs are poisoned before each run; checks cover written and untouched
//! elements.

use super::tests::{
    f, ht, int, is_poison, poison_byte, poisoned, rnd, st, tensor, tt, written, Kb,
};
use super::*;
use crate::host::HostTensor;
use crate::ir::{BinaryOp, CmpOp, ReduceOp, TensorParam, UnaryOp};
use crate::types::Scalar;

/// `out[tile (i, j)] = load(x, (i, j), [tm, tn], pad)` over grid (cdiv(c, tn), cdiv(r, tm)).
fn copy2d(d: DType, tm: u32, tn: u32, pad: Scalar) -> Function {
    let mut k = Kb::new();
    let (x, o) = (k.t(d, 2), k.t(d, 2));
    let mut b = Block::default();
    let j = k.pid(&mut b, 0);
    let i = k.pid(&mut b, 1);
    let v = k.load(&mut b, x, vec![i, j], d, &[tm, tn], pad);
    k.store(&mut b, o, vec![i, j], v);
    k.finish(b)
}

#[test]
fn tile_load_store_masks_edges_2d() {
    let (r, c) = (7usize, 13usize);
    let xs: Vec<f64> = (0..r * c).map(|v| v as f64).collect();
    for (tm, tn) in [(4u32, 5u32), (1, 13), (8, 16), (3, 1)] {
        let func = copy2d(DType::F32, tm, tn, f(0.0, DType::F32));
        let grid = [
            c.div_ceil(tn as usize) as u32,
            r.div_ceil(tm as usize) as u32,
            1,
        ];
        let mut args = vec![
            tensor(DType::F32, &[r, c], &xs),
            poisoned(DType::F32, &[r, c]),
        ];
        run(&func, grid, &mut args).unwrap();
        assert_eq!(written(&args[1]), xs, "tile {tm}x{tn}");
    }
}

#[test]
fn load_padding_and_strided_views() {
    // x is a transposed view (strides [1, 5]) of a 5x3 buffer: x[i][j] = buf[j*5 + i].
    let buf: Vec<f64> = (0..15).map(|v| v as f64 * 0.5).collect();
    let mut x = HostTensor::from_f64(DType::F32, &[15], &buf);
    x.shape = vec![5, 3];
    x.strides = vec![1, 5];
    // load a [4, 4] tile at tile (1, 0): rows 4..8 (only row 4 exists), cols 0..4 (3 exist);
    // the padding (-inf) fills the rest; then store to out at tile (0, 0) of a [4, 4] out.
    let d = DType::F32;
    let mut k = Kb::new();
    let (xt, o) = (k.t(d, 2), k.t(d, 2));
    let mut b = Block::default();
    let one = k.i32c(&mut b, 1);
    let zero = k.i32c(&mut b, 0);
    let v = k.load(
        &mut b,
        xt,
        vec![one, zero],
        d,
        &[4, 4],
        f(f64::NEG_INFINITY, d),
    );
    k.store(&mut b, o, vec![zero, zero], v);
    let func = k.finish(b);
    let mut args = vec![ArgValue::Tensor(x), poisoned(d, &[4, 4])];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let out = written(&args[1]);
    for i in 0..4 {
        for j in 0..4 {
            let want = if i == 0 && j < 3 {
                buf[j * 5 + 4]
            } else {
                f64::NEG_INFINITY
            };
            assert_eq!(out[i * 4 + j], want, "[{i},{j}]");
        }
    }
    // a tile at a negative tile index reads only padding; storing there writes nothing
    let mut k = Kb::new();
    let (xt, o) = (k.t(d, 1), k.t(d, 1));
    let mut b = Block::default();
    let m1 = k.i32c(&mut b, -1);
    let v = k.load(&mut b, xt, vec![m1], d, &[4], f(7.0, d));
    k.store(&mut b, o, vec![m1], v);
    let z = k.i32c(&mut b, 0);
    let w = k.load(&mut b, xt, vec![m1], d, &[4], f(7.0, d));
    let _ = z;
    let zz = k.i32c(&mut b, 1);
    k.store(&mut b, o, vec![zz], w);
    let func = k.finish(b);
    let mut args = vec![tensor(d, &[6], &[1.0; 6]), poisoned(d, &[6])];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let t = ht(&args[1]);
    assert!((0..4).all(|i| is_poison(t, i)));
    assert_eq!((t.read_f64(4), t.read_f64(5)), (7.0, 7.0));
}

#[test]
fn load_store_all_dtypes_roundtrip() {
    for d in DType::ALL {
        let n = 9usize;
        let vals: Vec<f64> = (0..n)
            .map(|i| {
                if d == DType::Bool {
                    (i % 2) as f64
                } else {
                    i as f64 - 3.0
                }
            })
            .map(|v| if d == DType::U32 { v.abs() } else { v })
            .collect();
        let func = copy2d(d, 2, 4, crate::host::scalar_from_f64(d, 0.0));
        let mut args = vec![tensor(d, &[3, 3], &vals), poisoned(d, &[3, 3])];
        run(&func, [1, 2, 1], &mut args).unwrap();
        assert_eq!(written(&args[1]), vals, "{d}");
    }
}

/// out = gather(x, [o0, o1], mask, other) with offset and mask tiles read from tensors.
#[test]
fn gather_scatter_masks_and_out_of_bounds() {
    let d = DType::F32;
    let n = 6u32;
    let mut k = Kb::new();
    let x = k.t(d, 2);
    let (c0, c1, mk) = (k.t(DType::I64, 1), k.t(DType::I32, 1), k.t(DType::Bool, 1));
    let (o, s) = (k.t(d, 1), k.t(d, 2));
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    let vo0 = k.load(&mut b, c0, vec![z], DType::I64, &[n], int(0, DType::I64));
    let vo1 = k.load(&mut b, c1, vec![z], DType::I32, &[n], int(0, DType::I32));
    let vm = k.load(&mut b, mk, vec![z], DType::Bool, &[n], Scalar::Bool(false));
    let g = k.op(
        &mut b,
        Op::Gather {
            tensor: x,
            offsets: vec![vo0, vo1],
            mask: Some(vm),
            other: f(-9.0, d),
            eviction: Default::default(),
        },
        tt(d, &[n]),
    );
    k.store(&mut b, o, vec![z], g);
    let g2 = k.op(
        &mut b,
        Op::Gather {
            tensor: x,
            offsets: vec![vo0, vo1],
            mask: None,
            other: f(-1.0, d),
            eviction: Default::default(),
        },
        tt(d, &[n]),
    );
    k.op0(
        &mut b,
        Op::Scatter {
            tensor: s,
            offsets: vec![vo0, vo1],
            value: g2,
            mask: Some(vm),
            eviction: Default::default(),
        },
    );
    let func = k.finish(b);
    // x is 3x4: x[i][j] = 10 i + j
    let xs: Vec<f64> = (0..12).map(|v| (10 * (v / 4) + v % 4) as f64).collect();
    let rows = [0.0, 2.0, -1.0, 1.0, 3.0, 2.0];
    let cols = [1.0, 3.0, 0.0, 4.0, 0.0, 0.0];
    let mask = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0];
    let mut args = vec![
        tensor(d, &[3, 4], &xs),
        tensor(DType::I64, &[6], &rows),
        tensor(DType::I32, &[6], &cols),
        tensor(DType::Bool, &[6], &mask),
        poisoned(d, &[6]),
        poisoned(d, &[3, 4]),
    ];
    run(&func, [1, 1, 1], &mut args).unwrap();
    // in bounds: (0,1)=1, (2,3)=23; out: (-1,0), (1,4), (3,0); masked: (2,0)
    assert_eq!(written(&args[4]), vec![1.0, 23.0, -9.0, -9.0, -9.0, -9.0]);
    let s = ht(&args[5]);
    for i in 0..12 {
        match i {
            1 => assert_eq!(s.read_f64(1), 1.0),
            11 => assert_eq!(s.read_f64(11), 23.0),
            _ => assert!(is_poison(s, i), "scatter wrote element {i}"),
        }
    }
}

#[test]
fn scatter_duplicates_apply_in_row_major_order() {
    let d = DType::I32;
    let mut k = Kb::new();
    let o = k.t(d, 1);
    let mut b = Block::default();
    let a = k.op(&mut b, Op::Arange { start: 0, end: 5 }, tt(d, &[5]));
    let zero = k.op(&mut b, Op::Const(int(0, d)), tt(d, &[5]));
    let one = k.op(&mut b, Op::Const(int(1, d)), tt(d, &[5]));
    // coordinates [1,1,1,1,1] → the last value (4) wins
    k.op0(
        &mut b,
        Op::Scatter {
            tensor: o,
            offsets: vec![one],
            value: a,
            mask: None,
            eviction: Default::default(),
        },
    );
    // atomic_add of arange at coordinate 0: old values are prefix sums
    let old = k.op(
        &mut b,
        Op::AtomicAdd {
            tensor: o,
            offsets: vec![zero],
            value: a,
            mask: None,
        },
        tt(d, &[5]),
    );
    let c2 = k.op(&mut b, Op::Const(int(2, d)), tt(d, &[5]));
    let idx = k.bin(&mut b, BinaryOp::Add, a, c2);
    k.op0(
        &mut b,
        Op::Scatter {
            tensor: o,
            offsets: vec![idx],
            value: old,
            mask: None,
            eviction: Default::default(),
        },
    );
    let func = k.finish(b);
    let mut t = HostTensor::zeros(d, &[7]);
    t.poison(poison_byte(d));
    t.write_f64(0, 100.0);
    let mut args = vec![ArgValue::Tensor(t)];
    run(&func, [1, 1, 1], &mut args).unwrap();
    assert_eq!(
        written(&args[0]),
        vec![110.0, 4.0, 100.0, 100.0, 101.0, 103.0, 106.0]
    );
}

#[test]
fn atomic_add_accumulates_across_blocks() {
    // Each of 37 blocks adds (pid+1) to bins (arange(0,8) + pid) % 5, masked where
    // arange < 6; f32 and i32.
    for d in [DType::F32, DType::I32] {
        let mut k = Kb::new();
        let h = k.t(d, 1);
        let order = k.t(DType::I32, 1);
        let mut b = Block::default();
        let p = k.pid(&mut b, 0);
        let ar = k.op(
            &mut b,
            Op::Arange { start: 0, end: 8 },
            tt(DType::I32, &[8]),
        );
        let ps = k.op(&mut b, Op::Splat(p), tt(DType::I32, &[8]));
        let s = k.bin(&mut b, BinaryOp::Add, ar, ps);
        let five = k.op(&mut b, Op::Const(int(5, DType::I32)), tt(DType::I32, &[8]));
        let bins = k.bin(&mut b, BinaryOp::Rem, s, five);
        let six = k.op(&mut b, Op::Const(int(6, DType::I32)), tt(DType::I32, &[8]));
        let m = k.op(
            &mut b,
            Op::Compare(CmpOp::Lt, ar, six),
            tt(DType::Bool, &[8]),
        );
        let one = k.i32c(&mut b, 1);
        let p1 = k.bin(&mut b, BinaryOp::Add, p, one);
        let pf = k.cast(&mut b, p1, d);
        let v = k.op(&mut b, Op::Splat(pf), tt(d, &[8]));
        k.op(
            &mut b,
            Op::AtomicAdd {
                tensor: h,
                offsets: vec![bins],
                value: v,
                mask: Some(m),
            },
            tt(d, &[8]),
        );
        // record the block order: the counter at order[0] counts blocks
        let zt = k.op(&mut b, Op::Const(int(0, DType::I32)), tt(DType::I32, &[1]));
        let ot = k.op(&mut b, Op::Const(int(1, DType::I32)), tt(DType::I32, &[1]));
        let old = k.op(
            &mut b,
            Op::AtomicAdd {
                tensor: order,
                offsets: vec![zt],
                value: ot,
                mask: None,
            },
            tt(DType::I32, &[1]),
        );
        let slot = k.op(&mut b, Op::Splat(p1), tt(DType::I32, &[1]));
        k.op0(
            &mut b,
            Op::Scatter {
                tensor: order,
                offsets: vec![slot],
                value: old,
                mask: None,
                eviction: Default::default(),
            },
        );
        let func = k.finish(b);
        let nb = 37usize;
        let mut args = vec![tensor(d, &[5], &[0.0; 5]), poisoned(DType::I32, &[nb + 1])];
        if let ArgValue::Tensor(t) = &mut args[1] {
            t.write_f64(0, 0.0);
        }
        run(&func, [nb as u32, 1, 1], &mut args).unwrap();
        let mut want = [0.0f64; 5];
        for p in 0..nb {
            for a in 0..6 {
                want[(a + p) % 5] += (p + 1) as f64;
            }
        }
        assert_eq!(written(&args[0]), want.to_vec(), "{d}");
        let ord = written(&args[1]);
        assert_eq!(ord[0], nb as f64);
        assert_eq!(
            ord[1..].to_vec(),
            (0..nb).map(|v| v as f64).collect::<Vec<_>>()
        );
    }
}

#[test]
fn grid_runs_x_fastest_then_y_then_z() {
    // out[z][y][x] = order in which the block ran (an atomic counter), and the ids.
    let d = DType::I32;
    let mut k = Kb::new();
    let (cnt, out) = (k.t(d, 1), k.t(d, 3));
    let mut b = Block::default();
    let zt = k.op(&mut b, Op::Const(int(0, d)), tt(d, &[1]));
    let ot = k.op(&mut b, Op::Const(int(1, d)), tt(d, &[1]));
    let old = k.op(
        &mut b,
        Op::AtomicAdd {
            tensor: cnt,
            offsets: vec![zt],
            value: ot,
            mask: None,
        },
        tt(d, &[1]),
    );
    let nx = k.op(&mut b, Op::NumPrograms(0), st(d));
    let ny = k.op(&mut b, Op::NumPrograms(1), st(d));
    let (x, y, z) = (k.pid(&mut b, 0), k.pid(&mut b, 1), k.pid(&mut b, 2));
    // value = order * 1000 + (x + nx*(y + ny*z))
    let zy = k.bin(&mut b, BinaryOp::Mul, z, ny);
    let yy = k.bin(&mut b, BinaryOp::Add, zy, y);
    let yx = k.bin(&mut b, BinaryOp::Mul, yy, nx);
    let lin = k.bin(&mut b, BinaryOp::Add, yx, x);
    let lt = k.op(&mut b, Op::Splat(lin), tt(d, &[1]));
    let thousand = k.op(&mut b, Op::Const(int(1000, d)), tt(d, &[1]));
    let om = k.bin(&mut b, BinaryOp::Mul, old, thousand);
    let val = k.bin(&mut b, BinaryOp::Add, om, lt);
    let v3 = k.op(&mut b, Op::Reshape(val), tt(d, &[1, 1, 1]));
    k.store(&mut b, out, vec![z, y, x], v3);
    let func = k.finish(b);
    let grid = [3u32, 2, 4];
    let mut args = vec![tensor(d, &[1], &[0.0]), poisoned(d, &[4, 2, 3])];
    run(&func, grid, &mut args).unwrap();
    let want: Vec<f64> = (0..24).map(|i| (i * 1000 + i) as f64).collect();
    assert_eq!(written(&args[1]), want);
}

#[test]
fn tensor_dims_and_strides() {
    let d = DType::I32;
    let mut k = Kb::new();
    let x = k.t(DType::F32, 3);
    let o = k.t(d, 1);
    let mut b = Block::default();
    let mut vals = vec![];
    for dim in 0..3u8 {
        vals.push(k.op(&mut b, Op::TensorDim { tensor: x, dim }, st(d)));
        vals.push(k.op(&mut b, Op::TensorStride { tensor: x, dim }, st(d)));
    }
    for (i, v) in vals.into_iter().enumerate() {
        let t = k.op(&mut b, Op::Splat(v), tt(d, &[1]));
        let iv = k.i32c(&mut b, i as i64);
        k.store(&mut b, o, vec![iv], t);
    }
    let func = k.finish(b);
    let mut args = vec![
        ArgValue::Tensor(HostTensor::zeros(DType::F32, &[2, 3, 5])),
        poisoned(d, &[6]),
    ];
    run(&func, [1, 1, 1], &mut args).unwrap();
    assert_eq!(written(&args[1]), vec![2.0, 15.0, 3.0, 5.0, 5.0, 1.0]);
}

/// Row softmax over `[rows, cols]` with a `[1, block]` tile per row (block ≥ cols).
pub(super) fn softmax_kernel(block: u32) -> Function {
    let d = DType::F32;
    let mut k = Kb::new();
    let (x, o) = (
        k.tensor(d, &[None, None], true),
        k.tensor(d, &[None, None], true),
    );
    let mut b = Block::default();
    let row = k.pid(&mut b, 0);
    let z = k.i32c(&mut b, 0);
    let v = k.load(
        &mut b,
        x,
        vec![row, z],
        d,
        &[1, block],
        f(f64::NEG_INFINITY, d),
    );
    let m = k.op(
        &mut b,
        Op::Reduce {
            op: ReduceOp::Max,
            value: v,
            axis: 1,
        },
        tt(d, &[1]),
    );
    let mb = k.op(&mut b, Op::ExpandDims(m, 1), tt(d, &[1, 1]));
    let mbb = k.op(&mut b, Op::Broadcast(mb), tt(d, &[1, block]));
    let sh = k.bin(&mut b, BinaryOp::Sub, v, mbb);
    let e = k.un(&mut b, UnaryOp::Exp, sh);
    let s = k.op(
        &mut b,
        Op::Reduce {
            op: ReduceOp::Sum,
            value: e,
            axis: 1,
        },
        tt(d, &[1]),
    );
    let sb = k.op(&mut b, Op::ExpandDims(s, 1), tt(d, &[1, 1]));
    let sbb = k.op(&mut b, Op::Broadcast(sb), tt(d, &[1, block]));
    let r = k.bin(&mut b, BinaryOp::Div, e, sbb);
    k.store(&mut b, o, vec![row, z], r);
    k.finish(b)
}

fn softmax_ref(xs: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        let line = &xs[r * cols..(r + 1) * cols];
        let m = line.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = line.iter().map(|v| (v - m).exp()).sum();
        for c in 0..cols {
            out[r * cols + c] = (line[c] - m).exp() / s;
        }
    }
    out
}

#[test]
fn softmax_matches_f64() {
    let (rows, cols) = (13usize, 4097usize);
    let xs: Vec<f64> = rnd(rows * cols, 31, 8.0)
        .iter()
        .map(|v| *v as f32 as f64)
        .collect();
    let func = softmax_kernel(4100);
    let mut args = vec![
        tensor(DType::F32, &[rows, cols], &xs),
        poisoned(DType::F32, &[rows, cols]),
    ];
    run(&func, [rows as u32, 1, 1], &mut args).unwrap();
    let out = written(&args[1]);
    for (i, (o, w)) in out.iter().zip(softmax_ref(&xs, rows, cols)).enumerate() {
        assert!((o - w).abs() <= 1e-5 * w + 1e-12, "{i}: {o} vs {w}");
    }
}

/// Throughput: `cargo test --release -p kgen-core --lib interp::tests_mem::softmax_throughput -- --ignored --nocapture`
#[test]
#[ignore]
fn softmax_throughput() {
    let (rows, cols) = (1000usize, 4097usize);
    let xs = rnd(rows * cols, 32, 8.0);
    let func = softmax_kernel(4097);
    let mut args = vec![
        tensor(DType::F32, &[rows, cols], &xs),
        poisoned(DType::F32, &[rows, cols]),
    ];
    let t0 = std::time::Instant::now();
    run(&func, [rows as u32, 1, 1], &mut args).unwrap();
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "softmax {rows}x{cols}: {:.3} s, {:.1} M elements/s",
        dt,
        (rows * cols) as f64 / dt / 1e6
    );
}

// ------------------------------------------------------------------ errors

fn vec_copy(d: DType, dims: &[Option<u32>], contiguous: bool) -> Function {
    let mut k = Kb::new();
    let x = k.tensor(d, dims, contiguous);
    let o = k.tensor(d, dims, contiguous);
    let n = k.scalar_param(DType::I32);
    let mut b = Block::default();
    let i = k.pid(&mut b, 0);
    let v = k.load(&mut b, x, vec![i], d, &[4], f(0.0, d));
    let _ = k.op(&mut b, Op::ScalarParam(n), st(DType::I32));
    k.store(&mut b, o, vec![i], v);
    k.finish(b)
}

#[test]
fn argument_errors() {
    let d = DType::F32;
    let func = vec_copy(d, &[None], true);
    let good = || {
        vec![
            tensor(d, &[8], &[1.0; 8]),
            poisoned(d, &[8]),
            ArgValue::Scalar(int(3, DType::I32)),
        ]
    };
    let mut args = good();
    assert_eq!(run(&func, [2, 1, 1], &mut args), Ok(()));

    let mut a = good();
    a.pop();
    assert_eq!(
        run(&func, [1, 1, 1], &mut a),
        Err(InterpError::ArgCount {
            expected: 3,
            got: 2
        })
    );
    let mut a = good();
    a[2] = tensor(d, &[1], &[0.0]);
    assert_eq!(
        run(&func, [1, 1, 1], &mut a),
        Err(InterpError::ArgKind {
            index: 2,
            expected: "scalar"
        })
    );
    let mut a = good();
    a[0] = ArgValue::Scalar(f(1.0, d));
    assert_eq!(
        run(&func, [1, 1, 1], &mut a),
        Err(InterpError::ArgKind {
            index: 0,
            expected: "tensor"
        })
    );
    let mut a = good();
    a[1] = poisoned(DType::F16, &[8]);
    assert_eq!(
        run(&func, [1, 1, 1], &mut a),
        Err(InterpError::ArgDType {
            index: 1,
            expected: d,
            got: DType::F16
        })
    );
    let mut a = good();
    a[2] = ArgValue::Scalar(int(3, DType::I64));
    assert_eq!(
        run(&func, [1, 1, 1], &mut a),
        Err(InterpError::ArgDType {
            index: 2,
            expected: DType::I32,
            got: DType::I64
        })
    );
    let mut a = good();
    a[0] = tensor(d, &[2, 4], &[0.0; 8]);
    assert_eq!(
        run(&func, [1, 1, 1], &mut a),
        Err(InterpError::ArgRank {
            index: 0,
            expected: 1,
            got: 2,
            strides: 2
        })
    );
    // contiguous declared, stride 2
    let mut a = good();
    if let ArgValue::Tensor(t) = &mut a[0] {
        t.shape = vec![4];
        t.strides = vec![2];
    }
    assert_eq!(
        run(&func, [1, 1, 1], &mut a),
        Err(InterpError::NotContiguous {
            index: 0,
            stride: 2
        })
    );
    // storage too small for the view
    let mut a = good();
    if let ArgValue::Tensor(t) = &mut a[1] {
        t.shape = vec![9];
    }
    assert_eq!(
        run(&func, [1, 1, 1], &mut a),
        Err(InterpError::StorageTooSmall {
            index: 1,
            needed: 9,
            available: 8
        })
    );
    // extent beyond i32
    let mut a = good();
    if let ArgValue::Tensor(t) = &mut a[1] {
        t.shape = vec![1 << 31];
        t.strides = vec![1];
    }
    assert!(matches!(
        run(&func, [1, 1, 1], &mut a),
        Err(InterpError::TensorTooLarge {
            index: 1,
            dim: 0,
            ..
        })
    ));
    // constant dimension mismatch
    let cf = vec_copy(d, &[Some(8)], true);
    let mut a = good();
    a[0] = tensor(d, &[7], &[0.0; 7]);
    assert_eq!(
        run(&cf, [1, 1, 1], &mut a),
        Err(InterpError::ConstDimMismatch {
            index: 0,
            dim: 0,
            expected: 8,
            got: 7
        })
    );
    // a bad argument is reported even for an empty grid; a good empty grid is a no-op
    let mut a = good();
    a.pop();
    assert!(run(&func, [0, 1, 1], &mut a).is_err());
    let mut a = good();
    assert_eq!(run(&func, [4, 0, 1], &mut a), Ok(()));
    assert!((0..8).all(|i| is_poison(ht(&a[1]), i)));
    // a grid the GPU would refuse is refused before anything runs (it would run for
    // hours), each axis at its own limit
    for grid in [[1 << 31, 1, 1], [1, 65536, 1], [1, 1, 65536], [u32::MAX; 3]] {
        let mut a = good();
        assert_eq!(
            run(&func, grid, &mut a),
            Err(InterpError::GridTooLarge { grid })
        );
        assert!((0..8).all(|i| is_poison(ht(&a[1]), i)));
    }
    let e = InterpError::GridTooLarge {
        grid: [1, 70000, 1],
    };
    assert_eq!(
        e.to_string(),
        "grid [1, 70000, 1] exceeds the limits of a launch (2147483647, 65535, 65535 blocks along axes 0, 1, 2)"
    );
    // zero-extent tensors are fine (nothing is in bounds)
    let mut a = vec![
        tensor(d, &[0], &[]),
        poisoned(d, &[0]),
        ArgValue::Scalar(int(0, DType::I32)),
    ];
    assert_eq!(run(&func, [3, 1, 1], &mut a), Ok(()));
    // a non-contiguous view of a non-contiguous parameter is fine
    let nc = vec_copy(d, &[None], false);
    let mut a = good();
    if let ArgValue::Tensor(t) = &mut a[0] {
        t.shape = vec![4];
        t.strides = vec![2];
    }
    assert_eq!(run(&nc, [1, 1, 1], &mut a), Ok(()));
    let t = ht(&a[1]);
    assert!((0..4).all(|i| t.read_f64(i) == 1.0) && (4..8).all(|i| is_poison(t, i)));
}

#[test]
fn malformed_ir_errors() {
    let d = DType::F32;
    // a value used before its definition
    let mut k = Kb::new();
    let o = k.t(d, 1);
    let mut b = Block::default();
    let ghost = k.val(tt(d, &[4]));
    let z = k.i32c(&mut b, 0);
    k.store(&mut b, o, vec![z], ghost);
    let func = k.finish(b);
    let mut args = vec![poisoned(d, &[4])];
    assert_eq!(
        run(&func, [1, 1, 1], &mut args),
        Err(InterpError::UndefinedValue(ghost.index()))
    );

    // operand types that do not fit
    let mut k = Kb::new();
    let mut b = Block::default();
    let x = k.op(&mut b, Op::Const(f(1.0, d)), tt(d, &[4]));
    let y = k.op(&mut b, Op::Const(int(1, DType::I32)), tt(DType::I32, &[4]));
    k.op(&mut b, Op::Binary(BinaryOp::Add, x, y), tt(d, &[4]));
    let func = k.finish(b);
    assert!(matches!(
        run(&func, [1, 1, 1], &mut []),
        Err(InterpError::Malformed(_))
    ));

    // a result type that differs from what the op computes
    let mut k = Kb::new();
    let mut b = Block::default();
    let x = k.op(&mut b, Op::Const(f(1.0, d)), tt(d, &[4]));
    k.op(&mut b, Op::Unary(UnaryOp::Exp, x), tt(d, &[5]));
    let func = k.finish(b);
    assert!(matches!(
        run(&func, [1, 1, 1], &mut []),
        Err(InterpError::Malformed(_))
    ));

    // a for body without yield; a loop with a runtime step ≤ 0
    for (yield_it, step) in [(false, 1), (true, 0), (true, -2)] {
        let mut k = Kb::new();
        let mut b = Block::default();
        let lo = k.i32c(&mut b, 0);
        let hi = k.i32c(&mut b, 4);
        let s = k.i32c(&mut b, step);
        let iv = k.val(st(DType::I32));
        let mut body = Block {
            args: vec![iv],
            insts: vec![],
        };
        if yield_it {
            k.op0(&mut body, Op::Yield(vec![]));
        }
        k.ops(
            &mut b,
            Op::For {
                lower: lo,
                upper: hi,
                step: s,
                inits: vec![],
                body,
            },
            vec![],
        );
        let func = k.finish(b);
        let r = run(&func, [1, 1, 1], &mut []);
        if yield_it {
            assert_eq!(r, Err(InterpError::NonPositiveStep(step)));
        } else {
            assert!(matches!(r, Err(InterpError::Malformed(_))), "{r:?}");
        }
    }

    // a tile shape beyond the limits, wrong tensor/scalar parameter references, a bad axis
    let bad_ops: Vec<(Op, ValueType)> = vec![
        (Op::Const(f(0.0, d)), tt(d, &[1 << 16, 1 << 16])),
        (Op::Const(f(0.0, d)), tt(d, &[4, 0])),
        (Op::ScalarParam(7), st(DType::I32)),
        (Op::TensorDim { tensor: 0, dim: 0 }, st(DType::I32)),
        (Op::ProgramId(3), st(DType::I32)),
        (Op::Arange { start: 5, end: 5 }, tt(DType::I32, &[1])),
    ];
    for (op, ty) in bad_ops {
        let mut k = Kb::new();
        let mut b = Block::default();
        k.op(&mut b, op.clone(), ty);
        let func = k.finish(b);
        assert!(
            matches!(
                run(&func, [1, 1, 1], &mut []),
                Err(InterpError::Malformed(_))
            ),
            "{op:?}"
        );
    }
    let mut k = Kb::new();
    let mut b = Block::default();
    let x = k.op(&mut b, Op::Const(f(0.0, d)), tt(d, &[4]));
    k.op(
        &mut b,
        Op::Reduce {
            op: ReduceOp::Sum,
            value: x,
            axis: 1,
        },
        st(d),
    );
    k.op(&mut b, Op::Permute(x, vec![1]), tt(d, &[4]));
    let func = k.finish(b);
    assert!(matches!(
        run(&func, [1, 1, 1], &mut []),
        Err(InterpError::Malformed(_))
    ));

    // a load whose tile has a zero extent
    let mut k = Kb::new();
    let x = k.t(d, 2);
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    k.load(&mut b, x, vec![z, z], d, &[0, 4], f(0.0, d));
    let func = k.finish(b);
    let mut args = vec![tensor(d, &[2, 4], &[0.0; 8])];
    assert!(matches!(
        run(&func, [1, 1, 1], &mut args),
        Err(InterpError::Malformed(_))
    ));

    // a region that contains its own instruction: nesting is bounded, no stack overflow
    let mut k = Kb::new();
    let mut b = Block::default();
    let c = k.op(&mut b, Op::Const(Scalar::Bool(true)), st(DType::Bool));
    k.ops(
        &mut b,
        Op::If {
            cond: c,
            then_body: Block::default(),
            else_body: Block::default(),
        },
        vec![],
    );
    let if_id = *b.insts.last().unwrap();
    if let Op::If { then_body, .. } = &mut k.f.insts[if_id].op {
        then_body.insts.push(if_id);
    }
    let func = k.finish(b);
    assert!(matches!(
        run(&func, [1, 1, 1], &mut []),
        Err(InterpError::Malformed(_))
    ));
}

#[test]
fn malformed_memory_ops_error() {
    let d = DType::F32;
    // load with the wrong number of indices; gather with a float offset; store of a
    // mismatched dtype
    let mut k = Kb::new();
    let x = k.t(d, 2);
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    k.load(&mut b, x, vec![z], d, &[4], f(0.0, d));
    let f1 = k.load(&mut b, x, vec![z, z], d, &[1, 4], f(0.0, d));
    let _ = f1;
    let func = k.finish(b);
    let mut args = vec![tensor(d, &[2, 4], &[0.0; 8])];
    assert!(matches!(
        run(&func, [1, 1, 1], &mut args),
        Err(InterpError::Malformed(_))
    ));

    let mut k = Kb::new();
    let x = k.t(d, 1);
    let mut b = Block::default();
    let off = k.op(&mut b, Op::Const(f(1.0, d)), tt(d, &[4]));
    k.op(
        &mut b,
        Op::Gather {
            tensor: x,
            offsets: vec![off],
            mask: None,
            other: f(0.0, d),
            eviction: Default::default(),
        },
        tt(d, &[4]),
    );
    let func = k.finish(b);
    let mut args = vec![tensor(d, &[4], &[0.0; 4])];
    assert!(matches!(
        run(&func, [1, 1, 1], &mut args),
        Err(InterpError::Malformed(_))
    ));

    let mut k = Kb::new();
    let x = k.t(d, 1);
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    let v = k.op(&mut b, Op::Const(int(1, DType::I32)), tt(DType::I32, &[4]));
    k.store(&mut b, x, vec![z], v);
    let func = k.finish(b);
    let mut args = vec![tensor(d, &[4], &[0.0; 4])];
    assert!(matches!(
        run(&func, [1, 1, 1], &mut args),
        Err(InterpError::Malformed(_))
    ));
    let _ = TensorParam {
        dtype: d,
        dims: vec![],
        contiguous: false,
        align_bytes: 4,
    };
}

/// Random, mostly ill-typed IR: the interpreter must return (Ok or Err), never panic.
#[test]
fn random_malformed_ir_never_panics() {
    let mut seed = 0x9E3779B97F4A7C15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n.max(1)
    };
    let dtypes = DType::ALL;
    let shapes: [&[u32]; 5] = [&[], &[1], &[3], &[2, 3], &[3, 1]];
    let mut ok = 0;
    for _case in 0..3000 {
        let mut k = Kb::new();
        let _x = k.t(DType::F32, 2);
        let _s = k.scalar_param(DType::I32);
        let mut b = Block::default();
        let mut vals: Vec<ValueId> = Vec::new();
        for _ in 0..10 {
            let d = dtypes[next(7) as usize];
            let sh = shapes[next(5) as usize];
            let mut ty = if sh.is_empty() { st(d) } else { tt(d, sh) };
            let mut pick = || {
                if vals.is_empty() {
                    k.val(st(DType::I32))
                } else {
                    vals[next(vals.len() as u64) as usize]
                }
            };
            let (a, c, e) = (pick(), pick(), pick());
            if next(2) == 0 {
                // often well-typed: the first operand's type
                ty = k.f.values[a].ty.clone();
            }
            let op = match next(16) {
                0 => Op::Const(crate::host::scalar_from_f64(d, 2.0)),
                1 => Op::Binary(
                    [
                        BinaryOp::Add,
                        BinaryOp::Div,
                        BinaryOp::Shl,
                        BinaryOp::Min,
                        BinaryOp::Pow,
                    ][next(5) as usize],
                    a,
                    c,
                ),
                2 => Op::Unary(
                    [UnaryOp::Neg, UnaryOp::Not, UnaryOp::Exp][next(3) as usize],
                    a,
                ),
                3 => Op::Cast(a),
                4 => Op::Broadcast(a),
                5 => Op::Reshape(a),
                6 => Op::Reduce {
                    op: ReduceOp::ArgMax,
                    value: a,
                    axis: next(3) as u8,
                },
                7 => Op::Select(a, c, e),
                8 => Op::Dot {
                    a,
                    b: c,
                    acc: e,
                    precision: Default::default(),
                },
                9 => Op::Load {
                    tensor: next(3) as u32,
                    index: vec![a, c],
                    padding: f(0.0, DType::F32),
                    eviction: Default::default(),
                },
                10 => Op::Gather {
                    tensor: 0,
                    offsets: vec![a, c],
                    mask: Some(e),
                    other: f(0.0, DType::F32),
                    eviction: Default::default(),
                },
                11 => Op::AtomicAdd {
                    tensor: 0,
                    offsets: vec![a, c],
                    value: e,
                    mask: None,
                },
                12 => Op::Splat(a),
                13 => Op::Permute(a, vec![1, 0]),
                14 => Op::Compare(CmpOp::Lt, a, c),
                _ => Op::Fma(a, c, e),
            };
            let v = k.op(&mut b, op, ty);
            // Keep the instruction only when it runs, so later ones see deeper programs.
            let mut func = k.f.clone();
            func.body = b.clone();
            let mut args = vec![
                tensor(DType::F32, &[2, 3], &[1.0; 6]),
                ArgValue::Scalar(int(1, DType::I32)),
            ];
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run(&func, [2, 1, 1], &mut args)
            }));
            match r {
                Err(_) => panic!("panicked on:\n{func}"),
                Ok(Ok(())) => {
                    ok += 1;
                    vals.push(v);
                }
                Ok(Err(_)) => {
                    b.insts.pop();
                }
            }
        }
    }
    assert!(ok > 3000, "only {ok} random instructions ran");
}
