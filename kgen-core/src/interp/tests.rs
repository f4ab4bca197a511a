//! Interpreter tests, part 1: a small IR-building helper ([`Kb`]) shared with the other
//! test files, and tests of the element-wise arithmetic, cast and `fma` semantics against
//! hand-computed references on awkward sizes.
//!
//! Assumes: `ir::Builder` appends values/instructions as documented.
//! Guarantees: every output is poisoned (see `poison_byte`) before a run, and checks cover every
//! element that should be written (and that the rest stayed poisoned).

use super::*;
use crate::host::HostTensor;
use crate::ir::{BinaryOp, Builder, CmpOp, Param, TensorParam, UnaryOp};
use crate::span::Span;
use crate::types::{Scalar, Shape};
use half::{bf16, f16};

// ------------------------------------------------------------------ helpers

pub(super) fn tt(d: DType, dims: &[u32]) -> ValueType {
    ValueType::Tile(d, Shape(dims.to_vec()))
}
pub(super) fn st(d: DType) -> ValueType {
    ValueType::Scalar(d)
}
pub(super) fn f(v: f64, d: DType) -> Scalar {
    Scalar::Float(v, d)
}
pub(super) fn int(v: i64, d: DType) -> Scalar {
    Scalar::Int(v, d)
}

/// Builds a function by hand.
pub(super) struct Kb {
    pub f: Function,
}

impl Kb {
    pub fn new() -> Kb {
        Kb {
            f: Function::new("t", "t"),
        }
    }
    pub fn tensor(&mut self, d: DType, dims: &[Option<u32>], contiguous: bool) -> u32 {
        let i = self.f.params.len() as u32;
        self.f.params.push(Param {
            name: format!("p{i}"),
            kind: ParamKind::Tensor(TensorParam {
                dtype: d,
                dims: dims.to_vec(),
                contiguous,
                align_bytes: 4,
            }),
        });
        i
    }
    /// A runtime-extent tensor of rank `rank`.
    pub fn t(&mut self, d: DType, rank: usize) -> u32 {
        self.tensor(d, &vec![None; rank], false)
    }
    pub fn scalar_param(&mut self, d: DType) -> u32 {
        let i = self.f.params.len() as u32;
        self.f.params.push(Param {
            name: format!("p{i}"),
            kind: ParamKind::Scalar(d),
        });
        i
    }
    pub fn op(&mut self, b: &mut Block, op: Op, ty: ValueType) -> ValueId {
        Builder { func: &mut self.f }.inst(b, op, vec![ty], Span::DUMMY)[0]
    }
    pub fn ops(&mut self, b: &mut Block, op: Op, tys: Vec<ValueType>) -> Vec<ValueId> {
        Builder { func: &mut self.f }.inst(b, op, tys, Span::DUMMY)
    }
    pub fn op0(&mut self, b: &mut Block, op: Op) {
        Builder { func: &mut self.f }.inst(b, op, vec![], Span::DUMMY);
    }
    pub fn val(&mut self, ty: ValueType) -> ValueId {
        Builder { func: &mut self.f }.new_value(ty, None)
    }
    pub fn i32c(&mut self, b: &mut Block, v: i64) -> ValueId {
        self.op(b, Op::Const(int(v, DType::I32)), st(DType::I32))
    }
    pub fn pid(&mut self, b: &mut Block, axis: u8) -> ValueId {
        self.op(b, Op::ProgramId(axis), st(DType::I32))
    }
    pub fn load(
        &mut self,
        b: &mut Block,
        t: u32,
        index: Vec<ValueId>,
        d: DType,
        shape: &[u32],
        pad: Scalar,
    ) -> ValueId {
        self.op(
            b,
            Op::Load {
                tensor: t,
                index,
                padding: pad,
                eviction: Default::default(),
            },
            tt(d, shape),
        )
    }
    pub fn store(&mut self, b: &mut Block, t: u32, index: Vec<ValueId>, v: ValueId) {
        self.op0(
            b,
            Op::Store {
                tensor: t,
                index,
                value: v,
                eviction: Default::default(),
            },
        );
    }
    pub fn bin(&mut self, b: &mut Block, op: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
        let ty = self.f.values[x].ty.clone();
        self.op(b, Op::Binary(op, x, y), ty)
    }
    pub fn un(&mut self, b: &mut Block, op: UnaryOp, x: ValueId) -> ValueId {
        let ty = self.f.values[x].ty.clone();
        self.op(b, Op::Unary(op, x), ty)
    }
    pub fn cast(&mut self, b: &mut Block, x: ValueId, d: DType) -> ValueId {
        let ty = self.f.values[x].ty.with_dtype(d);
        self.op(b, Op::Cast(x), ty)
    }
    pub fn finish(mut self, body: Block) -> Function {
        self.f.body = body;
        self.f
    }
}

pub(super) fn tensor(d: DType, shape: &[usize], vals: &[f64]) -> ArgValue {
    ArgValue::Tensor(HostTensor::from_f64(d, shape, vals))
}
/// The poison byte of a dtype: 0xFF (a NaN) for floats; 0xA5 for integers and bool
/// (0xFF would be a legitimate -1 / u32::MAX result).
pub(super) fn poison_byte(d: DType) -> u8 {
    if d.is_float() {
        0xFF
    } else {
        0xA5
    }
}
pub(super) fn poisoned(d: DType, shape: &[usize]) -> ArgValue {
    let mut t = HostTensor::zeros(d, shape);
    t.poison(poison_byte(d));
    ArgValue::Tensor(t)
}
pub(super) fn ht(a: &ArgValue) -> &HostTensor {
    match a {
        ArgValue::Tensor(t) => t,
        _ => panic!("not a tensor"),
    }
}
/// Whether storage element `off` still holds the poison pattern.
pub(super) fn is_poison(t: &HostTensor, off: usize) -> bool {
    let sz = t.dtype.size_bytes() as usize;
    t.data[off * sz..off * sz + sz]
        .iter()
        .all(|&b| b == poison_byte(t.dtype))
}
/// Every element of the view, asserting none is still poisoned.
pub(super) fn written(a: &ArgValue) -> Vec<f64> {
    let t = ht(a);
    (0..t.num_elements())
        .map(|i| {
            let off = t.offset_of(&crate::host::unravel(i, &t.shape));
            assert!(!is_poison(t, off), "element {i} not written");
            t.read_f64(off)
        })
        .collect()
}

/// A 1-D map kernel: `out[i] = body(x[i])` over tiles of `block`, grid = cdiv(n, block).
pub(super) fn map1(
    din: DType,
    dout: DType,
    block: u32,
    body: impl FnOnce(&mut Kb, &mut Block, ValueId) -> ValueId,
) -> Function {
    let mut k = Kb::new();
    let x = k.t(din, 1);
    let o = k.t(dout, 1);
    let mut b = Block::default();
    let i = k.pid(&mut b, 0);
    let v = k.load(
        &mut b,
        x,
        vec![i],
        din,
        &[block],
        f(0.0, din).cast_like(din),
    );
    let r = body(&mut k, &mut b, v);
    k.store(&mut b, o, vec![i], r);
    k.finish(b)
}

/// A 1-D binary kernel: `out[i] = body(x[i], y[i])`.
pub(super) fn map2(
    din: DType,
    dout: DType,
    block: u32,
    body: impl FnOnce(&mut Kb, &mut Block, ValueId, ValueId) -> ValueId,
) -> Function {
    let mut k = Kb::new();
    let x = k.t(din, 1);
    let y = k.t(din, 1);
    let o = k.t(dout, 1);
    let mut b = Block::default();
    let i = k.pid(&mut b, 0);
    let pad = f(0.0, din).cast_like(din);
    let v = k.load(&mut b, x, vec![i], din, &[block], pad);
    let w = k.load(&mut b, y, vec![i], din, &[block], pad);
    let r = body(&mut k, &mut b, v, w);
    k.store(&mut b, o, vec![i], r);
    k.finish(b)
}

pub(super) trait CastLike {
    fn cast_like(self, d: DType) -> Scalar;
}
impl CastLike for Scalar {
    /// A zero/padding constant of dtype `d`.
    fn cast_like(self, d: DType) -> Scalar {
        crate::host::scalar_from_f64(d, self.to_f64())
    }
}

pub(super) fn cdiv(n: usize, b: u32) -> u32 {
    n.div_ceil(b as usize) as u32
}

/// Runs a map1 kernel on `xs` and returns the outputs.
pub(super) fn run_map1(
    func: &Function,
    din: DType,
    dout: DType,
    block: u32,
    xs: &[f64],
) -> Vec<f64> {
    let n = xs.len();
    let mut args = vec![tensor(din, &[n], xs), poisoned(dout, &[n])];
    run(func, [cdiv(n, block), 1, 1], &mut args).unwrap();
    written(&args[1])
}

pub(super) fn run_map2(
    func: &Function,
    din: DType,
    dout: DType,
    block: u32,
    xs: &[f64],
    ys: &[f64],
) -> Vec<f64> {
    let n = xs.len();
    let mut args = vec![
        tensor(din, &[n], xs),
        tensor(din, &[n], ys),
        poisoned(dout, &[n]),
    ];
    run(func, [cdiv(n, block), 1, 1], &mut args).unwrap();
    written(&args[2])
}

/// Deterministic pseudo-random values in [-scale, scale).
pub(super) fn rnd(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub(super) fn close(a: f64, b: f64, rel: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= rel * b.abs().max(1e-30)
}

// ------------------------------------------------------------------ element-wise

#[test]
fn vec_add_awkward_sizes() {
    for &block in &[1u32, 7, 1000, 1024] {
        let func = map2(DType::F32, DType::F32, block, |k, b, x, y| {
            k.bin(b, BinaryOp::Add, x, y)
        });
        for &n in &[1usize, 7, 1000, 4097] {
            let xs = rnd(n, 1, 10.0);
            let ys = rnd(n, 2, 10.0);
            let out = run_map2(&func, DType::F32, DType::F32, block, &xs, &ys);
            for i in 0..n {
                assert_eq!(
                    out[i],
                    (xs[i] as f32 + ys[i] as f32) as f64,
                    "n={n} block={block} i={i}"
                );
            }
        }
    }
}

#[test]
fn store_never_writes_past_the_view() {
    // The output storage is longer than its view: the tail must stay poisoned.
    let func = map2(DType::F32, DType::F32, 1024, |k, b, x, y| {
        k.bin(b, BinaryOp::Mul, x, y)
    });
    let n = 1000;
    let mut out = HostTensor::zeros(DType::F32, &[n + 37]);
    out.poison(poison_byte(DType::F32));
    out.shape = vec![n];
    let mut args = vec![
        tensor(DType::F32, &[n], &rnd(n, 3, 1.0)),
        tensor(DType::F32, &[n], &rnd(n, 4, 1.0)),
        ArgValue::Tensor(out),
    ];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let t = ht(&args[2]);
    assert!((0..n).all(|i| !is_poison(t, i)));
    assert!((n..n + 37).all(|i| is_poison(t, i)));
}

#[test]
fn half_arithmetic_rounds_after_each_op() {
    for d in [DType::F16, DType::BF16] {
        let func = map2(d, d, 7, |k, b, x, y| {
            let s = k.bin(b, BinaryOp::Add, x, y);
            k.bin(b, BinaryOp::Mul, s, y)
        });
        let xs = rnd(100, 5, 3.0);
        let ys = rnd(100, 6, 3.0);
        let out = run_map2(&func, d, d, 7, &xs, &ys);
        let r = |v: f32| crate::host::scalar_from_f64(d, v as f64).to_f64() as f32;
        for i in 0..100 {
            let (x, y) = (r(xs[i] as f32), r(ys[i] as f32));
            assert_eq!(out[i] as f32, r(r(x + y) * y), "{d} {i}");
        }
    }
}

#[test]
fn float_cast_round_to_nearest_even_on_ties() {
    let one = 1.0f64;
    // f16: ulp at 1 is 2^-10; 1 + 2^-11 is a tie → 1.0 (even); 1 + 3·2^-11 → 1 + 2^-9.
    let xs = [
        one + 2f64.powi(-11),
        one + 3.0 * 2f64.powi(-11),
        -(one + 2f64.powi(-11)),
        65520.0,
        65519.0,
    ];
    let func = map1(DType::F32, DType::F16, 8, |k, b, x| {
        k.cast(b, x, DType::F16)
    });
    let out = run_map1(&func, DType::F32, DType::F16, 8, &xs);
    assert_eq!(
        out,
        vec![1.0, one + 2f64.powi(-9), -1.0, f64::INFINITY, 65504.0]
    );
    // check the exact bit patterns
    let t = [0x3C00u16, 0x3C02, 0xBC00, 0x7C00, 0x7BFF];
    for (o, bits) in out.iter().zip(t) {
        assert_eq!(f16::from_f64(*o).to_bits(), bits);
    }
    // bf16: ulp at 1 is 2^-7.
    let xs = [
        one + 2f64.powi(-8),
        one + 3.0 * 2f64.powi(-8),
        one + 2f64.powi(-8) + 2f64.powi(-20),
    ];
    let func = map1(DType::F32, DType::BF16, 8, |k, b, x| {
        k.cast(b, x, DType::BF16)
    });
    let out = run_map1(&func, DType::F32, DType::BF16, 8, &xs);
    assert_eq!(out, vec![1.0, one + 2f64.powi(-6), one + 2f64.powi(-7)]);
    assert_eq!(bf16::from_f64(out[1]).to_bits(), 0x3F82);
}

#[test]
fn casts_float_to_int_saturate_and_truncate() {
    let xs = [
        3e9,
        -3e9,
        f64::NAN,
        -1.5,
        1.9,
        -0.5,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];
    let to_i32 = map1(DType::F32, DType::I32, 8, |k, b, x| {
        k.cast(b, x, DType::I32)
    });
    let out = run_map1(&to_i32, DType::F32, DType::I32, 8, &xs);
    assert_eq!(
        out,
        vec![
            i32::MAX as f64,
            i32::MIN as f64,
            0.0,
            -1.0,
            1.0,
            0.0,
            i32::MAX as f64,
            i32::MIN as f64
        ]
    );
    let to_u32 = map1(DType::F32, DType::U32, 8, |k, b, x| {
        k.cast(b, x, DType::U32)
    });
    let out = run_map1(&to_u32, DType::F32, DType::U32, 8, &xs);
    assert_eq!(
        out,
        vec![3e9, 0.0, 0.0, 0.0, 1.0, 0.0, u32::MAX as f64, 0.0]
    );
    let to_bool = map1(DType::F32, DType::Bool, 8, |k, b, x| {
        k.cast(b, x, DType::Bool)
    });
    let out = run_map1(
        &to_bool,
        DType::F32,
        DType::Bool,
        8,
        &[0.0, -0.0, 2.0, f64::NAN, 0.5],
    );
    assert_eq!(out, vec![0.0, 0.0, 1.0, 1.0, 1.0]);
}

#[test]
fn casts_between_integers_wrap() {
    let xs = [(1i64 << 32) as f64 + 5.0, -1.0, (1i64 << 31) as f64, 0.0];
    let func = map1(DType::I64, DType::I32, 4, |k, b, x| {
        k.cast(b, x, DType::I32)
    });
    assert_eq!(
        run_map1(&func, DType::I64, DType::I32, 4, &xs),
        vec![5.0, -1.0, i32::MIN as f64, 0.0]
    );
    let func = map1(DType::I32, DType::U32, 4, |k, b, x| {
        k.cast(b, x, DType::U32)
    });
    assert_eq!(
        run_map1(&func, DType::I32, DType::U32, 4, &[-1.0, 7.0]),
        vec![u32::MAX as f64, 7.0]
    );
    let func = map1(DType::U32, DType::I64, 4, |k, b, x| {
        k.cast(b, x, DType::I64)
    });
    assert_eq!(
        run_map1(&func, DType::U32, DType::I64, 4, &[u32::MAX as f64]),
        vec![u32::MAX as f64]
    );
    let func = map1(DType::Bool, DType::F32, 4, |k, b, x| {
        k.cast(b, x, DType::F32)
    });
    assert_eq!(
        run_map1(&func, DType::Bool, DType::F32, 4, &[1.0, 0.0]),
        vec![1.0, 0.0]
    );
    let func = map1(DType::I32, DType::Bool, 4, |k, b, x| {
        k.cast(b, x, DType::Bool)
    });
    assert_eq!(
        run_map1(&func, DType::I32, DType::Bool, 4, &[-3.0, 0.0]),
        vec![1.0, 0.0]
    );
}

#[test]
fn int_to_float_rounds_once() {
    // 2^60 + 2^52 + 1 lies just above a bf16 tie: a single rounding goes up; rounding
    // through f64 first would land on the tie and go down to 2^60.
    let v: i64 = (1 << 60) + (1 << 52) + 1;
    let k = Kb::new();
    let mut k2 = k;
    let o = k2.t(DType::BF16, 1);
    let mut b = Block::default();
    let c = k2.op(&mut b, Op::Const(int(v, DType::I64)), st(DType::I64));
    let s = k2.op(&mut b, Op::Splat(c), tt(DType::I64, &[1]));
    let r = k2.cast(&mut b, s, DType::BF16);
    let z = k2.i32c(&mut b, 0);
    k2.store(&mut b, o, vec![z], r);
    let func = k2.finish(b);
    let mut args = vec![poisoned(DType::BF16, &[1])];
    run(&func, [1, 1, 1], &mut args).unwrap();
    assert_eq!(written(&args[0])[0], ((1i64 << 60) + (1i64 << 53)) as f64);
    // i32 → f16 / f32 round to nearest even.
    let func = map1(DType::I32, DType::F16, 4, |k, b, x| {
        k.cast(b, x, DType::F16)
    });
    assert_eq!(
        run_map1(&func, DType::I32, DType::F16, 4, &[2049.0, 2051.0, 70000.0]),
        vec![2048.0, 2052.0, f64::INFINITY]
    );
    let func = map1(DType::I32, DType::F32, 4, |k, b, x| {
        k.cast(b, x, DType::F32)
    });
    assert_eq!(
        run_map1(&func, DType::I32, DType::F32, 4, &[16777217.0]),
        vec![16777216.0]
    );
}

#[test]
fn integer_wraparound_division_and_remainder() {
    let d = DType::I32;
    let xs = [i32::MAX as f64, i32::MIN as f64, 7.0, -7.0, 7.0, -7.0, 5.0];
    let ys = [1.0, -1.0, -2.0, 2.0, 0.0, 0.0, 3.0];
    let add = map2(d, d, 7, |k, b, x, y| k.bin(b, BinaryOp::Add, x, y));
    assert_eq!(
        run_map2(&add, d, d, 7, &xs, &ys)[..2],
        [i32::MIN as f64, i32::MAX as f64]
    );
    let div = map2(d, d, 7, |k, b, x, y| k.bin(b, BinaryOp::Div, x, y));
    assert_eq!(
        run_map2(&div, d, d, 7, &xs, &ys),
        vec![
            i32::MAX as f64,
            i32::MIN as f64,
            -3.0,
            -3.0,
            -1.0,
            -1.0,
            1.0
        ]
    );
    let rem = map2(d, d, 7, |k, b, x, y| k.bin(b, BinaryOp::Rem, x, y));
    assert_eq!(
        run_map2(&rem, d, d, 7, &xs, &ys),
        vec![0.0, 0.0, 1.0, -1.0, 7.0, -7.0, 2.0]
    );
    let mul = map2(d, d, 7, |k, b, x, y| k.bin(b, BinaryOp::Mul, x, y));
    assert_eq!(run_map2(&mul, d, d, 7, &[65536.0], &[65536.0]), vec![0.0]);
    let neg = map1(d, d, 2, |k, b, x| k.un(b, UnaryOp::Neg, x));
    assert_eq!(
        run_map1(&neg, d, d, 2, &[i32::MIN as f64, 3.0]),
        vec![i32::MIN as f64, -3.0]
    );
    let abs = map1(d, d, 2, |k, b, x| k.un(b, UnaryOp::Abs, x));
    assert_eq!(
        run_map1(&abs, d, d, 2, &[i32::MIN as f64, -3.0]),
        vec![i32::MIN as f64, 3.0]
    );
    let not = map1(d, d, 2, |k, b, x| k.un(b, UnaryOp::Not, x));
    assert_eq!(run_map1(&not, d, d, 2, &[0.0, 5.0]), vec![-1.0, -6.0]);
    // u32: division by zero gives all ones; compares are unsigned.
    let u = DType::U32;
    let udiv = map2(u, u, 3, |k, b, x, y| k.bin(b, BinaryOp::Div, x, y));
    assert_eq!(
        run_map2(&udiv, u, u, 3, &[5.0, 4e9], &[0.0, 2.0]),
        vec![u32::MAX as f64, 2e9]
    );
    let ugt = map2(u, DType::Bool, 3, |k, b, x, y| {
        let ty = tt(DType::Bool, &[3]);
        k.op(b, Op::Compare(CmpOp::Gt, x, y), ty)
    });
    assert_eq!(
        run_map2(&ugt, u, DType::Bool, 3, &[2147483648.0, 1.0], &[1.0, 2.0]),
        vec![1.0, 0.0]
    );
    // i64 wraps too
    let l = DType::I64;
    let ladd = map2(l, l, 2, |k, b, x, y| k.bin(b, BinaryOp::Sub, x, y));
    assert_eq!(
        run_map2(&ladd, l, l, 2, &[i64::MIN as f64], &[1.0]),
        vec![i64::MAX as f64]
    );
}

#[test]
fn shifts_saturate_at_the_width() {
    let d = DType::I32;
    let xs = [1.0, 1.0, 1.0, -8.0, -8.0, -8.0, 8.0];
    let ys = [31.0, 32.0, -1.0, 1.0, 32.0, 100.0, 35.0];
    let shl = map2(d, d, 7, |k, b, x, y| k.bin(b, BinaryOp::Shl, x, y));
    assert_eq!(
        run_map2(&shl, d, d, 7, &xs, &ys),
        vec![i32::MIN as f64, 0.0, 0.0, -16.0, 0.0, 0.0, 0.0]
    );
    let shr = map2(d, d, 7, |k, b, x, y| k.bin(b, BinaryOp::Shr, x, y));
    assert_eq!(
        run_map2(&shr, d, d, 7, &xs, &ys),
        vec![0.0, 0.0, 0.0, -4.0, -1.0, -1.0, 0.0]
    );
    let u = DType::U32;
    let ushr = map2(u, u, 3, |k, b, x, y| k.bin(b, BinaryOp::Shr, x, y));
    assert_eq!(
        run_map2(
            &ushr,
            u,
            u,
            3,
            &[4294967288.0, 4294967288.0, 1.0],
            &[1.0, 32.0, 0.0]
        ),
        vec![2147483644.0, 0.0, 1.0]
    );
    let l = DType::I64;
    let lshl = map2(l, l, 3, |k, b, x, y| k.bin(b, BinaryOp::Shl, x, y));
    assert_eq!(
        run_map2(&lshl, l, l, 3, &[1.0, 1.0, 3.0], &[40.0, 64.0, 1.0]),
        vec![(1u64 << 40) as f64, 0.0, 6.0]
    );
    let band = map2(d, d, 3, |k, b, x, y| k.bin(b, BinaryOp::Xor, x, y));
    assert_eq!(
        run_map2(&band, d, d, 3, &[12.0, -1.0], &[10.0, 5.0]),
        vec![6.0, -6.0]
    );
}

#[test]
fn float_min_max_nan_and_signed_zero() {
    let n = f64::NAN;
    let xs = [n, 1.0, n, -0.0, 0.0, 2.0];
    let ys = [1.0, n, n, 0.0, -0.0, 3.0];
    let d = DType::F32;
    let min = map2(d, d, 6, |k, b, x, y| k.bin(b, BinaryOp::Min, x, y));
    let out = run_map2(&min, d, d, 6, &xs, &ys);
    assert_eq!(out[..2], [1.0, 1.0]);
    assert!(out[2].is_nan());
    assert!(out[3] == 0.0 && out[3].is_sign_negative() && out[4].is_sign_negative());
    assert_eq!(out[5], 2.0);
    let max = map2(d, d, 6, |k, b, x, y| k.bin(b, BinaryOp::Max, x, y));
    let out = run_map2(&max, d, d, 6, &xs, &ys);
    assert_eq!(out[..2], [1.0, 1.0]);
    assert!(out[2].is_nan());
    assert!(out[3].is_sign_positive() && out[4].is_sign_positive());
    assert_eq!(out[5], 3.0);
    // Comparisons are IEEE: only != holds with a NaN.
    for (op, want) in [
        (CmpOp::Eq, 0.0),
        (CmpOp::Ne, 1.0),
        (CmpOp::Lt, 0.0),
        (CmpOp::Ge, 0.0),
    ] {
        let c = map2(d, DType::Bool, 1, |k, b, x, y| {
            k.op(b, Op::Compare(op, x, y), tt(DType::Bool, &[1]))
        });
        assert_eq!(
            run_map2(&c, d, DType::Bool, 1, &[n], &[1.0]),
            vec![want],
            "{op:?}"
        );
    }
}

#[test]
fn transcendentals_match_f64() {
    let xs: Vec<f64> = rnd(1000, 7, 4.0);
    let pos: Vec<f64> = xs.iter().map(|x| x.abs() + 1e-3).collect();
    type F = fn(f64) -> f64;
    let cases: [(UnaryOp, F, bool); 14] = [
        (UnaryOp::Exp, f64::exp, false),
        (UnaryOp::Exp2, f64::exp2, false),
        (UnaryOp::Log, f64::ln, true),
        (UnaryOp::Log2, f64::log2, true),
        (UnaryOp::Sqrt, f64::sqrt, true),
        (UnaryOp::Rsqrt, |x| 1.0 / x.sqrt(), true),
        (UnaryOp::Tanh, f64::tanh, false),
        (UnaryOp::Sigmoid, |x| 1.0 / (1.0 + (-x).exp()), false),
        (UnaryOp::Sin, f64::sin, false),
        (UnaryOp::Cos, f64::cos, false),
        (UnaryOp::Floor, f64::floor, false),
        (UnaryOp::Ceil, f64::ceil, false),
        (UnaryOp::Abs, f64::abs, false),
        (UnaryOp::Neg, |x| -x, false),
    ];
    for (op, r, positive) in cases {
        let func = map1(DType::F32, DType::F32, 1000, |k, b, x| k.un(b, op, x));
        let input = if positive { &pos } else { &xs };
        let out = run_map1(&func, DType::F32, DType::F32, 1000, input);
        for (i, (&o, &x)) in out.iter().zip(input).enumerate() {
            let want = r(x as f32 as f64);
            assert!(
                close(o, want, 1e-6) || (o - want).abs() < 1e-6,
                "{op:?}({x}) = {o}, want {want} (i={i})"
            );
        }
    }
    // f16 exp rounds to f16
    let func = map1(DType::F16, DType::F16, 7, |k, b, x| {
        k.un(b, UnaryOp::Exp, x)
    });
    let out = run_map1(&func, DType::F16, DType::F16, 7, &[1.0, 0.5]);
    assert_eq!(
        out,
        vec![
            f16::from_f64(1f64.exp()).to_f64(),
            f16::from_f64(0.5f64.exp()).to_f64()
        ]
    );
    let pow = map2(DType::F32, DType::F32, 3, |k, b, x, y| {
        k.bin(b, BinaryOp::Pow, x, y)
    });
    assert_eq!(
        run_map2(
            &pow,
            DType::F32,
            DType::F32,
            3,
            &[2.0, 9.0, -8.0],
            &[10.0, 0.5, 2.0]
        ),
        vec![1024.0, 3.0, 64.0]
    );
    let rem = map2(DType::F32, DType::F32, 2, |k, b, x, y| {
        k.bin(b, BinaryOp::Rem, x, y)
    });
    assert_eq!(
        run_map2(&rem, DType::F32, DType::F32, 2, &[-7.5, 7.5], &[2.0, -2.0]),
        vec![-1.5, 1.5]
    );
    // fdiv divides correctly rounded here (the GPU's div.full.f32 is within 2 ulp of it).
    let fdiv = map2(DType::F32, DType::F32, 3, |k, b, x, y| {
        k.bin(b, BinaryOp::FDiv, x, y)
    });
    let (xs, ys) = ([1.0, -7.1, 3.0e30], [3.0, 0.3, 7.0e-9]);
    let want: Vec<f64> = xs
        .iter()
        .zip(&ys)
        .map(|(&x, &y)| (x as f32 / y as f32) as f64)
        .collect();
    assert_eq!(run_map2(&fdiv, DType::F32, DType::F32, 3, &xs, &ys), want);
}

#[test]
fn exponentials_flush_subnormal_results_to_zero() {
    // As the GPU's `ex2.approx.ftz`: results below 2^-126 are 0; normal ones are kept.
    let xs = [-100.0, -87.0, -0.0, 1.0];
    let exp = map1(DType::F32, DType::F32, 4, |k, b, x| {
        k.un(b, UnaryOp::Exp, x)
    });
    let out = run_map1(&exp, DType::F32, DType::F32, 4, &xs);
    assert_eq!(out[0], 0.0, "exp(-100) is subnormal in f32");
    assert!(
        out[1] > 0.0 && (out[1] as f32).is_normal(),
        "exp(-87) = {}",
        out[1]
    );
    assert_eq!(out[2], 1.0);
    let exp2 = map1(DType::F32, DType::F32, 3, |k, b, x| {
        k.un(b, UnaryOp::Exp2, x)
    });
    let out = run_map1(&exp2, DType::F32, DType::F32, 3, &[-127.0, -126.0, -149.0]);
    assert_eq!(out, vec![0.0, 2f64.powi(-126), 0.0]);
    let sig = map1(DType::F32, DType::F32, 2, |k, b, x| {
        k.un(b, UnaryOp::Sigmoid, x)
    });
    let out = run_map1(&sig, DType::F32, DType::F32, 2, &[-100.0, -80.0]);
    assert_eq!(out[0], 0.0);
    assert!((out[1] as f32).is_normal());
}

#[test]
fn fma_rounds_once_and_select() {
    // (1+2^-12)^2 = 1 + 2^-11 + 2^-24: the product alone rounds away 2^-24.
    let a = 1.0 + 2f64.powi(-12);
    let d = DType::F32;
    let mut k = Kb::new();
    let (x, o) = (k.t(d, 1), k.t(d, 1));
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    let v = k.load(&mut b, x, vec![z], d, &[3], f(0.0, d));
    let c = k.op(
        &mut b,
        Op::Const(f(-(1.0 + 2f64.powi(-11)), d)),
        tt(d, &[3]),
    );
    let r = k.op(&mut b, Op::Fma(v, v, c), tt(d, &[3]));
    let p = k.bin(&mut b, BinaryOp::Mul, v, v);
    let q = k.bin(&mut b, BinaryOp::Add, p, c);
    // where(x > 1.5, fma, mul+add), then where(true scalar, that, x)
    let thr = k.op(&mut b, Op::Const(f(1.5, d)), tt(d, &[3]));
    let m = k.op(
        &mut b,
        Op::Compare(CmpOp::Lt, v, thr),
        tt(DType::Bool, &[3]),
    );
    let s = k.op(&mut b, Op::Select(m, r, q), tt(d, &[3]));
    let t = k.op(&mut b, Op::Const(Scalar::Bool(true)), st(DType::Bool));
    let s2 = k.op(&mut b, Op::Select(t, s, v), tt(d, &[3]));
    k.store(&mut b, o, vec![z], s2);
    let func = k.finish(b);
    let mut args = vec![tensor(d, &[3], &[a, 2.0, a]), poisoned(d, &[3])];
    run(&func, [1, 1, 1], &mut args).unwrap();
    let out = written(&args[1]);
    assert_eq!(out[0], 2f64.powi(-24));
    assert_eq!(out[1], (4.0 - (1.0 + 2f64.powi(-11))) as f32 as f64);
}

#[test]
fn fma_f32_is_exactly_fused() {
    use super::eval::fma_f32;
    let xs = rnd(30000, 41, 3.0);
    for c in xs.chunks(3) {
        let (p, q, r) = (c[0] as f32, c[1] as f32, c[2] as f32);
        assert_eq!(
            fma_f32(p, q, r).to_bits(),
            p.mul_add(q, r).to_bits(),
            "{p} {q} {r}"
        );
        // cancellation-heavy: r ≈ -p*q
        let r2 = -(p * q);
        assert_eq!(fma_f32(p, q, r2).to_bits(), p.mul_add(q, r2).to_bits());
    }
    // ties at the f32 level and special values
    let t = 1.0 + 2f32.powi(-12);
    let cases = [
        (t, t, 0.0),
        (t, t, 2f32.powi(-60)),
        (t, t, -2f32.powi(-60)),
        (1e-30, 1e-30, 1e-45),
        (f32::MAX, 2.0, -f32::MAX),
        (f32::INFINITY, 0.0, 1.0),
        (f32::NAN, 1.0, 1.0),
        (-0.0, 1.0, 0.0),
        (-0.0, 1.0, -0.0),
    ];
    for (p, q, r) in cases {
        let (a, b) = (fma_f32(p, q, r), p.mul_add(q, r));
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "{p} {q} {r}: {a} vs {b}"
        );
    }
}

#[test]
fn integer_fma_and_bool_min_max() {
    let d = DType::I32;
    let mut k = Kb::new();
    let (x, o) = (k.t(d, 1), k.t(d, 1));
    let bo = k.t(DType::Bool, 1);
    let mut b = Block::default();
    let z = k.i32c(&mut b, 0);
    let v = k.load(&mut b, x, vec![z], d, &[3], int(0, d));
    let r = k.op(&mut b, Op::Fma(v, v, v), tt(d, &[3]));
    k.store(&mut b, o, vec![z], r);
    let zt = z_tile(&mut k, &mut b);
    let m = k.op(&mut b, Op::Compare(CmpOp::Gt, v, zt), tt(DType::Bool, &[3]));
    let t = k.op(&mut b, Op::Const(Scalar::Bool(true)), tt(DType::Bool, &[3]));
    let mn = k.bin(&mut b, BinaryOp::Min, m, t);
    let f0 = k.op(
        &mut b,
        Op::Const(Scalar::Bool(false)),
        tt(DType::Bool, &[3]),
    );
    let mx = k.bin(&mut b, BinaryOp::Max, mn, f0);
    k.store(&mut b, bo, vec![z], mx);
    let func = k.finish(b);
    let mut args = vec![
        tensor(d, &[3], &[3.0, -2.0, 65536.0]),
        poisoned(d, &[3]),
        poisoned(DType::Bool, &[3]),
    ];
    run(&func, [1, 1, 1], &mut args).unwrap();
    assert_eq!(written(&args[1]), vec![12.0, 2.0, 65536.0]);
    assert_eq!(written(&args[2]), vec![1.0, 0.0, 1.0]);
}

fn z_tile(k: &mut Kb, b: &mut Block) -> ValueId {
    k.op(b, Op::Const(int(0, DType::I32)), tt(DType::I32, &[3]))
}

#[test]
fn i32_to_bf16_rounds_once() {
    // 2^25 + 2^17 + 1 is just above a bf16 tie; through f32 it would become the tie.
    let func = map1(DType::I32, DType::BF16, 2, |k, b, x| {
        k.cast(b, x, DType::BF16)
    });
    let v = (1u64 << 25) as f64 + (1u64 << 17) as f64 + 1.0;
    let want = (1u64 << 25) as f64 + (1u64 << 18) as f64;
    assert_eq!(
        run_map1(&func, DType::I32, DType::BF16, 2, &[v, -v]),
        vec![want, -want]
    );
}
