//! Checker tests on valid programs: `.kg` snippets through the parser and the checker,
//! asserting on the IR (result types, instruction counts), the specialization, and that
//! the IR passes the validator. Error tests are in `tests_errors.rs`.

use crate::abi::{ConstArg, Specialization};
use crate::diag::Diagnostics;
use crate::ir::{Function, Op, ParamKind, ReduceOp};
use crate::span::SourceFile;
use crate::target::Arch;
use crate::types::{DType, Shape, ValueType};
use crate::{front, pipeline::CompileOptions};

pub(super) fn compile_with(
    src: &str,
    opts: &CompileOptions,
) -> Result<(Function, Specialization), Diagnostics> {
    let file = SourceFile::new("t.kg", src);
    let m = front::parse(&file)?;
    super::lower_kernel(&m, opts)
}

/// Lowers the first kernel with default options; panics with the rendered errors.
fn lower(src: &str) -> Function {
    lower_with(src, &CompileOptions::new(Arch::Sm80)).0
}

fn lower_with(src: &str, opts: &CompileOptions) -> (Function, Specialization) {
    let file = SourceFile::new("t.kg", src);
    match compile_with(src, opts) {
        Ok((f, s)) => {
            if let Err(d) = crate::valid::validate(&f) {
                panic!("invalid IR: {}\n{f}", d.render(&file));
            }
            (f, s)
        }
        Err(d) => panic!("unexpected errors:\n{}", d.render(&file)),
    }
}

/// Number of instructions (nested regions included) whose op matches.
fn count(f: &Function, pred: impl Fn(&Op) -> bool) -> usize {
    f.insts.iter().filter(|(_, i)| pred(&i.op)).count()
}

/// The result types of every instruction whose op matches, in creation order.
fn result_types(f: &Function, pred: impl Fn(&Op) -> bool) -> Vec<ValueType> {
    f.insts
        .iter()
        .filter(|(_, i)| pred(&i.op))
        .flat_map(|(_, i)| i.results.iter().map(|r| f.values[*r].ty.clone()))
        .collect()
}

fn tile(d: DType, dims: &[u32]) -> ValueType {
    ValueType::Tile(d, Shape(dims.to_vec()))
}

/// A kernel with the usual parameters around a body.
fn k(body: &str) -> String {
    format!(
        "kernel k(x: tensor<f32, 1>, m: tensor<f32, 2>, xi: tensor<i32, 1>, h: tensor<f16, 1>, n: i32) {{ let i = bid(0); {body} }}"
    )
}

#[test]
fn vec_add_lowers_to_valid_ir() {
    let (f, spec) = lower_with(
        "kernel k<T: float = f32, B: int = 256>(x: tensor<T, 1>, y: tensor<T, 1>) {
            let i = bid(0);
            store(y, [i], load(x, [i], [B]) * 2.0 + 1);
        }",
        &CompileOptions::new(Arch::Sm80),
    );
    assert_eq!(f.name, "k__T_f32__B_256__w1__x_a4__y_a4");
    assert_eq!(f.source_name, "k");
    assert_eq!(
        spec.consts,
        vec![
            ("T".to_string(), ConstArg::DType(DType::F32)),
            ("B".to_string(), ConstArg::Int(256))
        ]
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Load { .. })),
        vec![tile(DType::F32, &[256])]
    );
    // Both literals became f32 scalars, splatted to the tile.
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Const(_))),
        vec![ValueType::Scalar(DType::F32); 2]
    );
    assert_eq!(count(&f, |o| matches!(o, Op::Splat(_))), 2);
    assert_eq!(count(&f, |o| matches!(o, Op::Store { .. })), 1);
}

#[test]
fn defines_override_defaults_and_spell_the_entry_name() {
    let src =
        "kernel k<T: dtype = f32, B: int = 64, B2: int = B * 2, NEG: int = -1, F: bool = false>(
        x: tensor<T, 1>) { let i = bid(0); store(x, [i], load(x, [i], [B2])); }";
    let (f, spec) = lower_with(src, &CompileOptions::new(Arch::Sm80));
    assert_eq!(f.name, "k__T_f32__B_64__B2_128__NEG_m1__F_false__w1__x_a4");
    let opts = CompileOptions::new(Arch::Sm80)
        .define("T", "bf16")
        .define("B", "1_024")
        .define("NEG", "-0x10")
        .define("F", "true");
    let (f, spec2) = lower_with(src, &opts);
    assert_eq!(
        spec2.consts,
        vec![
            ("T".to_string(), ConstArg::DType(DType::BF16)),
            ("B".to_string(), ConstArg::Int(1024)),
            ("B2".to_string(), ConstArg::Int(2048)),
            ("NEG".to_string(), ConstArg::Int(-16)),
            ("F".to_string(), ConstArg::Bool(true)),
        ]
    );
    assert_eq!(spec2.num_warps, 8);
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Load { .. })),
        vec![tile(DType::BF16, &[2048])]
    );
    assert_ne!(spec, spec2);
    // A `float` generic accepts f32.
    let (_, s) = lower_with(
        "kernel k<T: float = f16>(x: tensor<T, 1>) { }",
        &CompileOptions::new(Arch::Sm80).define("T", "f32"),
    );
    assert_eq!(s.consts[0].1, ConstArg::DType(DType::F32));
}

#[test]
fn kernel_selection_by_name() {
    let src = "kernel a(x: tensor<f32, 1>) { } kernel b(y: tensor<i32, 2>) { }";
    let (f, _) = lower_with(src, &CompileOptions::new(Arch::Sm80));
    assert_eq!(f.source_name, "a");
    let (f, _) = lower_with(src, &CompileOptions::new(Arch::Sm80).kernel("b"));
    assert_eq!(f.source_name, "b");
    assert_eq!(f.params[0].name, "y");
}

#[test]
fn params_and_tensor_alignment() {
    let src = "kernel k<D: int = 8>(
        a: tensor<f32, 2, contiguous>, b: tensor<f32, [_, D * 2]>, c: tensor<bf16, 3>,
        d: tensor<f16, 1, contiguous>, e: tensor<f32, 1, contiguous>, s: f32, t: bool) { }";
    let opts = CompileOptions {
        tensor_align: vec![
            ("d".to_string(), 6),
            ("e".to_string(), 1),
            ("a".to_string(), 64),
        ],
        ..CompileOptions::new(Arch::Sm80)
    };
    let (f, spec) = lower_with(src, &opts);
    let tensors: Vec<_> = f
        .params
        .iter()
        .filter_map(|p| match &p.kind {
            ParamKind::Tensor(t) => {
                Some((p.name.as_str(), t.dims.clone(), t.contiguous, t.align_bytes))
            }
            ParamKind::Scalar(_) => None,
        })
        .collect();
    assert_eq!(
        tensors,
        vec![
            ("a", vec![None, None], true, 16),
            ("b", vec![None, Some(16)], false, 4),
            ("c", vec![None, None, None], false, 2),
            ("d", vec![None], true, 4),
            ("e", vec![None], true, 4),
        ]
    );
    assert_eq!(
        spec.tensor_align,
        vec![
            ("a".to_string(), 16),
            ("b".to_string(), 4),
            ("c".to_string(), 2),
            ("d".to_string(), 4),
            ("e".to_string(), 4),
        ]
    );
    assert_eq!(f.params[5].kind, ParamKind::Scalar(DType::F32));
    assert_eq!(f.params[6].kind, ParamKind::Scalar(DType::Bool));
    assert_eq!(count(&f, |o| matches!(o, Op::ScalarParam(_))), 2);
    assert!(
        f.name.ends_with("__w1__b_a4__c_a2__d_a4__e_a4"),
        "{}",
        f.name
    );
}

#[test]
fn warp_heuristic_and_explicit_warps() {
    let w = |shape: &str| {
        let src = format!("kernel k(x: tensor<f32, 2>) {{ let t = zeros({shape}, f32); }}");
        lower_with(&src, &CompileOptions::new(Arch::Sm80))
            .1
            .num_warps
    };
    assert_eq!(w("[128]"), 1);
    assert_eq!(w("[4, 256]"), 4);
    assert_eq!(w("[3, 256]"), 2);
    assert_eq!(w("[8, 256]"), 8);
    assert_eq!(w("[64, 1024]"), 16);
    let opts = CompileOptions {
        num_warps: Some(32),
        ..CompileOptions::new(Arch::Sm80)
    };
    let (f, spec) = lower_with("kernel k(x: tensor<f32, 1>) { }", &opts);
    assert_eq!(spec.num_warps, 32);
    assert!(f.name.ends_with("__w32__x_a4"), "{}", f.name);
    assert_eq!(super::default_warps(0), 1);
    assert_eq!(super::default_warps(u64::MAX), 16);
}

#[test]
fn literals_adapt_to_the_other_operand() {
    let f = lower(&k(
        "let a = load(h, [i], [16]) * 2 + 0.5; let b = load(xi, [i], [16]) + 1; let c = n * 3;",
    ));
    let consts = result_types(&f, |o| matches!(o, Op::Const(_)));
    assert_eq!(
        consts,
        vec![
            ValueType::Scalar(DType::F16),
            ValueType::Scalar(DType::F16),
            ValueType::Scalar(DType::I32),
            ValueType::Scalar(DType::I32),
        ]
    );
    let bins = result_types(&f, |o| matches!(o, Op::Binary(..)));
    assert_eq!(
        bins,
        vec![
            tile(DType::F16, &[16]),
            tile(DType::F16, &[16]),
            tile(DType::I32, &[16]),
            ValueType::Scalar(DType::I32),
        ]
    );
    // Lone literals default to i32 / f32; constant expressions fold.
    let f = lower(&k(
        "let mut a = 3; let mut b = 2.5 * 2; let mut c = 7 / 2 + 1;",
    ));
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Const(_))),
        vec![
            ValueType::Scalar(DType::I32),
            ValueType::Scalar(DType::F32),
            ValueType::Scalar(DType::I32)
        ]
    );
    assert!(f
        .insts
        .iter()
        .any(|(_, i)| matches!(i.op, Op::Const(crate::types::Scalar::Int(4, DType::I32)))));
    // An int constant next to a float constant folds to a float.
    let f = lower(&k("let a = 3; store(x, [i], full([4], a + 0.5));"));
    assert!(f.insts.iter().any(|(_, i)| matches!(
        i.op,
        Op::Const(crate::types::Scalar::Float(v, DType::F32)) if v == 3.5
    )));
}

#[test]
fn broadcasting_is_explicit() {
    let f = lower(
        "kernel k(a: tensor<f32, 1>, o: tensor<f32, 2>) {
            let c = expand_dims(load(a, [0], [8]), 1);
            let r = expand_dims(load(a, [0], [4]), 0);
            store(o, [0, 0], c * r);
        }",
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Broadcast(_))),
        vec![tile(DType::F32, &[8, 4]); 2]
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Binary(..))),
        vec![tile(DType::F32, &[8, 4])]
    );
    // Rank alignment: [4] against [2, 4] is reshaped to [1, 4], then broadcast.
    let f = lower(&k(
        "let a = load(x, [i], [4]); let b = load(m, [i, 0], [2, 4]); store(m, [i, 0], a + b);",
    ));
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Reshape(_))),
        vec![tile(DType::F32, &[1, 4])]
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Broadcast(_))),
        vec![tile(DType::F32, &[2, 4])]
    );
    // A [4] tile against [1, 4] needs only the reshape.
    let f = lower(&k(
        "let a = load(x, [i], [4]); let b = load(m, [i, 0], [1, 4]); store(m, [i, 0], a + b);",
    ));
    assert_eq!(count(&f, |o| matches!(o, Op::Reshape(_))), 1);
    assert_eq!(count(&f, |o| matches!(o, Op::Broadcast(_))), 0);
    // A scalar against a tile is splatted.
    let f = lower(&k(
        "let a = load(x, [i], [4]); store(x, [i], a * (n as f32));",
    ));
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Splat(_))),
        vec![tile(DType::F32, &[4])]
    );
}

#[test]
fn constant_shapes_fold() {
    let f = lower(
        "kernel k<B: int = 64>(x: tensor<f32, [_, 100]>, y: tensor<f32, 2, contiguous>) {
            static_assert(B % 32 == 0 && B / 2 == 32, \"fold\");
            let t = load(x, [0, 0], [B / 2, shape(x, 1)]);
            let a = arange(B - 64, B * 2 - 64 + cdiv(10, 3));
            let s = stride(y, 1) + stride(y, 0) + shape(y, 0);
            let z = zeros([max(B, 3), min(2, 5)], f32);
        }",
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Load { .. })),
        vec![tile(DType::F32, &[32, 100])]
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Arange { .. })),
        vec![tile(DType::I32, &[68])]
    );
    // stride of the contiguous dimension folds to 1; the others are runtime values.
    assert_eq!(
        count(&f, |o| matches!(o, Op::TensorStride { dim: 0, .. })),
        1
    );
    assert_eq!(
        count(&f, |o| matches!(o, Op::TensorStride { dim: 1, .. })),
        0
    );
    assert_eq!(count(&f, |o| matches!(o, Op::TensorDim { .. })), 1);
    assert!(result_types(&f, |o| matches!(o, Op::Const(_))).contains(&tile(DType::F32, &[64, 2])));
}

#[test]
fn operators_give_the_documented_types() {
    let f = lower(&k("let a = load(xi, [i], [8]);
         let b = (a & 3) | (a << 1) ^ (a >> 2) ^ !a;
         let c = a < 3 && !(a == 2) || a >= 7;
         let d = load(x, [i], [8]) % 2.0;
         let e = -load(x, [i], [8]);"));
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Compare(..))),
        vec![tile(DType::Bool, &[8]); 3]
    );
    let f = lower(&k("let c = n > 0; let d = c && true; if d { }"));
    assert_eq!(count(&f, |o| matches!(o, Op::If { .. })), 1);
}

#[test]
fn math_casts_and_select() {
    let f = lower(&k("let v = load(x, [i], [16]);
         let a = exp(v) + exp2(v) + log(v) + log2(v) + sqrt(v) + rsqrt(v) + tanh(v)
             + sigmoid(v) + sin(v) + cos(v) + floor(v) + ceil(v) + abs(v);
         let b = abs(load(xi, [i], [16]));
         let c = fma(v, 2, 1.0) + pow(v, 3.0);
         let d = min(v, 0.0) + max(1, v);
         let e = where(v > 0.0, v, 0.0);
         let g = v as f16;
         let gi = cast(g, i32);
         let same = v as f32;
         store(h, [i], g);"));
    assert_eq!(count(&f, |o| matches!(o, Op::Unary(..))), 14);
    assert_eq!(count(&f, |o| matches!(o, Op::Fma(..))), 1);
    assert_eq!(count(&f, |o| matches!(o, Op::Select(..))), 1);
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Cast(_))),
        vec![tile(DType::F16, &[16]), tile(DType::I32, &[16])]
    );
    // `where` broadcasts its condition with both arms.
    let f = lower(&k("let c = expand_dims(load(x, [i], [4]), 1) > 0.0;
         let r = where(c, expand_dims(load(x, [i], [8]), 0), 1.0);
         store(m, [i, 0], r);"));
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Select(..))),
        vec![tile(DType::F32, &[4, 8])]
    );
}

#[test]
fn reductions_and_min_max_forms() {
    let f = lower(&k("let t = load(m, [i, 0], [4, 8]);
         let a = sum(t, 1);
         let b = t.max(axis = 0);
         let c = min(t, axis = 1);
         let d = argmax(t, 1);
         let e = argmin(sum(t, 0), 0);
         let g = max(t, 0.0);
         let s = sum(load(x, [i], [8]), 0);"));
    let reds: Vec<(ReduceOp, ValueType)> = f
        .insts
        .iter()
        .filter_map(|(_, i)| match i.op {
            Op::Reduce { op, .. } => Some((op, f.values[i.results[0]].ty.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        reds,
        vec![
            (ReduceOp::Sum, tile(DType::F32, &[4])),
            (ReduceOp::Max, tile(DType::F32, &[8])),
            (ReduceOp::Min, tile(DType::F32, &[4])),
            (ReduceOp::ArgMax, tile(DType::I32, &[4])),
            (ReduceOp::Sum, tile(DType::F32, &[8])),
            (ReduceOp::ArgMin, ValueType::Scalar(DType::I32)),
            (ReduceOp::Sum, ValueType::Scalar(DType::F32)),
        ]
    );
    // `max(t, 0.0)` is element-wise.
    assert_eq!(
        count(&f, |o| matches!(
            o,
            Op::Binary(crate::ir::BinaryOp::Max, ..)
        )),
        1
    );
}

#[test]
fn shape_builtins() {
    let f = lower(&k("let t = load(m, [i, 0], [4, 8]);
         let a = reshape(t, [32]);
         let b = t.reshape([2, 2, 8]).permute([2, 0, 1]);
         let c = transpose(t);
         let d = expand_dims(a, 0);
         let e = broadcast(expand_dims(a, 1), [32, 3]);
         let g = broadcast(n, [5]);"));
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Reshape(_))),
        vec![tile(DType::F32, &[32]), tile(DType::F32, &[2, 2, 8])]
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Permute(..))),
        vec![tile(DType::F32, &[8, 2, 2]), tile(DType::F32, &[8, 4])]
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::ExpandDims(..))),
        vec![tile(DType::F32, &[1, 32]), tile(DType::F32, &[32, 1])]
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Broadcast(_))),
        vec![tile(DType::F32, &[32, 3])]
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Splat(_))),
        vec![tile(DType::I32, &[5])]
    );
}

#[test]
fn memory_access_builtins() {
    let f = lower(&k("let rows = expand_dims(arange(0, 4), 1);
         let cols = expand_dims(arange(0, 8), 0);
         let g = gather(m, [rows, cols], mask = cols < n, other = -1.0);
         scatter(m, [rows, cols], 2.0, mask = rows < 2);
         let old = atomic_add(xi, [arange(0, 16)], 1);
         let p = load(x, [i], [32], pad = -inf);
         let q = gather(x, [arange(0, 4) * 2], mask = true);
         store(m, [i, 0], g);"));
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Gather { .. })),
        vec![tile(DType::F32, &[4, 8]), tile(DType::F32, &[4])]
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::AtomicAdd { .. })),
        vec![tile(DType::I32, &[16])]
    );
    assert!(f.insts.iter().any(|(_, i)| matches!(
        &i.op,
        Op::Load { padding: crate::types::Scalar::Float(p, DType::F32), .. } if *p == f64::NEG_INFINITY
    )));
    assert!(f.insts.iter().any(|(_, i)| matches!(
        &i.op,
        Op::Gather { other: crate::types::Scalar::Float(p, DType::F32), mask: Some(_), .. } if *p == -1.0
    )));
    assert_eq!(count(&f, |o| matches!(o, Op::Scatter { .. })), 1);
    assert_eq!(count(&f, |o| matches!(o, Op::Store { .. })), 1);
}

#[test]
fn dot_takes_the_accumulator_type() {
    let f = lower(
        "kernel k(a: tensor<bf16, 2>, b: tensor<bf16, 2>, c: tensor<f32, 2>) {
            let acc = dot(load(a, [0, 0], [32, 16]), load(b, [0, 0], [16, 64]), zeros([32, 64], f32));
            store(c, [0, 0], acc);
        }",
    );
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Dot { .. })),
        vec![tile(DType::F32, &[32, 64])]
    );
}

#[test]
fn loops_carry_mutable_tiles_and_scalars() {
    let f = lower(
        "kernel k(x: tensor<f32, 2>, y: tensor<f32, 1>) {
            let r = bid(0);
            let mut acc = zeros([1, 64], f32);
            let mut n = 0;
            let mut untouched = 1.0;
            for k in 0..cdiv(shape(x, 1), 64) {
                let acc2 = load(x, [r, k], [1, 64]);
                acc += acc2;
                n += k;
            }
            if n > 2 { acc = acc * 2.0; } else { n = 3; }
            store(y, [r], sum(acc, 1) + full([1], n as f32));
        }",
    );
    let fors: Vec<_> = f
        .insts
        .iter()
        .filter_map(|(_, i)| match &i.op {
            Op::For { inits, body, .. } => Some((inits.len(), body.args.len(), i.results.len())),
            _ => None,
        })
        .collect();
    assert_eq!(fors, vec![(2, 3, 2)]);
    let ifs: Vec<_> = f
        .insts
        .iter()
        .filter_map(|(_, i)| match &i.op {
            Op::If { .. } => Some(
                i.results
                    .iter()
                    .map(|r| f.values[*r].ty.clone())
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .collect();
    assert_eq!(
        ifs,
        vec![vec![
            tile(DType::F32, &[1, 64]),
            ValueType::Scalar(DType::I32)
        ]]
    );
    // One yield per region: the loop body, and both branches of the if.
    assert_eq!(count(&f, |o| matches!(o, Op::Yield(_))), 3);
    // The loop variable is an i32 block argument named after the source variable.
    let iv = f
        .insts
        .iter()
        .find_map(|(_, i)| match &i.op {
            Op::For { body, .. } => body.args.first().copied(),
            _ => None,
        })
        .unwrap();
    assert_eq!(f.values[iv].ty, ValueType::Scalar(DType::I32));
    assert_eq!(f.values[iv].name.as_deref(), Some("k"));
}

#[test]
fn nested_control_flow_and_else_if() {
    let f = lower(
        "kernel k(x: tensor<f32, 1>, flip: i32) {
            let r = bid(0);
            let mut t = load(x, [r], [64]);
            let mut c = 0;
            for j in range(0, 10, 3) {
                for q in j..10 {
                    if flip > q { t = -t; } else if q == 3 { c += 1; } else { t = t * 0.5; }
                }
            }
            if flip == 0 { c = 5; }
            store(x, [r], t + (c as f32));
        }",
    );
    assert_eq!(count(&f, |o| matches!(o, Op::For { .. })), 2);
    assert_eq!(count(&f, |o| matches!(o, Op::If { .. })), 3);
    // 2 loop bodies + 3 ifs with two regions each.
    assert_eq!(count(&f, |o| matches!(o, Op::Yield(_))), 8);
    // The step is a constant 3.
    assert!(f
        .insts
        .iter()
        .any(|(_, i)| matches!(i.op, Op::Const(crate::types::Scalar::Int(3, DType::I32)))));
}

#[test]
fn constant_if_lowers_only_the_taken_branch() {
    let src = "kernel k<D: bool = true>(x: tensor<f32, 1>) {
        let mut t = load(x, [0], [8]);
        if D { t = t * 2.0; } else { t = t + 1.0; }
        if !D && true { t = exp(t); }
        store(x, [0], t);
    }";
    let f = lower(src);
    assert_eq!(count(&f, |o| matches!(o, Op::If { .. })), 0);
    assert_eq!(
        count(&f, |o| matches!(
            o,
            Op::Binary(crate::ir::BinaryOp::Mul, ..)
        )),
        1
    );
    assert_eq!(count(&f, |o| matches!(o, Op::Unary(..))), 0);
    let (f, _) = lower_with(src, &CompileOptions::new(Arch::Sm80).define("D", "false"));
    assert_eq!(
        count(&f, |o| matches!(
            o,
            Op::Binary(crate::ir::BinaryOp::Add, ..)
        )),
        1
    );
    assert_eq!(count(&f, |o| matches!(o, Op::Unary(..))), 1);
}

/// The loop a parameter turns off (`let mut rounds = 1; if P { rounds = ...; }`, then
/// `for r in 0..rounds`, here also `lo..hi` with `lo = 3, hi = 4`) is only its body,
/// the variable holding the start; with the parameter on, a literal `0..1`, or two
/// iterations, the loop stays.
#[test]
fn a_loop_a_parameter_turns_off_is_its_body() {
    let src = "kernel k<P: bool = false>(x: tensor<f32, 1>, n: i32) {
        let mut t = load(x, [0], [8]);
        let mut rounds = 1;
        if P { rounds = n; }
        for r in 0..rounds { t = t * 2.0; }
        let mut lo = 3;
        let mut hi = 4;
        for q in lo..hi { t = t + (q as f32); }
        for j in 0..1 { t = t - (j as f32); }
        store(x, [0], t);
    }";
    let f = lower(src);
    assert_eq!(count(&f, |o| matches!(o, Op::For { .. })), 1, "{f}");
    // q is the start, 3.
    assert!(
        f.insts.iter().any(|(_, i)| matches!(
            i.op,
            Op::Const(crate::types::Scalar::Float(c, DType::F32)) if c == 3.0
        )),
        "{f}"
    );
    let (f, _) = lower_with(src, &CompileOptions::new(Arch::Sm80).define("P", "true"));
    assert_eq!(count(&f, |o| matches!(o, Op::For { .. })), 2, "{f}");
    let f = lower(&src.replace("let mut hi = 4;", "let mut hi = 5;"));
    assert_eq!(count(&f, |o| matches!(o, Op::For { .. })), 2, "{f}");
}

#[test]
fn assignments_keep_the_variable_type() {
    let f = lower(&k("let mut t = zeros([8], f32);
         t = 1;
         t = 2.5;
         t = n as f32;
         let mut s: f32 = 0;
         s += 1;
         let mut u: u32 = 0xFFFFFFFF;
         u = u >> 1;
         store(x, [i], t + s);"));
    // `t = 1` and `t = 2.5` are splatted constants (scalar then splat), `n as f32` too.
    assert_eq!(
        result_types(&f, |o| matches!(o, Op::Splat(_))).len(),
        4,
        "{f}"
    );
    assert!(f.insts.iter().any(|(_, i)| matches!(
        i.op,
        Op::Const(crate::types::Scalar::Int(0xFFFF_FFFF, DType::U32))
    )));
}

#[test]
fn shadowing_and_value_names() {
    let f = lower(&k("let a = load(x, [i], [8]);
         let a = a * 2.0;
         let mut b = a;
         for j in 0..4 { let a = b + 1.0; b = a; }
         store(x, [i], b);"));
    let named: Vec<&str> = f
        .values
        .iter()
        .filter_map(|(_, v)| v.name.as_deref())
        .collect();
    for n in ["i", "n", "a", "b", "j"] {
        assert!(named.contains(&n), "{n} not in {named:?}");
    }
    assert_eq!(count(&f, |o| matches!(o, Op::For { .. })), 1);
}

#[test]
fn method_syntax_is_a_call() {
    let f = lower(&k(
        "let t = load(m, [i, 0], [2, 8]); let s = t.sum(1).max(axis = 0); let d = m.shape(0);",
    ));
    assert_eq!(count(&f, |o| matches!(o, Op::Reduce { .. })), 2);
    assert_eq!(count(&f, |o| matches!(o, Op::TensorDim { .. })), 1);
}

/// Every kernel shipped with the repository and every LANGUAGE.md example checks and
/// gives valid IR.
#[test]
fn bundled_user_and_documented_kernels_check() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut srcs = Vec::new();
    for d in ["kernels-src", "tests/user_kernels"] {
        let Ok(dir) = std::fs::read_dir(root.join(d)) else {
            continue;
        };
        for e in dir.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "kg") {
                srcs.push((
                    p.display().to_string(),
                    std::fs::read_to_string(&p).unwrap(),
                ));
            }
        }
    }
    if let Ok(doc) = std::fs::read_to_string(root.join("docs/LANGUAGE.md")) {
        for (i, block) in doc.split("```kg").skip(1).enumerate() {
            let code = block.split("```").next().unwrap_or("");
            srcs.push((format!("LANGUAGE.md example {i}"), code.to_string()));
        }
    }
    assert!(srcs.len() >= 15, "found only {} programs", srcs.len());
    for (name, text) in srcs {
        // An example of an error (`// error: E0206` first) must give that error.
        let expected = text
            .trim_start()
            .strip_prefix("// error: ")
            .and_then(|r| r.split_whitespace().next())
            .map(str::to_string);
        let file = SourceFile::new(name.clone(), text);
        let m = front::parse(&file).unwrap_or_else(|d| panic!("{name}: {}", d.render(&file)));
        for kern in &m.kernels {
            let opts = CompileOptions::new(Arch::Sm80).kernel(&kern.name.name);
            let result = super::lower_kernel(&m, &opts);
            if let Some(code) = &expected {
                match result {
                    Err(d) => assert!(d.0.iter().any(|x| x.code.code() == code), "{name}: {d:?}"),
                    Ok(_) => panic!("{name}: compiled, but it should give {code}"),
                }
                continue;
            }
            match result {
                Ok((f, _)) => {
                    if let Err(d) = crate::valid::validate(&f) {
                        panic!("{name}: invalid IR\n{}\n{f}", d.render(&file));
                    }
                }
                Err(d) => panic!("{name}: {}", d.render(&file)),
            }
        }
    }
}

/// `&&` / `||` with a compile-time `bool` on one side fold (`true || c` is `true`,
/// `false && c` is `false`, the other two are `c`), so an `if` on `FLAG || n == 1` with
/// `FLAG = true` is a constant `if`: only its branch is lowered.
#[test]
fn logical_operators_short_circuit_on_constants() {
    let src = |cond: &str| {
        format!(
            "kernel k<F: bool = true>(x: tensor<f32, 1>, n: i32) {{ \
             if {cond} {{ store(x, [0], full([4], 1.0)); }} \
             else {{ store(x, [1], full([4], 2.0)); }} }}"
        )
    };
    for (cond, ifs, stores) in [
        ("F || n == 1", 0, 1),
        ("n == 1 || F", 0, 1),
        ("!F && n == 1", 0, 1),
        ("n == 1 && !F", 0, 1),
        ("F && n == 1", 1, 2),
        ("!F || n == 1", 1, 2),
        ("n == 1 || n == 2", 1, 2),
    ] {
        let f = lower(&src(cond));
        assert_eq!(
            count(&f, |o| matches!(o, Op::If { .. })),
            ifs,
            "{cond}\n{f}"
        );
        assert_eq!(
            count(&f, |o| matches!(o, Op::Store { .. })),
            stores,
            "{cond}\n{f}"
        );
    }
}
