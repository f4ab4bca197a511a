//! End to end without the front end: tile IR built by hand, the real PTX back end, the
//! launcher on the GPU, compared with the interpreter. Skipped without a CUDA driver;
//! without one it still checks that the back end's ABI passes `validate_args` and
//! `pack_params`.

use crate::*;
use kgen_core::abi::Specialization;
use kgen_core::host::{ArgValue, HostTensor};
use kgen_core::ir::{
    BinaryOp, Block, Builder, Function, Op, Param, ParamKind, ReduceOp, TensorParam, ValueId,
};
use kgen_core::span::Span;
use kgen_core::types::{DType, Scalar, Shape, ValueType};
use kgen_core::Arch;

struct B {
    f: Function,
    body: Block,
}

impl B {
    fn new(name: &str) -> B {
        B {
            f: Function::new(name, name),
            body: Block::default(),
        }
    }
    fn tensor(&mut self, name: &str, dtype: DType, dims: Vec<Option<u32>>, align: u32) -> u32 {
        self.f.params.push(Param {
            name: name.into(),
            kind: ParamKind::Tensor(TensorParam {
                dtype,
                dims,
                contiguous: true,
                align_bytes: align,
            }),
        });
        self.f.params.len() as u32 - 1
    }
    fn op(&mut self, op: Op, ty: ValueType) -> ValueId {
        let mut b = Builder { func: &mut self.f };
        b.inst(&mut self.body, op, vec![ty], Span::new(0, 1))[0]
    }
    fn effect(&mut self, op: Op) {
        let mut b = Builder { func: &mut self.f };
        b.inst(&mut self.body, op, vec![], Span::new(0, 1));
    }
    fn scalar_param(&mut self, name: &str, dtype: DType) -> ValueId {
        self.f.params.push(Param {
            name: name.into(),
            kind: ParamKind::Scalar(dtype),
        });
        let i = self.f.params.len() as u32 - 1;
        self.op(Op::ScalarParam(i), ValueType::Scalar(dtype))
    }
    fn i32c(&mut self, v: i64) -> ValueId {
        self.op(
            Op::Const(Scalar::Int(v, DType::I32)),
            ValueType::Scalar(DType::I32),
        )
    }
    fn finish(mut self) -> Function {
        self.f.body = std::mem::take(&mut self.body);
        self.f
    }
}

fn tile(dt: DType, s: &[u32]) -> ValueType {
    ValueType::Tile(dt, Shape(s.to_vec()))
}

/// `out[i] = x[i] * alpha + y[i]` over BLOCK-element tiles.
fn axpy(dt: DType, block: u32, align: u32) -> Function {
    let mut k = B::new("axpy");
    let x = k.tensor("x", dt, vec![None], align);
    let y = k.tensor("y", dt, vec![None], align);
    let o = k.tensor("out", dt, vec![None], align);
    let alpha = k.scalar_param("alpha", dt);
    let i = k.op(Op::ProgramId(0), ValueType::Scalar(DType::I32));
    let zero = Scalar::Float(0.0, dt);
    let a = k.op(
        Op::Load {
            tensor: x,
            index: vec![i],
            padding: zero,
            eviction: Default::default(),
        },
        tile(dt, &[block]),
    );
    let b = k.op(
        Op::Load {
            tensor: y,
            index: vec![i],
            padding: zero,
            eviction: Default::default(),
        },
        tile(dt, &[block]),
    );
    let s = k.op(Op::Splat(alpha), tile(dt, &[block]));
    let m = k.op(Op::Binary(BinaryOp::Mul, a, s), tile(dt, &[block]));
    let r = k.op(Op::Binary(BinaryOp::Add, m, b), tile(dt, &[block]));
    k.effect(Op::Store {
        tensor: o,
        index: vec![i],
        value: r,
        eviction: Default::default(),
    });
    k.finish()
}

/// `out[row] = sum(x[row, :COLS])` on a 2-D tensor with runtime extents and strides.
fn row_sum(cols: u32) -> Function {
    let mut k = B::new("row_sum");
    let x = k.tensor("x", DType::F32, vec![None, None], 4);
    let o = k.tensor("out", DType::F32, vec![None], 4);
    let row = k.op(Op::ProgramId(0), ValueType::Scalar(DType::I32));
    let zero = k.i32c(0);
    let t = k.op(
        Op::Load {
            tensor: x,
            index: vec![row, zero],
            padding: Scalar::Float(0.0, DType::F32),
            eviction: Default::default(),
        },
        tile(DType::F32, &[1, cols]),
    );
    let s = k.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            value: t,
            axis: 1,
        },
        tile(DType::F32, &[1]),
    );
    k.effect(Op::Store {
        tensor: o,
        index: vec![row],
        value: s,
        eviction: Default::default(),
    });
    k.finish()
}

fn compile(f: &Function, arch: Arch, warps: u32) -> kgen_core::CompiledKernel {
    let info =
        kgen_core::valid::validate(f).unwrap_or_else(|d| panic!("{}: invalid IR: {d}", f.name));
    let spec = Specialization {
        kernel: f.name.clone(),
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
    };
    kgen_core::back::ptx::write(f, &info, &arch.target(), &spec)
        .unwrap_or_else(|d| panic!("{} {arch}: {d}", f.name))
}

fn rand_tensor(seed: &mut u64, dt: DType, shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect();
    HostTensor::from_f64(dt, shape, &vals)
}

fn poisoned(dt: DType, shape: &[usize]) -> HostTensor {
    let mut t = HostTensor::zeros(dt, shape);
    t.poison(0xFF);
    t
}

/// (name, function, args, grid, output index)
type E2eCase = (String, Function, Vec<ArgValue>, [u32; 3], usize);

fn cases() -> Vec<E2eCase> {
    let mut seed = 7u64;
    let mut v = Vec::new();
    for (dt, n, block, align) in [
        (DType::F32, 4096usize, 1024u32, 16u32),
        (DType::F32, 4097, 1000, 4),
        (DType::BF16, 1000, 256, 16),
        (DType::F16, 7, 128, 2),
    ] {
        let args = vec![
            ArgValue::Tensor(rand_tensor(&mut seed, dt, &[n])),
            ArgValue::Tensor(rand_tensor(&mut seed, dt, &[n])),
            ArgValue::Tensor(poisoned(dt, &[n])),
            ArgValue::Scalar(kgen_core::host::scalar_from_f64(dt, 1.5)),
        ];
        let grid = [n.div_ceil(block as usize) as u32, 1, 1];
        v.push((
            format!("axpy {dt} n={n} BLOCK={block} align={align}"),
            axpy(dt, block, align),
            args,
            grid,
            2,
        ));
    }
    for (rows, cols, tile_cols) in [(37usize, 300usize, 512u32), (5, 1000, 1024)] {
        let args = vec![
            ArgValue::Tensor(rand_tensor(&mut seed, DType::F32, &[rows, cols])),
            ArgValue::Tensor(poisoned(DType::F32, &[rows])),
        ];
        v.push((
            format!("row_sum {rows}x{cols} tile {tile_cols}"),
            row_sum(tile_cols),
            args,
            [rows as u32, 1, 1],
            1,
        ));
    }
    v
}

#[test]
fn backend_abi_is_accepted_by_the_launcher() {
    for (name, f, args, _, _) in cases() {
        for arch in Arch::ALL {
            let k = compile(&f, arch, 4);
            validate_args(&k.entry, &k.abi, &args).unwrap_or_else(|e| panic!("{name} {arch}: {e}"));
            let ptrs = vec![0x1000u64; args.len()];
            pack_params(&k.abi, &args, &ptrs).unwrap_or_else(|e| panic!("{name} {arch}: {e}"));
        }
    }
}

#[test]
fn gpu_matches_interpreter_on_hand_built_ir() {
    if !driver_present() {
        eprintln!("no CUDA driver: skipping the GPU end-to-end test");
        return;
    }
    let gpu = Gpu::new(0).expect("Gpu::new");
    let arch = gpu.arch().expect("a kgen target");
    let mut failures = Vec::new();
    for (name, f, args, grid, out) in cases() {
        for a in [Arch::Sm80, arch] {
            let k = compile(&f, a, 4);
            let mut iargs = args.clone();
            kgen_core::interp::run(&f, grid, &mut iargs)
                .unwrap_or_else(|e| panic!("{name}: interpreter: {e}"));
            let loaded = match gpu.load(&k) {
                Ok(l) => l,
                Err(e) => {
                    failures.push(format!("{name} {a}: load: {e}"));
                    continue;
                }
            };
            let mut gargs = args.clone();
            let stats = match gpu.run(&loaded, grid, &mut gargs) {
                Ok(s) => s,
                Err(e) => {
                    failures.push(format!("{name} {a}: run: {e}"));
                    continue;
                }
            };
            let (ArgValue::Tensor(gi), ArgValue::Tensor(gg)) = (&iargs[out], &gargs[out]) else {
                unreachable!()
            };
            let (vi, vg) = (gi.to_f64_vec(), gg.to_f64_vec());
            let mut bad = 0;
            let mut worst = 0.0f64;
            for (x, y) in vi.iter().zip(&vg) {
                let d = (x - y).abs();
                if d.is_nan() || d > 1e-5 + 1e-5 * x.abs() {
                    bad += 1;
                }
                if d.is_finite() {
                    worst = worst.max(d);
                }
            }
            eprintln!(
                "{name} {a}: {:.4} ms, {} regs, max |gpu - interp| = {worst:.3e}, {bad} mismatches",
                stats.kernel_ms, loaded.num_regs
            );
            if bad > 0 {
                failures.push(format!("{name} {a}: {bad} of {} elements differ", vi.len()));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
