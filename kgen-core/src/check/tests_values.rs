//! Checker tests of constants and of the value builtins ports need: the typing rules of
//! constants that docs/LANGUAGE.md states (untyped constants adapt; typed constants keep
//! their dtype and fold), compile-time float values (`EPS: f32 = 1e-5`), `dtype(x)`,
//! `lowest` / `highest`, `item`, `maximum` / `minimum` and the ambiguous `max(t, 0)`,
//! reductions without an axis, `arange(n)`, `pow` and `**`, `erf`. Each test asserts
//! the IR (types, counts, folded values) or the error's code, span text and message.

use super::tests::compile_with;
use crate::abi::ConstArg;
use crate::diag::ErrorCode;
use crate::ir::{BinaryOp, Function, Op, ReduceOp, UnaryOp};
use crate::pipeline::CompileOptions;
use crate::span::SourceFile;
use crate::target::Arch;
use crate::types::{DType, Scalar, Shape, ValueType};

fn opts() -> CompileOptions {
    CompileOptions::new(Arch::Sm80)
}

fn lower_with(src: &str, o: &CompileOptions) -> Function {
    match compile_with(src, o) {
        Ok((f, _)) => {
            if let Err(d) = crate::valid::validate(&f) {
                panic!(
                    "invalid IR: {}\n{f}",
                    d.render(&SourceFile::new("t.kg", src))
                );
            }
            f
        }
        Err(d) => panic!(
            "unexpected errors:\n{}",
            d.render(&SourceFile::new("t.kg", src))
        ),
    }
}

fn lower(src: &str) -> Function {
    lower_with(src, &opts())
}

/// A kernel with the usual parameters around a body.
fn k(body: &str) -> String {
    format!(
        "kernel k<Z: int = 0>(x: tensor<f32, 1>, m: tensor<f32, 2>, xi: tensor<i32, 1>, \
         h: tensor<bf16, 1>, q: tensor<i64, 1>, n: i32, s: f32) {{ let i = bid(0); {body} }}"
    )
}

fn count(f: &Function, pred: impl Fn(&Op) -> bool) -> usize {
    f.insts.iter().filter(|(_, i)| pred(&i.op)).count()
}

/// The scalar constants the IR holds, in creation order.
fn consts(f: &Function) -> Vec<Scalar> {
    f.insts
        .iter()
        .filter_map(|(_, i)| match (&i.op, i.results.first()) {
            (Op::Const(s), Some(r)) if matches!(f.values[*r].ty, ValueType::Scalar(_)) => Some(*s),
            _ => None,
        })
        .collect()
}

/// The result type of the instruction defining the value stored by the last `store`.
fn stored_type(f: &Function) -> ValueType {
    let v = f
        .insts
        .iter()
        .filter_map(|(_, i)| match &i.op {
            Op::Store { value, .. } => Some(*value),
            _ => None,
        })
        .last()
        .expect("a store");
    f.values[v].ty.clone()
}

fn errs_with(src: &str, o: &CompileOptions) -> Vec<(ErrorCode, String, String, Vec<String>)> {
    match compile_with(src, o) {
        Ok((f, _)) => panic!("expected an error, got IR:\n{f}"),
        Err(d) => {
            d.0.iter()
                .map(|d| {
                    let text = d
                        .primary_span()
                        .and_then(|s| src.get(s.range()))
                        .unwrap_or("")
                        .to_string();
                    (d.code, text, d.message.clone(), d.notes.clone())
                })
                .collect()
        }
    }
}

/// Exactly one error with this code and span text; returns (message, notes).
fn expect(src: &str, code: ErrorCode, span_text: &str) -> (String, Vec<String>) {
    expect_with(src, &opts(), code, span_text)
}

fn expect_with(
    src: &str,
    o: &CompileOptions,
    code: ErrorCode,
    span_text: &str,
) -> (String, Vec<String>) {
    let mut e = errs_with(src, o);
    assert_eq!(e.len(), 1, "expected one error, got {e:#?}");
    let (c, t, m, n) = e.remove(0);
    assert_eq!((c, t.as_str()), (code, span_text), "message: {m}");
    (m, n)
}

// ------------------------------------------------ the typing of constants

/// `let c = 0` is an untyped constant: it adapts at each use like the literal `0`, to any
/// integer or float dtype, and alone it is an `i32` (a float constant an `f32`).
#[test]
fn a_let_constant_adapts_like_a_literal() {
    let f = lower(&k(
        "let c = 3; let t = load(q, [i], [8]) + c; store(q, [i], t);
                      let u = load(h, [i], [8]) * c; store(h, [i], u);
                      store(xi, [i], load(xi, [i], [8]) - c);",
    ));
    let cs = consts(&f);
    assert!(cs.contains(&Scalar::Int(3, DType::I64)), "{cs:?}");
    assert!(cs.contains(&Scalar::Float(3.0, DType::BF16)), "{cs:?}");
    assert!(cs.contains(&Scalar::Int(3, DType::I32)), "{cs:?}");
    // `let mut` needs a concrete type: the default.
    let f = lower(&k("let mut c = 1.5; c += s; store(x, [i], full([8], c));"));
    assert_eq!(stored_type(&f), ValueType::Tile(DType::F32, Shape(vec![8])));
}

/// An integer constant must fit the integer dtype it meets, as a signed or an unsigned
/// bit pattern (`0xFFFFFFFF` is -1 as an `i32`); the untyped range is i64::MIN..=u64::MAX.
#[test]
fn integer_constants_fit_their_dtype_as_a_bit_pattern() {
    let f = lower(&k("store(xi, [i], load(xi, [i], [8]) + 0xFFFFFFFF);"));
    assert!(consts(&f).contains(&Scalar::Int(-1, DType::I32)));
    let (m, _) = expect(
        &k("store(xi, [i], load(xi, [i], [8]) + 0x100000000);"),
        ErrorCode::ConstEval,
        "0x100000000",
    );
    assert!(m.contains("does not fit in `i32`"), "{m}");
    expect(
        &k("store(xi, [i], load(xi, [i], [8]) + (-2147483648 - 1));"),
        ErrorCode::ConstEval,
        "(-2147483648 - 1)",
    );
    // u64::MAX is a constant; one more is not.
    let f = lower(&k(
        "let c = 0xFFFFFFFFFFFFFFFF; store(q, [i], load(q, [i], [8]) & c);",
    ));
    assert!(consts(&f).contains(&Scalar::Int(-1, DType::I64)));
    expect(
        &k("let c = 0xFFFFFFFFFFFFFFFF + 1;"),
        ErrorCode::ConstEval,
        "0xFFFFFFFFFFFFFFFF + 1",
    );
}

/// A float constant adapts to float dtypes only; constants fold in f64 before they
/// meet a dtype (`1.0 / 3.0` rounds once, to the dtype it meets).
#[test]
fn float_constants_adapt_to_floats_only_and_fold_in_f64() {
    let (m, _) = expect(
        &k("store(xi, [i], load(xi, [i], [8]) + 0.5);"),
        ErrorCode::TypeMismatch,
        "0.5",
    );
    assert!(m.contains("cannot be used as `i32`"), "{m}");
    let f = lower(&k("store(h, [i], load(h, [i], [8]) * (1.0 / 3.0));"));
    let third = half::bf16::from_f64(1.0 / 3.0).to_f64();
    assert!(consts(&f).contains(&Scalar::Float(third, DType::BF16)));
}

/// `pad` (and `other`) is a constant: an untyped constant that adapts to the tensor's
/// dtype (and fits it), or a typed constant of that dtype; never a runtime value.
#[test]
fn pad_is_a_constant_of_the_tensors_dtype() {
    let f = lower(&k("store(xi, [i], load(xi, [i], [8], pad = 0xFFFFFFFF));"));
    let pad = f.insts.iter().find_map(|(_, i)| match &i.op {
        Op::Load { padding, .. } => Some(*padding),
        _ => None,
    });
    assert_eq!(pad, Some(Scalar::Int(-1, DType::I32)));
    let f = lower(&k("store(h, [i], load(h, [i], [8], pad = lowest(bf16)));"));
    let pad = f.insts.iter().find_map(|(_, i)| match &i.op {
        Op::Load { padding, .. } => Some(*padding),
        _ => None,
    });
    assert_eq!(pad, Some(Scalar::Float(f64::NEG_INFINITY, DType::BF16)));
    expect(
        &k("store(x, [i], load(x, [i], [8], pad = s));"),
        ErrorCode::NotConstant,
        "s",
    );
    let (m, n) = expect(
        &k("store(h, [i], load(h, [i], [8], pad = lowest(f32)));"),
        ErrorCode::TypeMismatch,
        "lowest(f32)",
    );
    assert_eq!(m, "`pad` is a `f32` constant, but the tensor holds `bf16`");
    assert!(n[0].contains("as bf16"), "{n:?}");
    expect(
        &k("store(xi, [i], load(xi, [i], [8], pad = 0.5));"),
        ErrorCode::TypeMismatch,
        "0.5",
    );
}

/// A cast of a constant is a typed constant: it keeps its dtype (`0 as i64` never meets
/// an `i32`) and operations on it fold with the dtype's arithmetic.
#[test]
fn typed_constants_keep_their_dtype_and_fold() {
    let (m, _) = expect(
        &k("store(xi, [i], load(xi, [i], [8]) + (0 as i64));"),
        ErrorCode::TypeMismatch,
        "load(xi, [i], [8]) + (0 as i64)",
    );
    assert!(m.contains("mismatched dtypes"), "{m}");
    // i32 wraps; bf16 rounds after the operation; comparisons give constant bools.
    let f = lower(&k(
        "let w = highest(i32) + 1; store(xi, [i], full([8], w));
                      let b = (1.0 as bf16) + 0.001; store(h, [i], full([8], b));
                      static_assert(lowest(i32) < 0 && -(1 as i32) == (0xFFFFFFFF as i32));",
    ));
    assert_eq!(count(&f, |o| matches!(o, Op::Binary(..))), 0, "{f}");
    let cs = consts(&f);
    assert!(
        cs.contains(&Scalar::Int(i32::MIN as i64, DType::I32)),
        "{cs:?}"
    );
    assert!(cs.contains(&Scalar::Float(1.0, DType::BF16)), "{cs:?}");
}

// ------------------------------------------------ compile-time float values

#[test]
fn float_generics_are_typed_constants_and_spell_the_entry() {
    let src = "kernel k<EPS: f32 = 1e-5, H: bf16 = 0.1>(x: tensor<f32, 1>, h: tensor<bf16, 1>) {
        static_assert(EPS > 0.0, \"positive\");
        store(x, [bid(0)], load(x, [bid(0)], [8], pad = EPS) + EPS * 2.0);
        store(h, [bid(0)], load(h, [bid(0)], [8]) * H);
    }";
    let (f, spec) = compile_with(src, &opts()).expect("compiles");
    assert_eq!(
        spec.consts,
        vec![
            (
                "EPS".to_string(),
                ConstArg::Float(DType::F32, 1e-5f32.to_bits())
            ),
            (
                "H".to_string(),
                ConstArg::Float(
                    DType::BF16,
                    (half::bf16::from_f64(0.1).to_f64() as f32).to_bits()
                )
            ),
        ]
    );
    assert!(
        f.name.starts_with("k__EPS_1em5__H_0p100097656__"),
        "{}",
        f.name
    );
    let cs = consts(&f);
    assert!(cs.contains(&Scalar::Float(
        (2e-5f32 as f64 / 2.0) as f32 as f64 * 2.0,
        DType::F32
    )));
    // static_assert sees the -D value.
    let e = errs_with(src, &opts().define("EPS", "-1"));
    assert_eq!(e[0].2, "static_assert failed: positive");
    let src = "kernel k<EPS: f32 = 1e-5>(x: tensor<f32, 1>) { store(x, [0], full([1], EPS)); }";
    // -D sets it, rounded to the dtype (f32 from the decimal directly).
    for (text, want) in [
        ("1e-6", 1e-6f32),
        ("3", 3.0),
        ("-inf", f32::NEG_INFINITY),
        ("0.1", 0.1),
    ] {
        let (_, spec) = compile_with(src, &opts().define("EPS", text)).expect("compiles");
        assert_eq!(
            spec.consts[0].1,
            ConstArg::Float(DType::F32, want.to_bits()),
            "{text}"
        );
    }
    let (_, spec) = compile_with(src, &opts().define("EPS", "nan")).expect("compiles");
    assert_eq!(spec.entry_name().split("__").nth(1), Some("EPS_NaN"));
    let (_, spec) = compile_with(src, &opts().define("EPS", "-2.5e-3")).expect("compiles");
    assert_eq!(spec.entry_name().split("__").nth(1), Some("EPS_m0p0025"));
    // A float generic keeps its dtype: an f32 EPS does not meet a bf16 tile.
    let (m, _) = expect(
        "kernel k<EPS: f32 = 1e-5>(h: tensor<bf16, 1>) { store(h, [0], load(h, [0], [8]) + EPS); }",
        ErrorCode::TypeMismatch,
        "load(h, [0], [8]) + EPS",
    );
    assert!(m.contains("`bf16` and `f32`"), "{m}");
}

#[test]
fn entry_names_of_float_values_are_ptx_identifiers() {
    let mut seen = std::collections::HashSet::new();
    for v in [
        1e-5f32,
        -1e-5,
        0.5,
        -0.5,
        0.0,
        -0.0,
        1e20,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        3.0,
        1.5e-38,
    ] {
        let spec = crate::abi::Specialization {
            kernel: "k".into(),
            consts: vec![("E".into(), ConstArg::float(DType::F32, v as f64))],
            num_warps: 4,
            min_blocks_per_sm: None,
            num_stages: None,
            tensor_align: vec![],
            no_tma: false,
            ws: false,
            tma_store: false,
            multicast: false,
            pingpong: false,
        };
        let name = spec.entry_name();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{name}"
        );
        assert!(seen.insert(name.clone()), "{name} twice");
    }
}

#[test]
fn float_generic_errors_say_what_is_wrong() {
    // `float` is a dtype kind: a number is not a dtype.
    let (m, n) = expect(
        "kernel k<EPS: float = 1e-5>(x: tensor<f32, 1>) { }",
        ErrorCode::BadSpecialization,
        "1e-5",
    );
    assert_eq!(
        m,
        "`EPS: float` declares a dtype, but its default is a number"
    );
    assert!(n[0].contains("`EPS: f32 = 1e-5`"), "{n:?}");
    let (m, n) = expect_with(
        "kernel k<T: float = f32>(x: tensor<T, 1>) { }",
        &opts().define("T", "1e-5"),
        ErrorCode::BadSpecialization,
        "f32",
    );
    assert!(m.contains("needs a float dtype"), "{m}");
    assert!(n[0].contains("`T: f32 = 1e-5`"), "{n:?}");
    let (m, _) = expect(
        "kernel k<EPS: f32 = true>(x: tensor<f32, 1>) { }",
        ErrorCode::BadSpecialization,
        "true",
    );
    assert!(m.contains("needs a `f32` value"), "{m}");
    let (m, _) = expect(
        "kernel k<EPS: f32 = 1.0 as f16>(x: tensor<f32, 1>) { }",
        ErrorCode::BadSpecialization,
        "1.0 as f16",
    );
    assert!(m.contains("needs a `f32` constant, got `f16`"), "{m}");
    let (m, _) = expect_with(
        "kernel k<EPS: f32 = 1e-5>(x: tensor<f32, 1>) { }",
        &opts().define("EPS", "tiny"),
        ErrorCode::BadSpecialization,
        "1e-5",
    );
    assert!(m.contains("got `tiny`, which is not a value"), "{m}");
}

// ------------------------------------------------ dtype, lowest, highest, item

#[test]
fn dtype_of_tensors_tiles_and_scalars() {
    let f = lower(&k("let t = load(h, [i], [8]);
                      let a = cast(load(x, [i], [8]), h.dtype);
                      let D = t.dtype;
                      let z = zeros([8], dtype(t)) + a + (s as D) + full([8], lowest(dtype(n)) as D);
                      store(h, [i], z);"));
    assert_eq!(
        stored_type(&f),
        ValueType::Tile(DType::BF16, Shape(vec![8]))
    );
    let (m, _) = expect(&k("let d = dtype(1.5);"), ErrorCode::WrongKind, "1.5");
    assert!(m.contains("has no dtype"), "{m}");
}

#[test]
fn lowest_and_highest_are_the_identities_of_max_and_min() {
    let f = lower(&k("let a = lowest(f32); let b = highest(bf16); let c = lowest(i32);
                      let d = highest(i32); let e = lowest(u32); let g = highest(u32);
                      let p = lowest(i64); let r = highest(i64); let t = lowest(bool); let u = highest(bool);
                      store(x, [i], full([1], a + (b as f32) + (c as f32) + (d as f32) + (e as f32)
                          + (g as f32) + (p as f32) + (r as f32) + (t as f32) + (u as f32)));"));
    let cs = consts(&f);
    for want in [
        Scalar::Float(f64::NEG_INFINITY, DType::F32),
        Scalar::Float(f64::INFINITY, DType::BF16),
        Scalar::Int(i32::MIN as i64, DType::I32),
        Scalar::Int(i32::MAX as i64, DType::I32),
        Scalar::Int(0, DType::U32),
        Scalar::Int(u32::MAX as i64, DType::U32),
        Scalar::Int(i64::MIN, DType::I64),
        Scalar::Int(i64::MAX, DType::I64),
        Scalar::Bool(false),
        Scalar::Bool(true),
    ] {
        assert!(cs.contains(&want), "{want:?} not in {cs:?}");
    }
    expect(&k("let a = lowest(x);"), ErrorCode::WrongKind, "x");
}

#[test]
fn item_takes_the_one_element_of_a_tile() {
    let f = lower(&k(
        "let a = item(load(x, [i], [1])) + item(load(m, [i, 0], [1, 1]));
                      let b = item(load(x, [i], [1]) > 0.0);
                      store(x, [i], full([4], where(b, a, 0.0)));",
    ));
    // One reduction each, none over more than one element.
    assert_eq!(
        count(&f, |o| matches!(
            o,
            Op::Reduce {
                op: ReduceOp::Max,
                ..
            }
        )),
        3
    );
    for (_, inst) in f.insts.iter() {
        if let Op::Reduce { value, .. } = inst.op {
            assert_eq!(
                f.values[value].ty.shape().map(|s| s.num_elements()),
                Some(1)
            );
        }
    }
    let (m, _) = expect(
        &k("let a = item(load(x, [i], [4]));"),
        ErrorCode::ShapeMismatch,
        "load(x, [i], [4])",
    );
    assert_eq!(
        m,
        "`item` needs a tile of exactly one element, found [4] (4 elements)"
    );
    expect(&k("let a = item(s);"), ErrorCode::WrongKind, "s");
}

// ------------------------------------------------ max, maximum, reductions

#[test]
fn maximum_and_minimum_are_element_wise_and_constants_adapt() {
    let f = lower(&k("store(xi, [i], maximum(load(xi, [i], [8]), 0));
                      store(x, [i], minimum(load(x, [i], [8]), 0) + maximum(0.5, load(x, [i], [8])));"));
    assert_eq!(count(&f, |o| matches!(o, Op::Binary(BinaryOp::Max, ..))), 2);
    assert_eq!(count(&f, |o| matches!(o, Op::Binary(BinaryOp::Min, ..))), 1);
    assert_eq!(count(&f, |o| matches!(o, Op::Reduce { .. })), 0);
    let cs = consts(&f);
    assert!(
        cs.contains(&Scalar::Int(0, DType::I32)) && cs.contains(&Scalar::Float(0.0, DType::F32))
    );
    // Two values stay element-wise with `max` too: a runtime scalar, a float constant.
    let f = lower(&k(
        "store(x, [i], max(load(x, [i], [8]), s) + min(load(x, [i], [8]), 0.0) + max(s, 1));",
    ));
    assert_eq!(count(&f, |o| matches!(o, Op::Reduce { .. })), 0);
    expect(
        &k("let a = maximum(load(x, [i], [8]));"),
        ErrorCode::BadArguments,
        "maximum(load(x, [i], [8]))",
    );
    let e = errs_with(&k("let a = maximum(load(x, [i], [8]), axis = 0);"), &opts());
    assert_eq!((e[0].0, e[0].1.as_str()), (ErrorCode::BadArguments, "axis"));
    assert!(
        e[0].3.iter().any(|n| n.contains("`max(x, axis = ...)`")),
        "{e:?}"
    );
}

#[test]
fn max_of_a_tile_and_an_integer_constant_is_ambiguous() {
    for (body, span, reduce, elementwise) in [
        (
            "let v = load(x, [i], [8]); let r = max(v, 0);",
            "max(v, 0)",
            "max(v, axis = 0)",
            "maximum(v, 0)",
        ),
        (
            "let v = load(x, [i], [8]); let c = 0; let r = min(v, c);",
            "min(v, c)",
            "min(v, axis = c)",
            "minimum(v, c)",
        ),
        (
            "let r = load(m, [i, 0], [2, 8]).max(Z);",
            "load(m, [i, 0], [2, 8]).max(Z)",
            "load(m, [i, 0], [2, 8]).max(axis = Z)",
            "load(m, [i, 0], [2, 8]).maximum(Z)",
        ),
        (
            "let r = (load(x, [i], [8]) * 2.0).min(1);",
            "(load(x, [i], [8]) * 2.0).min(1)",
            "(load(x, [i], [8]) * 2.0).min(axis = 1)",
            "(load(x, [i], [8]) * 2.0).minimum(1)",
        ),
    ] {
        let (m, n) = expect(&k(body), ErrorCode::AmbiguousCall, span);
        assert!(m.contains("is ambiguous"), "{m}");
        assert!(n[0].contains(&format!("`{reduce}`")), "{n:?}");
        assert!(n[1].contains(&format!("`{elementwise}`")), "{n:?}");
    }
}

#[test]
fn reductions_without_an_axis_reduce_every_element() {
    let f = lower(&k(
        "let v = load(x, [i], [8]); let t = load(m, [i, 0], [4, 8]);
                      let a = sum(v) + max(v) + v.min() + sum(t) + max(t) + t.min();
                      let b = argmax(t) + argmin(v);
                      store(x, [i], full([1], a + (b as f32)));",
    ));
    let reds: Vec<(ReduceOp, ValueType)> = f
        .insts
        .iter()
        .filter_map(|(_, i)| match i.op {
            Op::Reduce { op, value, .. } => Some((op, f.values[value].ty.clone())),
            _ => None,
        })
        .collect();
    let flat8 = ValueType::Tile(DType::F32, Shape(vec![8]));
    let flat32 = ValueType::Tile(DType::F32, Shape(vec![32]));
    assert_eq!(
        reds,
        vec![
            (ReduceOp::Sum, flat8.clone()),
            (ReduceOp::Max, flat8.clone()),
            (ReduceOp::Min, flat8.clone()),
            (ReduceOp::Sum, flat32.clone()),
            (ReduceOp::Max, flat32.clone()),
            (ReduceOp::Min, flat32.clone()),
            (ReduceOp::ArgMax, flat32),
            (ReduceOp::ArgMin, flat8),
        ]
    );
}

#[test]
fn arange_with_one_argument_starts_at_zero() {
    let f = lower(&k(
        "store(xi, [i], arange(8) + arange(0, 8) + arange(Z, 8));",
    ));
    let ranges: Vec<(i64, i64)> = f
        .insts
        .iter()
        .filter_map(|(_, i)| match i.op {
            Op::Arange { start, end } => Some((start, end)),
            _ => None,
        })
        .collect();
    assert_eq!(ranges, vec![(0, 8), (0, 8), (0, 8)]);
    expect(
        &k("let a = arange(0);"),
        ErrorCode::BadTileShape,
        "arange(0)",
    );
}

// ------------------------------------------------ pow, **, erf

#[test]
fn float_powers_are_pow_and_integer_powers_multiply() {
    let f = lower(&k(
        "store(x, [i], load(x, [i], [8]) ** 2 + pow(load(x, [i], [8]), 0.5) + 2.0 ** s);",
    ));
    assert_eq!(count(&f, |o| matches!(o, Op::Binary(BinaryOp::Pow, ..))), 3);
    // x ** 5: square, square, multiply (5 = 101b); x ** 0 is 1; x ** 1 is x.
    let f = lower(&k("store(xi, [i], load(xi, [i], [8]) ** 5 + load(xi, [i], [8]) ** 0 + load(xi, [i], [8]) ** 1);"));
    assert_eq!(count(&f, |o| matches!(o, Op::Binary(BinaryOp::Mul, ..))), 3);
    assert_eq!(count(&f, |o| matches!(o, Op::Binary(BinaryOp::Pow, ..))), 0);
    // Constants fold (in shapes too); a typed integer constant folds wrapping.
    let f = lower(&k(
        "store(x, [i], zeros([2 ** 3], f32) + 2.0 ** -1 + ((3 as i32) ** 21) as f32);",
    ));
    assert_eq!(
        count(&f, |o| matches!(
            o,
            Op::Binary(BinaryOp::Mul | BinaryOp::Pow, ..)
        )),
        0
    );
    let cs = consts(&f);
    assert!(cs.contains(&Scalar::Float(0.5, DType::F32)), "{cs:?}");
    assert!(
        cs.contains(&Scalar::Float(
            3i32.wrapping_pow(21) as f32 as f64,
            DType::F32
        )),
        "{cs:?}"
    );
}

#[test]
fn integer_powers_need_a_constant_non_negative_exponent() {
    let (m, n) = expect(&k("let a = 2 ** n;"), ErrorCode::NotConstant, "n");
    assert_eq!(m, "an integer power `**` needs a compile-time exponent");
    assert!(n.iter().any(|h| h.contains("`1 << n`")), "{n:?}");
    let (m, _) = expect(
        &k("let a = load(xi, [i], [8]) ** -1;"),
        ErrorCode::ConstEval,
        "-1",
    );
    assert!(m.contains("at least 0"), "{m}");
    let (m, _) = expect(
        &k("let a = pow(load(xi, [i], [8]), 0.5);"),
        ErrorCode::TypeMismatch,
        "0.5",
    );
    assert!(m.contains("needs an integer exponent"), "{m}");
    let (m, n) = expect(&k("let a = 2 ** -1;"), ErrorCode::ConstEval, "2 ** -1");
    assert!(m.contains("at least 0"), "{m}");
    assert!(n[0].contains("`2.0 ** -1`"), "{n:?}");
    expect(&k("let a = 10 ** 20;"), ErrorCode::ConstEval, "10 ** 20");
}

#[test]
fn erf_is_a_float_unary_op() {
    let f = lower(&k(
        "store(h, [i], erf(load(h, [i], [8])) * 2.0); store(x, [i], full([8], erf(s) + erf(1)));",
    ));
    assert_eq!(count(&f, |o| matches!(o, Op::Unary(UnaryOp::Erf, _))), 3);
    let (m, _) = expect(
        &k("let a = erf(load(xi, [i], [8]));"),
        ErrorCode::TypeMismatch,
        "load(xi, [i], [8])",
    );
    assert!(m.contains("`erf` needs a float"), "{m}");
}
