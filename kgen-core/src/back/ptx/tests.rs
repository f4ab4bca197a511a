//! Back-end tests: IR built by hand (the front end is developed in parallel), lowered
//! for sm_80 and sm_90a, and assembled by the real `ptxas` with zero spills and zero
//! stack. Tests skip the ptxas step (with a note) when the binary is absent.

use super::write;
use crate::abi::Specialization;
use crate::diag::ErrorCode;
use crate::ir::{
    BinaryOp, Block, CmpOp, Function, Inst, Op, Param, ParamKind, ReduceOp, TensorParam, UnaryOp,
    ValueId,
};
use crate::span::Span;
use crate::target::Arch;
use crate::types::{DType, Scalar, Shape, ValueType};
use crate::valid::ModuleInfo;
use std::path::PathBuf;

/// A small IR builder for tests.
pub struct Kb {
    pub f: Function,
    stack: Vec<Block>,
}

fn tile(dt: DType, s: &[u32]) -> ValueType {
    ValueType::Tile(dt, Shape(s.to_vec()))
}

impl Kb {
    pub fn new(name: &str) -> Kb {
        Kb {
            f: Function::new(name, name),
            stack: vec![Block::default()],
        }
    }

    pub fn tensor(
        &mut self,
        name: &str,
        dt: DType,
        dims: Vec<Option<u32>>,
        contiguous: bool,
        align: u32,
    ) -> u32 {
        self.f.params.push(Param {
            name: name.into(),
            kind: ParamKind::Tensor(TensorParam {
                dtype: dt,
                dims,
                contiguous,
                align_bytes: align,
            }),
        });
        self.f.params.len() as u32 - 1
    }

    pub fn scalar_param(&mut self, name: &str, dt: DType) -> ValueId {
        self.f.params.push(Param {
            name: name.into(),
            kind: ParamKind::Scalar(dt),
        });
        let i = self.f.params.len() as u32 - 1;
        self.op(Op::ScalarParam(i), ValueType::Scalar(dt))
    }

    fn push(&mut self, op: Op, tys: Vec<ValueType>) -> Vec<ValueId> {
        let results: Vec<ValueId> = tys
            .into_iter()
            .map(|ty| self.f.values.append(crate::ir::Value { ty, name: None }))
            .collect();
        let id = self.f.insts.append(Inst {
            op,
            results: results.clone(),
            span: Span::new(1, 2),
        });
        self.stack.last_mut().expect("block").insts.push(id);
        results
    }

    pub fn op(&mut self, op: Op, ty: ValueType) -> ValueId {
        self.push(op, vec![ty])[0]
    }

    pub fn effect(&mut self, op: Op) {
        self.push(op, vec![]);
    }

    pub fn ty(&self, v: ValueId) -> ValueType {
        self.f.value_type(v).clone()
    }

    pub fn i32c(&mut self, v: i64) -> ValueId {
        self.op(
            Op::Const(Scalar::Int(v, DType::I32)),
            ValueType::Scalar(DType::I32),
        )
    }

    pub fn fconst(&mut self, v: f64, dt: DType, shape: &[u32]) -> ValueId {
        let ty = if shape.is_empty() {
            ValueType::Scalar(dt)
        } else {
            tile(dt, shape)
        };
        self.op(Op::Const(Scalar::Float(v, dt)), ty)
    }

    pub fn bid(&mut self, a: u8) -> ValueId {
        self.op(Op::ProgramId(a), ValueType::Scalar(DType::I32))
    }

    pub fn load(&mut self, t: u32, index: Vec<ValueId>, shape: &[u32], pad: Scalar) -> ValueId {
        let dt = self.f.tensor_param(t).expect("tensor").dtype;
        self.op(
            Op::Load {
                tensor: t,
                index,
                padding: pad,
                eviction: Default::default(),
            },
            tile(dt, shape),
        )
    }

    pub fn store(&mut self, t: u32, index: Vec<ValueId>, value: ValueId) {
        self.effect(Op::Store {
            tensor: t,
            index,
            value,
            eviction: Default::default(),
        });
    }

    pub fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        let ty = self.ty(a);
        self.op(Op::Binary(op, a, b), ty)
    }

    pub fn un(&mut self, op: UnaryOp, a: ValueId) -> ValueId {
        let ty = self.ty(a);
        self.op(Op::Unary(op, a), ty)
    }

    pub fn cast(&mut self, a: ValueId, dt: DType) -> ValueId {
        let ty = self.ty(a).with_dtype(dt);
        self.op(Op::Cast(a), ty)
    }

    pub fn splat(&mut self, s: ValueId, shape: &[u32]) -> ValueId {
        let dt = self.ty(s).dtype();
        self.op(Op::Splat(s), tile(dt, shape))
    }

    pub fn reduce(&mut self, op: ReduceOp, v: ValueId, axis: u8) -> ValueId {
        let ty = self.ty(v);
        let mut s = crate::ir::shape_of(&ty).to_vec();
        s.remove(axis as usize);
        let dt = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
            DType::I32
        } else {
            ty.dtype()
        };
        let rty = if s.is_empty() {
            ValueType::Scalar(dt)
        } else {
            tile(dt, &s)
        };
        self.op(Op::Reduce { op, value: v, axis }, rty)
    }

    pub fn reshape(&mut self, v: ValueId, shape: &[u32]) -> ValueId {
        let dt = self.ty(v).dtype();
        self.op(Op::Reshape(v), tile(dt, shape))
    }

    pub fn expand(&mut self, v: ValueId, axis: u8) -> ValueId {
        let ty = self.ty(v);
        let mut s = crate::ir::shape_of(&ty).to_vec();
        s.insert(axis as usize, 1);
        self.op(Op::ExpandDims(v, axis), tile(ty.dtype(), &s))
    }

    pub fn broadcast(&mut self, v: ValueId, shape: &[u32]) -> ValueId {
        let dt = self.ty(v).dtype();
        self.op(Op::Broadcast(v), tile(dt, shape))
    }

    pub fn arange(&mut self, start: i64, end: i64) -> ValueId {
        self.op(
            Op::Arange { start, end },
            tile(DType::I32, &[(end - start) as u32]),
        )
    }

    pub fn cmp(&mut self, op: CmpOp, a: ValueId, b: ValueId) -> ValueId {
        let ty = self.ty(a).with_dtype(DType::Bool);
        self.op(Op::Compare(op, a, b), ty)
    }

    /// `for iv in lo..hi step 1` with carried values; `body` gets (kb, iv, carried) and
    /// returns the yielded values.
    pub fn for_loop(
        &mut self,
        lo: ValueId,
        hi: ValueId,
        inits: Vec<ValueId>,
        body: impl FnOnce(&mut Kb, ValueId, Vec<ValueId>) -> Vec<ValueId>,
    ) -> Vec<ValueId> {
        let step = self.i32c(1);
        let iv = self.f.values.append(crate::ir::Value {
            ty: ValueType::Scalar(DType::I32),
            name: Some("k".into()),
        });
        let tys: Vec<ValueType> = inits.iter().map(|&v| self.ty(v)).collect();
        let args: Vec<ValueId> = tys
            .iter()
            .map(|t| {
                self.f.values.append(crate::ir::Value {
                    ty: t.clone(),
                    name: None,
                })
            })
            .collect();
        self.stack.push(Block {
            args: std::iter::once(iv).chain(args.iter().copied()).collect(),
            insts: vec![],
        });
        let ys = body(self, iv, args);
        self.effect(Op::Yield(ys));
        let b = self.stack.pop().expect("block");
        self.push(
            Op::For {
                lower: lo,
                upper: hi,
                step,
                inits,
                body: b,
            },
            tys,
        )
    }

    pub fn if_else(
        &mut self,
        cond: ValueId,
        tys: Vec<ValueType>,
        then_b: impl FnOnce(&mut Kb) -> Vec<ValueId>,
        else_b: impl FnOnce(&mut Kb) -> Vec<ValueId>,
    ) -> Vec<ValueId> {
        self.stack.push(Block::default());
        let y = then_b(self);
        self.effect(Op::Yield(y));
        let t = self.stack.pop().expect("block");
        self.stack.push(Block::default());
        let y = else_b(self);
        self.effect(Op::Yield(y));
        let e = self.stack.pop().expect("block");
        self.push(
            Op::If {
                cond,
                then_body: t,
                else_body: e,
            },
            tys,
        )
    }

    pub fn finish(mut self) -> Function {
        self.f.body = self.stack.pop().expect("block");
        self.f
    }
}

pub fn spec(name: &str, warps: u32) -> Specialization {
    Specialization {
        kernel: name.into(),
        consts: vec![],
        num_warps: warps,
        min_blocks_per_sm: None,
        num_stages: None,
        tensor_align: vec![],
        no_tma: false,
        ws: false,
        tma_store: false,
        multicast: false,
        pingpong: false,
    }
}

fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KGEN_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/cuda/bin/ptxas");
    p.exists().then_some(p)
}

/// Assembles with ptxas and checks zero spills / zero stack. Returns the -v report.
pub fn assemble(ptx: &str, arch: &str, name: &str) -> Option<String> {
    let Some(ptxas) = ptxas() else {
        eprintln!("note: ptxas not found; skipping assembly of {name} for {arch}");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("kgen-back-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // Unique per call: tests run in parallel and several name their kernel `k`.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("{name}_{n}");
    let file = dir.join(format!("{name}_{arch}.ptx"));
    std::fs::write(&file, ptx).expect("write ptx");
    let out = std::process::Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&file)
        .arg("-o")
        .arg(dir.join(format!("{name}_{arch}.cubin")))
        .output()
        .expect("run ptxas");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "ptxas rejected {name} for {arch}:\n{text}\n--- PTX ---\n{ptx}"
    );
    assert!(
        text.contains("0 bytes stack frame"),
        "{name} {arch}: stack frame\n{text}"
    );
    assert!(
        text.contains("0 bytes spill stores"),
        "{name} {arch}: spill stores\n{text}"
    );
    assert!(
        text.contains("0 bytes spill loads"),
        "{name} {arch}: spill loads\n{text}"
    );
    Some(text)
}

/// Compiles `f` for both targets, assembles both, returns the sm_90a PTX.
pub fn compile_both(f: &Function, warps: u32) -> String {
    let mut last = String::new();
    for arch in Arch::ALL {
        let k = write(
            f,
            &ModuleInfo::default(),
            &arch.target(),
            &spec(&f.name, warps),
        )
        .unwrap_or_else(|d| panic!("{} {arch}: {d}", f.name));
        assert!(k.ptx.contains(&format!(".target {}", arch.name())));
        assemble(&k.ptx, arch.name(), &f.name);
        if let Some(dir) = std::env::var_os("KGEN_DUMP_PTX") {
            let path = PathBuf::from(dir).join(format!("{}_{}.ptx", f.name, arch.name()));
            std::fs::write(path, &k.ptx).expect("dump ptx");
        }
        last = k.ptx;
    }
    last
}

fn f32t(n: usize) -> Vec<Option<u32>> {
    vec![None; n]
}

#[test]
fn vec_add_f32_uses_v4() {
    let mut k = Kb::new("vec_add");
    let x = k.tensor("x", DType::F32, f32t(1), true, 16);
    let y = k.tensor("y", DType::F32, f32t(1), true, 16);
    let o = k.tensor("out", DType::F32, f32t(1), true, 16);
    let i = k.bid(0);
    let a = k.load(x, vec![i], &[1024], Scalar::Float(0.0, DType::F32));
    let b = k.load(y, vec![i], &[1024], Scalar::Float(0.0, DType::F32));
    let s = k.bin(BinaryOp::Add, a, b);
    k.store(o, vec![i], s);
    let f = k.finish();
    let ptx = compile_both(&f, 4);
    assert!(ptx.contains("ld.global.v4.b32"), "{ptx}");
    assert!(ptx.contains("st.global.v4.b32"), "{ptx}");
    assert!(ptx.contains("add.rn.f32"));
    assert!(ptx.contains("mul.wide.s32") || ptx.contains("cvt.s64.s32"));
    let k = write(
        &f,
        &ModuleInfo::default(),
        &Arch::Sm80.target(),
        &spec("vec_add", 4),
    )
    .expect("compile");
    assert_eq!(k.abi.params.len(), 6);
    assert_eq!(k.launch.threads_per_block, 128);
    assert_eq!(k.launch.grid_rank, 1);
}

#[test]
fn half_dtypes_and_alignment_fallbacks() {
    for (dt, align, want) in [
        (DType::BF16, 16, "ld.global.v4.b32"),
        (DType::F16, 4, "ld.global.b32"),
        (DType::F32, 8, "ld.global.v2.b32"),
        (DType::F32, 4, "ld.global.b32"),
        (DType::BF16, 2, "ld.global.b16"),
        (DType::I64, 16, "ld.global.v2.b64"),
        (DType::Bool, 16, "ld.global.v4.b32"),
        (DType::Bool, 1, "ld.global.u8"),
    ] {
        let name = format!("copy_{}_{align}", dt.name());
        let mut k = Kb::new(&name);
        let x = k.tensor("x", dt, f32t(1), true, align);
        let o = k.tensor("out", dt, f32t(1), true, align);
        let i = k.bid(0);
        let pad = match dt {
            DType::Bool => Scalar::Bool(false),
            DType::I64 => Scalar::Int(0, dt),
            _ => Scalar::Float(1.5, dt),
        };
        let a = k.load(x, vec![i], &[512], pad);
        let a = if dt.is_float() {
            let c = k.fconst(2.0, dt, &[512]);
            k.bin(BinaryOp::Mul, a, c)
        } else {
            a
        };
        k.store(o, vec![i], a);
        let f = k.finish();
        let ptx = compile_both(&f, 4);
        assert!(ptx.contains(want), "{name}: expected {want}\n{ptx}");
    }
}

/// Row softmax over column tiles: online max/sum in a runtime loop, then a second loop
/// that writes. Exercises For with carried scalars, reductions to scalars, shuffles
/// and the cross-warp pass.
#[test]
fn row_softmax_with_runtime_loop() {
    let mut k = Kb::new("softmax");
    let x = k.tensor("x", DType::BF16, f32t(2), true, 16);
    let y = k.tensor("y", DType::BF16, f32t(2), true, 16);
    let row = k.bid(0);
    let cols = k.op(
        Op::TensorDim { tensor: x, dim: 1 },
        ValueType::Scalar(DType::I32),
    );
    let bs = k.i32c(512);
    let bm1 = k.i32c(511);
    let t = k.bin(BinaryOp::Add, cols, bm1);
    let nt = k.bin(BinaryOp::Div, t, bs);
    let zero = k.i32c(0);
    let ninf = k.fconst(f64::NEG_INFINITY, DType::F32, &[]);
    let fz = k.fconst(0.0, DType::F32, &[]);
    let ms = k.for_loop(zero, nt, vec![ninf, fz], |k, kk, c| {
        let xt = k.load(
            x,
            vec![row, kk],
            &[1, 512],
            Scalar::Float(f64::NEG_INFINITY, DType::BF16),
        );
        let xt = k.reshape(xt, &[512]);
        let xt = k.cast(xt, DType::F32);
        let mx = k.reduce(ReduceOp::Max, xt, 0);
        let mn = k.bin(BinaryOp::Max, c[0], mx);
        let d = k.bin(BinaryOp::Sub, c[0], mn);
        let sc = k.un(UnaryOp::Exp, d);
        let s1 = k.bin(BinaryOp::Mul, c[1], sc);
        let mns = k.splat(mn, &[512]);
        let e = k.bin(BinaryOp::Sub, xt, mns);
        let e = k.un(UnaryOp::Exp, e);
        let se = k.reduce(ReduceOp::Sum, e, 0);
        let s2 = k.bin(BinaryOp::Add, s1, se);
        vec![mn, s2]
    });
    let one = k.fconst(1.0, DType::F32, &[]);
    let inv = k.bin(BinaryOp::Div, one, ms[1]);
    k.for_loop(zero, nt, vec![], |k, kk, _| {
        let xt = k.load(
            x,
            vec![row, kk],
            &[1, 512],
            Scalar::Float(f64::NEG_INFINITY, DType::BF16),
        );
        let xt = k.reshape(xt, &[512]);
        let xt = k.cast(xt, DType::F32);
        let m = k.splat(ms[0], &[512]);
        let e = k.bin(BinaryOp::Sub, xt, m);
        let e = k.un(UnaryOp::Exp, e);
        let iv = k.splat(inv, &[512]);
        let r = k.bin(BinaryOp::Mul, e, iv);
        let r = k.reshape(r, &[1, 512]);
        let r = k.cast(r, DType::BF16);
        k.store(y, vec![row, kk], r);
        vec![]
    });
    let f = k.finish();
    let ptx = compile_both(&f, 4);
    assert!(ptx.contains("shfl.sync.bfly.b32"), "{ptx}");
    assert!(ptx.contains("ld.global.v4.b32"), "{ptx}");
    assert!(ptx.contains("st.global.v4.b32"), "{ptx}");
    assert!(ptx.contains("ex2.approx.ftz.f32"));
    assert!(ptx.contains("cvt.rn.bf16x2.f32"));
    assert!(ptx.contains("bra.uni"));
    // Only the exponential flushes subnormals; arithmetic never does.
    let ftz_lines: Vec<&str> = ptx.lines().filter(|l| l.contains(".ftz")).collect();
    assert!(
        ftz_lines.iter().all(|l| l.contains("ex2.approx.ftz.f32")),
        "{ftz_lines:?}"
    );
}

/// A 2-D tile with non-power-of-two extents, reduced along each axis and stored.
#[test]
fn non_pow2_2d_tiles_and_axis_reductions() {
    let mut k = Kb::new("tile2d");
    let x = k.tensor("x", DType::F32, vec![None, None], true, 16);
    let y = k.tensor("y", DType::F32, vec![None, Some(100)], false, 4);
    let r0 = k.tensor("r0", DType::F32, f32t(1), true, 4);
    let r1 = k.tensor("r1", DType::F32, f32t(1), true, 4);
    let a1 = k.tensor("a1", DType::I32, f32t(1), true, 4);
    let i = k.bid(0);
    let j = k.bid(1);
    let t = k.load(x, vec![i, j], &[6, 100], Scalar::Float(0.0, DType::F32));
    let t2 = k.bin(BinaryOp::Mul, t, t);
    k.store(y, vec![i, j], t2);
    let s0 = k.reduce(ReduceOp::Sum, t, 0);
    k.store(r0, vec![j], s0);
    let m1 = k.reduce(ReduceOp::Max, t, 1);
    k.store(r1, vec![i], m1);
    let am = k.reduce(ReduceOp::ArgMax, t, 1);
    k.store(a1, vec![i], am);
    // Broadcast the row max back: t - max(t, 1)[:, None].
    let e = k.expand(m1, 1);
    let b = k.broadcast(e, &[6, 100]);
    let d = k.bin(BinaryOp::Sub, t, b);
    k.store(y, vec![j, i], d);
    let f = k.finish();
    let ptx = compile_both(&f, 4);
    assert!(ptx.contains("shfl.sync.bfly.b32"));
    assert!(ptx.contains("setp.lt.u32"));
}

#[test]
fn casts_between_all_dtypes() {
    let mut k = Kb::new("casts");
    let mut ts = Vec::new();
    for dt in DType::ALL {
        ts.push(k.tensor(&format!("t_{}", dt.name()), dt, f32t(1), true, 16));
    }
    let i = k.bid(0);
    let src = k.load(ts[6], vec![i], &[256], Scalar::Float(0.0, DType::F32));
    for (n, dt) in DType::ALL.iter().enumerate() {
        let c = k.cast(src, *dt);
        let back = k.cast(c, DType::F32);
        let c2 = k.cast(back, *dt);
        k.store(ts[n], vec![i], c2);
    }
    let f = k.finish();
    let ptx = compile_both(&f, 2);
    assert!(ptx.contains("cvt.rzi.s32.f32"));
    assert!(ptx.contains("cvt.rn.f16.f32") || ptx.contains("cvt.rn.f16x2.f32"));
}

#[test]
fn gather_scatter_atomic_add() {
    let mut k = Kb::new("gsa");
    let src = k.tensor("src", DType::F32, vec![None, None], false, 4);
    let idx = k.tensor("idx", DType::I32, f32t(1), true, 16);
    let dst = k.tensor("dst", DType::F32, f32t(1), true, 4);
    let hist = k.tensor("hist", DType::I32, f32t(1), true, 4);
    let acc = k.tensor("acc", DType::F32, f32t(1), true, 4);
    let i = k.bid(0);
    let ix = k.load(idx, vec![i], &[200], Scalar::Int(0, DType::I32));
    let ar = k.arange(0, 200);
    let lim = k.i32c(150);
    let lims = k.splat(lim, &[200]);
    let m = k.cmp(CmpOp::Lt, ar, lims);
    let g = k.op(
        Op::Gather {
            tensor: src,
            offsets: vec![ix, ar],
            mask: Some(m),
            other: Scalar::Float(-1.0, DType::F32),
            eviction: Default::default(),
        },
        tile(DType::F32, &[200]),
    );
    k.effect(Op::Scatter {
        tensor: dst,
        offsets: vec![ix],
        value: g,
        mask: None,
        eviction: Default::default(),
    });
    let one = k.i32c(1);
    let ones = k.splat(one, &[200]);
    k.op(
        Op::AtomicAdd {
            tensor: hist,
            offsets: vec![ix],
            value: ones,
            mask: Some(m),
        },
        tile(DType::I32, &[200]),
    );
    let old = k.op(
        Op::AtomicAdd {
            tensor: acc,
            offsets: vec![ix],
            value: g,
            mask: None,
        },
        tile(DType::F32, &[200]),
    );
    k.store(dst, vec![i], old);
    let f = k.finish();
    // The [200] f32 tile takes 4 elements per thread: at 4 warps 64 of the 128 threads
    // cover it and the rest repeat it; the copy that adds hands its old values to the
    // others through shared memory.
    let ptx = compile_both(&f, 4);
    assert!(ptx.contains("st.shared.b32"), "{ptx}");
    assert!(ptx.contains("ld.shared.b32"), "{ptx}");
    // At 2 warps the tile covers every thread once: no exchange.
    let ptx2 = compile_both(&f, 2);
    assert!(!ptx2.contains("ld.shared"), "{ptx2}");
    assert!(ptx.contains("red.global.add.s32"), "{ptx}");
    assert!(ptx.contains("atom.global.add.f32"), "{ptx}");
}

/// A `dot` in a loop and an `if` after it, as IR text (`ir/parse.rs`; no pipelining
/// pass): f16 operands go to the tensor cores from registers (converted to the mma
/// operand layouts through shared memory and packed), f32 operands stay exact FMAs.
fn dot_and_if_ir(dt: DType) -> crate::ir::Function {
    const TEXT: &str = "kernel matmul (matmul)
  @a: tensor<T, [?, ?], contiguous, align 16>
  @b: tensor<T, [?, ?], contiguous, align 16>
  @c: tensor<f32, [?, ?], contiguous, align 16>
  @accumulate: bool
{
  %0: bool = param @accumulate
  %1: i32 = bid 0
  %2: i32 = bid 1
  %3: i32 = const 0:i32
  %4: i32 = shape @a, 1
  %5: i32 = const 31:i32
  %6: i32 = const 32:i32
  %7: i32 = add %4, %5
  %8: i32 = div %7, %6
  %9: tile<f32, [32, 32]> = const 0.0:f32
  %10: i32 = const 1:i32
  %16: tile<f32, [32, 32]> = for %3..%8 step %10 iter(%9) {
    ^(%11: i32, %12: tile<f32, [32, 32]>):
    %13: tile<T, [32, 32]> = load @a[%1, %11] pad 0.0:T
    %14: tile<T, [32, 32]> = load @b[%11, %2] pad 0.0:T
    %15: tile<f32, [32, 32]> = dot %13, %14, %12
    yield %15
  }
  %19: tile<f32, [32, 32]> = if %0 {
    %17: tile<f32, [32, 32]> = load @c[%1, %2] pad 0.0:f32
    %18: tile<f32, [32, 32]> = add %17, %16
    yield %18
  } else {
    yield %16
  }
  store @c[%1, %2], %19
}
";
    let text = TEXT.replace('T', dt.name());
    crate::ir::parse::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn dot_and_if() {
    let ptx = compile_both(&dot_and_if_ir(DType::F16), 4);
    assert!(
        ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
        "{ptx}"
    );
    assert!(ptx.contains("cvt.rn.f16x2.f32"), "{ptx}");
    assert!(!ptx.contains("fma.rn.f32"), "{ptx}");
    let ptx = compile_both(&dot_and_if_ir(DType::F32), 4);
    assert!(ptx.contains("fma.rn.f32"), "{ptx}");
    assert!(!ptx.contains("mma.sync"), "{ptx}");
    assert!(ptx.contains("ld.shared.b32"), "{ptx}");
}

#[test]
fn permute_and_general_reshape_go_through_shared_memory() {
    let mut k = Kb::new("shapes");
    let x = k.tensor("x", DType::F32, vec![None, None], true, 16);
    let y = k.tensor("y", DType::F32, vec![None, None], true, 16);
    let z = k.tensor("z", DType::F32, vec![None, None], true, 16);
    let i = k.bid(0);
    let t = k.load(x, vec![i, i], &[16, 64], Scalar::Float(0.0, DType::F32));
    let p = k.op(Op::Permute(t, vec![1, 0]), tile(DType::F32, &[64, 16]));
    k.store(y, vec![i, i], p);
    let t3 = k.load(x, vec![i, i], &[6, 10], Scalar::Float(0.0, DType::F32));
    let r = k.reshape(t3, &[4, 15]);
    k.store(z, vec![i, i], r);
    let f = k.finish();
    let ptx = compile_both(&f, 4);
    assert!(ptx.contains("st.shared.b32"));
    assert!(ptx.contains("div.u32"));
}

/// Reductions along axis 0 of a tile whose rows spread over lanes and warps (the
/// cross-warp pass), on f32 and i32, with arg-reductions.
#[test]
fn axis0_reductions_across_warps() {
    let mut k = Kb::new("red0");
    let x = k.tensor("x", DType::F32, vec![None, None], true, 16);
    let s = k.tensor("s", DType::F32, f32t(1), true, 16);
    let am = k.tensor("am", DType::I32, f32t(1), true, 16);
    let is = k.tensor("is", DType::I32, f32t(1), true, 16);
    let mn = k.tensor("mn", DType::F32, f32t(1), true, 16);
    let i = k.bid(0);
    let z = k.i32c(0);
    let t = k.load(x, vec![z, i], &[100, 8], Scalar::Float(0.0, DType::F32));
    let r = k.reduce(ReduceOp::Sum, t, 0);
    k.store(s, vec![i], r);
    let a = k.reduce(ReduceOp::ArgMin, t, 0);
    k.store(am, vec![i], a);
    let ti = k.cast(t, DType::I32);
    let r = k.reduce(ReduceOp::Sum, ti, 0);
    k.store(is, vec![i], r);
    let m = k.reduce(ReduceOp::Min, t, 0);
    k.store(mn, vec![i], m);
    let f = k.finish();
    let ptx = compile_both(&f, 4);
    assert!(ptx.contains("st.shared.b32"), "{ptx}");
    assert!(ptx.contains("shfl.sync.bfly.b32"), "{ptx}");
}

/// A transpose whose shared-memory buffer exceeds the 48 KB static window: the buffer
/// becomes dynamic and the launch hints ask for it.
#[test]
fn large_transpose_uses_dynamic_shared_memory() {
    let mut k = Kb::new("bigt");
    let x = k.tensor("x", DType::F32, vec![None, None], true, 16);
    let y = k.tensor("y", DType::F32, vec![None, None], true, 16);
    let i = k.bid(0);
    let t = k.load(x, vec![i, i], &[128, 128], Scalar::Float(0.0, DType::F32));
    let p = k.op(Op::Permute(t, vec![1, 0]), tile(DType::F32, &[128, 128]));
    k.store(y, vec![i, i], p);
    let f = k.finish();
    let ptx = compile_both(&f, 16);
    assert!(
        ptx.contains(".extern .shared .align 16 .b8 kg_smem[];"),
        "{ptx}"
    );
    let c = write(
        &f,
        &ModuleInfo::default(),
        &Arch::Sm90a.target(),
        &spec("bigt", 16),
    )
    .expect("compile");
    // 128 rows of 128 f32, each padded by 16 bytes (no bank conflicts between rows).
    assert_eq!(c.launch.dynamic_shared_bytes, 128 * (128 + 4) * 4);
    assert_eq!(c.launch.static_shared_bytes, 0);
}

/// `if` yielding a scalar and a tile; tiny replicated stores (`full([1], r)`, a `[2]`
/// `where`), as in rmsnorm and sumsq_finalize.
#[test]
fn if_yields_and_replicated_small_stores() {
    let mut k = Kb::new("small");
    let x = k.tensor("x", DType::F32, f32t(1), true, 16);
    let out = k.tensor("out", DType::F32, f32t(1), true, 16);
    let n = k.scalar_param("n", DType::I32);
    let z = k.i32c(0);
    let t = k.load(x, vec![z], &[1000], Scalar::Float(0.0, DType::F32));
    let total = k.reduce(ReduceOp::Sum, t, 0);
    let c = k.cmp(CmpOp::Gt, n, z);
    let ty_s = ValueType::Scalar(DType::F32);
    let ty_t = k.ty(t);
    let r = k.if_else(
        c,
        vec![ty_s, ty_t],
        |k| {
            let s = k.un(UnaryOp::Sqrt, total);
            let tt = k.bin(BinaryOp::Mul, t, t);
            vec![s, tt]
        },
        |k| {
            let zero = k.fconst(0.0, DType::F32, &[1000]);
            vec![total, zero]
        },
    );
    k.store(x, vec![z], r[1]);
    let one = k.splat(r[0], &[1]);
    k.store(out, vec![z], one);
    let ar = k.arange(0, 2);
    let zt = k.splat(z, &[2]);
    let m = k.cmp(CmpOp::Eq, ar, zt);
    let a = k.splat(total, &[2]);
    let sq = k.un(UnaryOp::Sqrt, total);
    let b = k.splat(sq, &[2]);
    let w = k.op(Op::Select(m, a, b), tile(DType::F32, &[2]));
    let one_i = k.i32c(1);
    k.store(out, vec![one_i], w);
    let f = k.finish();
    let ptx = compile_both(&f, 4);
    assert!(ptx.contains("@!%p"), "{ptx}");
}

/// A tile with one register per thread is not uniform: combining it with a value in
/// another layout must convert it. (`y` is also written, so its load is not a cheap
/// producer that could take the sum's layout instead: `cheap_layouts`.)
#[test]
fn one_register_tiles_are_converted() {
    let mut k = Kb::new("conv1");
    let x = k.tensor("x", DType::F32, vec![None, None], true, 4);
    let y = k.tensor("y", DType::F32, f32t(1), true, 4);
    let z = k.i32c(0);
    let t = k.load(x, vec![z, z], &[128, 4], Scalar::Float(0.0, DType::F32));
    let s = k.reduce(ReduceOp::Sum, t, 1);
    let yt = k.load(y, vec![z], &[128], Scalar::Float(0.0, DType::F32));
    let r = k.bin(BinaryOp::Add, s, yt);
    k.store(y, vec![z], r);
    let f = k.finish();
    let ptx = compile_both(&f, 4);
    assert!(
        ptx.contains("layout conversion through shared memory"),
        "{ptx}"
    );
}

#[test]
fn limits_are_target_errors() {
    let mut k = Kb::new("big");
    let x = k.tensor("x", DType::F32, f32t(1), true, 16);
    let i = k.bid(0);
    let t = k.load(x, vec![i], &[1 << 16], Scalar::Float(0.0, DType::F32));
    k.store(x, vec![i], t);
    let f = k.finish();
    let e = write(
        &f,
        &ModuleInfo::default(),
        &Arch::Sm80.target(),
        &spec("big", 4),
    )
    .expect_err("too big");
    assert_eq!(e.0[0].code, ErrorCode::TargetLimit);
    // The tile, and chunks that fit (no warp count does: 64 per thread at 32 warps).
    let notes = e.0[0].notes.join("\n");
    assert!(
        notes.contains("tile<f32, [65536]>: 512 registers"),
        "{notes}"
    );
    assert!(notes.contains("in chunks of 16384"), "{notes}");
    assert!(!notes.contains("warps it needs"), "{notes}");
    let e = write(
        &f,
        &ModuleInfo::default(),
        &Arch::Sm80.target(),
        &spec("big", 64),
    )
    .expect_err("too many threads");
    assert_eq!(e.0[0].code, ErrorCode::TargetLimit);
    let e = write(
        &f,
        &ModuleInfo::default(),
        &Arch::Sm80.target(),
        &spec("big", 3),
    )
    .expect_err("odd warps");
    assert_eq!(e.0[0].code, ErrorCode::Unsupported);
}

/// Every bundled kernel (`kernels-src/*.kg`) through the whole pipeline, assembled for
/// both targets. Skipped (with a note) while the front end reports "not implemented".
#[test]
fn bundled_kernels_from_source() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kernels-src");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("note: no kernels-src; skipping");
        return;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "kg"))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read kernel");
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let targets = crate::source_targets(&text);
        let file = crate::SourceFile::new(format!("kernels-src/{stem}.kg"), text);
        for arch in targets {
            match crate::compile(&file, &crate::CompileOptions::new(arch)) {
                Ok(k) => {
                    assemble(&k.ptx, arch.name(), &format!("src_{stem}"));
                }
                Err(d) if d.to_string().contains("not implemented") => {
                    eprintln!(
                        "note: front end not ready ({}); skipping {stem}",
                        d.to_string().trim()
                    );
                    return;
                }
                Err(d) => panic!("{stem} {arch}:\n{}", d.render(&file)),
            }
        }
    }
}

/// A broadcast of a small [2, 1] tile against a wide [1, 4096] one: the small tile's own
/// (free) layout named for [2, 4096] would hold all 4096 columns in every thread's
/// registers; the assignment takes a distribution with no more registers than the
/// default instead, so the kernel compiles within the register limit.
#[test]
fn small_tile_broadcast_against_a_wide_tile_stays_within_registers() {
    let src = r#"
kernel mix(x: tensor<bf16, 2, contiguous>, w: tensor<bf16, 1, contiguous>, y: tensor<f32, 2, contiguous>) {
    for i in 0..shape(x, 0) {
        let v = load(x, [i, 0], [1, 4096]).reshape([4096]) as f32;
        let wv = (load(w, [0], [4096]) as f32) * v;
        let sel = where(arange(0, 2) == 0, 1.0, 0.0).reshape([2, 1]);
        let both = wv.reshape([1, 4096]) * sel + (wv * v).reshape([1, 4096]) * (1.0 - sel);
        let s = sum(both, 1);
        let c1 = sum(where(arange(0, 2) == 0, s, 0.0), 0);
        store(y, [i, 0], (v * c1).reshape([1, 4096]));
    }
}
"#;
    compile_source_sm90a(src, 16, "broadcast_small_tile");
}

/// Compiles a `.kg` source for sm_90a with `warps` warps, assembles it with ptxas when
/// there is one, and returns the PTX (panics with the rendered diagnostics otherwise).
pub(super) fn compile_source_sm90a(src: &str, warps: u32, name: &str) -> String {
    let file = crate::SourceFile::new(format!("{name}.kg"), src);
    let mut opts = crate::CompileOptions::new(Arch::Sm90a);
    opts.num_warps = Some(warps);
    match crate::compile(&file, &opts) {
        Ok(k) => {
            assemble(&k.ptx, "sm_90a", name);
            k.ptx
        }
        Err(d) => panic!("{}", d.render(&file)),
    }
}

/// Two cross-warp sums whose operands are both computed before the first, or computed
/// after it by element-wise work that needs nothing from it (hoisted before the batch):
/// one shared-memory exchange for both; when the second operand needs the first sum, two
/// exchanges. An exchange is a barrier between its writes and reads, and one before its
/// writes where earlier reads of the same bytes may still be running (not before the
/// kernel's first use of shared memory: the synchronization tracker, `sync.rs`). The value each sum produces is the same either way
/// (the interpreter and the GPU self-test check the kernels that batch).
#[test]
fn ready_cross_warp_reductions_share_one_exchange() {
    let compile = |src: &str| compile_source_sm90a(src, 8, "two_sums");
    let batched = compile(
        r#"
kernel two(x: tensor<f32, 1, contiguous>, y: tensor<f32, 1, contiguous>) {
    let v = load(x, [0], [2048]);
    let sq = v * v;
    let a = sum(v, 0);
    let b = sum(sq, 0);
    store(y, [0], full([1], a * b));
}
"#,
    );
    assert_eq!(batched.matches("bar.sync").count(), 1, "{batched}");
    // Both regions in one buffer: 8 warps x 4 bytes each.
    assert!(batched.contains("kg_smem[64]"), "{batched}");
    // `v * v + 1.0` after the first sum: hoisted, the same single exchange.
    let hoisted = compile(
        r#"
kernel two(x: tensor<f32, 1, contiguous>, y: tensor<f32, 1, contiguous>) {
    let v = load(x, [0], [2048]);
    let a = sum(v, 0);
    let b = sum(v * v + 1.0, 0);
    store(y, [0], full([1], a * b));
}
"#,
    );
    assert_eq!(hoisted.matches("bar.sync").count(), 1, "{hoisted}");
    assert!(hoisted.contains("kg_smem[64]"), "{hoisted}");
    let serial = compile(
        r#"
kernel two(x: tensor<f32, 1, contiguous>, y: tensor<f32, 1, contiguous>) {
    let v = load(x, [0], [2048]);
    let a = sum(v, 0);
    let b = sum(v * a, 0);
    store(y, [0], full([1], a * b));
}
"#,
    );
    // write, barrier, read; barrier (WAR on the same bytes), write, barrier, read.
    assert_eq!(serial.matches("bar.sync").count(), 3, "{serial}");
}

/// A 16-bit tile loaded for the next iteration (a software pipeline) is unpacked where it
/// is first used, the loop's yield, not right after its load: the unpack reads the
/// loaded registers and would make the warp wait for the load before the reduction's
/// barriers, which the load is meant to overlap.
#[test]
fn prefetched_half_tiles_are_unpacked_at_first_use() {
    let ptx = compile_source_sm90a(
        r#"
kernel pipelined(x: tensor<bf16, 2, contiguous>, y: tensor<f32, 1, contiguous>) {
    let mut cur = load(x, [0, 0], [1, 2048]);
    for j in 0..shape(x, 0) {
        let next = load(x, [j + 1, 0], [1, 2048]);
        let s = sum(cur.reshape([2048]) as f32, 0);
        store(y, [j], full([1], s));
        cur = next;
    }
}
"#,
        8,
        "pipelined",
    );
    let lines: Vec<&str> = ptx.lines().collect();
    // The loop's load: the second 16-byte load of the kernel.
    let (at, load) = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("ld.global.v4.b32"))
        .nth(1)
        .expect("the prefetch load");
    let dst = load
        .split('{')
        .nth(1)
        .and_then(|s| s.split('}').next())
        .expect("vector destination");
    let first_word = dst.split(',').next().unwrap().trim().to_string();
    let first_use = lines
        .iter()
        .enumerate()
        .skip(at + 1)
        .find(|(_, l)| {
            l.contains(&format!("{first_word},")) || l.contains(&format!("{first_word};"))
        })
        .map(|(i, _)| i)
        .expect("a use of the prefetched words");
    let last_barrier = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("bar.sync"))
        .map(|(i, _)| i)
        .max()
        .expect("the reduction's barriers");
    assert!(
        at < last_barrier && last_barrier < first_use,
        "load at {at}, barrier at {last_barrier}, first use at {first_use}:\n{ptx}"
    );
}

/// `cluster_gather`: the block's value goes to its own slot (thread 0), one cluster
/// barrier phase orders the writes before the reads, lanes below C read the ranks'
/// slots through `mapa` and the other lanes get them by shuffle; two ready gathers share
/// one exchange; the split barrier's first `arrive` opens the body and the last `wait`
/// precedes `ret`.
#[test]
fn cluster_gathers_share_one_exchange_through_distributed_shared_memory() {
    let ptx = compile_source_sm90a(
        r#"
kernel two(x: tensor<f32, 1, contiguous>, y: tensor<f32, 1, contiguous>) {
    let t = load(x, [bid(0)], [1024]);
    let ms = cluster_gather(max(t, axis = 0), 8);
    let ss = cluster_gather(sum(t, 0), 8);
    store(y, [bid(0)], full([1], max(ms, axis = 0) + sum(ss, 0)));
}
"#,
        4,
        "cluster_two",
    );
    assert!(ptx.contains(".reqnctapercluster 8, 1, 1\n"), "{ptx}");
    assert!(
        ptx.contains(".shared .align 8 .b8 kg_cluster[16];"),
        "{ptx}"
    );
    assert_eq!(ptx.matches("mapa.shared::cluster.u32").count(), 1, "{ptx}");
    assert_eq!(ptx.matches("ld.shared::cluster.f32").count(), 2, "{ptx}");
    assert_eq!(ptx.matches("barrier.cluster.arrive;").count(), 3, "{ptx}");
    assert_eq!(ptx.matches("barrier.cluster.wait;").count(), 3, "{ptx}");
    let body = ptx.split("// body").nth(1).expect("body");
    assert!(
        body.trim_start().starts_with("barrier.cluster.arrive;"),
        "{body}"
    );
    assert!(ptx.contains("barrier.cluster.wait;\n\tret;"), "{ptx}");
    assert!(ptx.contains("shfl.sync.idx.b32"), "{ptx}");
}

/// `eviction_policy`: one `createpolicy` per policy used (in the prologue, shared by
/// every access with that policy), `.L2::cache_hint` plus the policy register on the
/// hinted loads and stores, plain accesses elsewhere; ptxas accepts it on both targets.
#[test]
fn eviction_policies_become_l2_cache_hints() {
    let src = r#"
kernel hinted(x: tensor<bf16, 2, contiguous>, y: tensor<bf16, 2, contiguous>) {
    let r = bid(0);
    let a = load(x, [r, 0], [1, 1024], eviction_policy = evict_last);
    let b = load(x, [r, 1], [1, 1024], eviction_policy = evict_last);
    let c = load(x, [r, 2], [1, 1024]);
    store(y, [r, 0], a + b, eviction_policy = evict_first);
    store(y, [r, 1], c, eviction_policy = evict_normal);
}
"#;
    let ptx = compile_source_sm90a(src, 4, "hinted");
    assert_eq!(
        ptx.matches("createpolicy.fractional.L2::evict_last.b64")
            .count(),
        1,
        "{ptx}"
    );
    assert_eq!(
        ptx.matches("createpolicy.fractional.L2::evict_first.b64")
            .count(),
        1,
        "{ptx}"
    );
    assert_eq!(ptx.matches("createpolicy").count(), 2, "{ptx}");
    let body = ptx.split("// body").nth(1).expect("body");
    assert!(
        !body.contains("createpolicy"),
        "policies belong to the prologue"
    );
    assert_eq!(
        ptx.matches("ld.global.L2::cache_hint.v4.b32").count(),
        2,
        "{ptx}"
    );
    assert_eq!(ptx.matches("ld.global.v4.b32").count(), 1, "{ptx}");
    assert_eq!(
        ptx.matches("st.global.L2::cache_hint.v4.b32").count(),
        1,
        "{ptx}"
    );
    assert_eq!(ptx.matches("st.global.v4.b32").count(), 1, "{ptx}");
    // The hinted accesses name a policy register as their last operand.
    for line in ptx.lines().filter(|l| l.contains("L2::cache_hint")) {
        let last = line.trim_end_matches(';').rsplit(", ").next().unwrap_or("");
        assert!(last.starts_with("%rd"), "{line}");
    }
    let file = crate::SourceFile::new("hinted.kg", src);
    let sm80 = crate::compile(&file, &crate::CompileOptions::new(Arch::Sm80))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assemble(&sm80.ptx, "sm_80", "hinted");
}

/// `eviction_policy` on the per-element accesses: every gathered load and scattered
/// store carries the hint and the (shared) policy register; atomics take no policy.
#[test]
fn gathers_and_scatters_take_eviction_policies() {
    let src = r#"
kernel pointwise(x: tensor<f32, 1, contiguous>, idx: tensor<i32, 1, contiguous>, y: tensor<f32, 1, contiguous>) {
    let o = load(idx, [0], [128]);
    let v = gather(x, [o], mask = o >= 0, other = 0.0, eviction_policy = evict_last);
    let w = gather(x, [o + 1], eviction_policy = evict_last);
    scatter(y, [o], v + w, mask = o < 100, eviction_policy = evict_first);
}
"#;
    let ptx = compile_source_sm90a(src, 4, "pointwise");
    assert_eq!(ptx.matches("createpolicy").count(), 2, "{ptx}");
    let hinted_loads = ptx.matches("ld.global.L2::cache_hint.b32").count();
    let hinted_stores = ptx.matches("st.global.L2::cache_hint.b32").count();
    // Each thread gathers its elements twice and scatters them once; only the plain
    // `load` of the offsets has no hint.
    assert!(hinted_stores >= 1, "{ptx}");
    assert_eq!(hinted_loads, 2 * hinted_stores, "{ptx}");
    assert!(!ptx.contains("ld.global.b32"), "{ptx}");
    assert!(!ptx.contains("st.global.b32"), "{ptx}");
    assert_eq!(ptx.matches("ld.global.v4.b32").count(), 1, "{ptx}");
    let file = crate::SourceFile::new("pointwise.kg", src);
    let sm80 = crate::compile(&file, &crate::CompileOptions::new(Arch::Sm80))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assemble(&sm80.ptx, "sm_80", "pointwise");
}

/// The PTX of the main loop: the longest span from a label to a branch back to it (the
/// mbarrier waits of TMA fetches are short loops of their own).
pub fn loop_body(ptx: &str) -> &str {
    let mut best: Option<(usize, usize)> = None;
    for (at, _) in ptx.match_indices("bra.uni $L") {
        let label: String = ptx[at + 8..].chars().take_while(|c| *c != ';').collect();
        if let Some(start) = ptx[..at].find(&format!("{label}:")) {
            if best.is_none_or(|(s, e)| at - start > e - s) {
                best = Some((start, at));
            }
        }
    }
    let (start, end) = best.expect("a loop");
    &ptx[start..end]
}
