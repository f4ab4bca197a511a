//! Checker error tests: one or more per error code the checker emits, each asserting the
//! code, the text under the primary span and the message; several errors reported
//! together; poison suppressing follow-on errors. Robustness tests are in
//! `tests_robust.rs`.

use super::tests::compile_with;
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast;
use crate::pipeline::CompileOptions;
use crate::target::Arch;

/// (code, text under the primary span, message) of every error.
fn errs_with(src: &str, opts: &CompileOptions) -> Vec<(ErrorCode, String, String)> {
    match compile_with(src, opts) {
        Ok((f, _)) => panic!("expected an error, got IR:\n{f}"),
        Err(d) => {
            d.0.iter()
                .map(|d: &Diagnostic| {
                    let text = d
                        .primary_span()
                        .and_then(|s| src.get(s.range()))
                        .unwrap_or("")
                        .to_string();
                    (d.code, text, d.message.clone())
                })
                .collect()
        }
    }
}

fn errs(src: &str) -> Vec<(ErrorCode, String, String)> {
    errs_with(src, &CompileOptions::new(Arch::Sm80))
}

/// Exactly one error: its code, span text and message.
fn err1(src: &str) -> (ErrorCode, String, String) {
    let mut e = errs(src);
    assert_eq!(e.len(), 1, "expected one error, got {e:#?}");
    e.remove(0)
}

/// Asserts one error with this code and span text, and returns its message.
fn expect(src: &str, code: ErrorCode, span_text: &str) -> String {
    let (c, t, m) = err1(src);
    assert_eq!((c, t.as_str()), (code, span_text), "message: {m}");
    m
}

fn k(body: &str) -> String {
    format!(
        "kernel k<B: int = 128>(x: tensor<f32, 1>, m: tensor<f32, 2>, xi: tensor<i32, 1>, h: tensor<f16, 1>, n: i32) {{ let i = bid(0); {body} }}"
    )
}

fn full_diag(src: &str) -> Diagnostic {
    match compile_with(src, &CompileOptions::new(Arch::Sm80)) {
        Ok(_) => panic!("expected an error"),
        Err(d) => d.0.into_iter().next().expect("one diagnostic"),
    }
}

#[test]
fn undefined_name() {
    let m = expect(&k("let a = zz;"), ErrorCode::UndefinedName, "zz");
    assert!(m.contains("cannot find `zz`"), "{m}");
    let d = full_diag(&k("let block_id = 0; let a = block_ix;"));
    assert!(
        d.notes.iter().any(|n| n.contains("`block_id`")),
        "{:?}",
        d.notes
    );
    expect(&k("zz = 1;"), ErrorCode::UndefinedName, "zz");
    let m = expect(&k("let a = n as f64;"), ErrorCode::UndefinedName, "f64");
    assert!(m.contains("unknown dtype"), "{m}");
    expect(
        "kernel k(x: tensor<T, 1>) { }",
        ErrorCode::UndefinedName,
        "T",
    );
    // A loop variable is gone after its loop.
    expect(
        &k("for j in 0..4 { } let a = j;"),
        ErrorCode::UndefinedName,
        "j",
    );
}

#[test]
fn redefinition() {
    let d = full_diag("kernel k<B: int = 1>(x: tensor<f32, 1>, B: i32) { }");
    assert_eq!(d.code, ErrorCode::Redefinition);
    assert_eq!(d.labels.len(), 2);
    assert_eq!(d.labels[1].message, "previous definition here");
    expect(
        "kernel k(x: tensor<f32, 1>, x: i32) { }",
        ErrorCode::Redefinition,
        "x",
    );
    expect(
        "kernel k<A: int = 1, A: int = 2>(x: tensor<f32, 1>) { }",
        ErrorCode::Redefinition,
        "A",
    );
}

#[test]
fn unknown_function() {
    let d = full_diag(&k("let a = expp(n as f32);"));
    assert_eq!(d.code, ErrorCode::UnknownFunction);
    assert!(d.notes.iter().any(|n| n.contains("`exp`")), "{:?}", d.notes);
    expect(
        &k("let a = frobnicate(1);"),
        ErrorCode::UnknownFunction,
        "frobnicate",
    );
    expect(&k("let a = n.foo();"), ErrorCode::UnknownFunction, "foo");
}

#[test]
fn bad_arguments() {
    let m = expect(
        &k("let a = load(x, [i]);"),
        ErrorCode::BadArguments,
        "load(x, [i])",
    );
    assert!(m.contains("takes 3 arguments, 2 given"), "{m}");
    expect(
        &k("let a = load(x, [i], [8], padding = 0.0);"),
        ErrorCode::BadArguments,
        "padding",
    );
    expect(
        &k("let a = load(x, [i], [8], pad = 0.0, pad = 1.0);"),
        ErrorCode::BadArguments,
        "pad",
    );
    expect(
        &k("let a = gather(x, mask = true, [arange(0, 4)]);"),
        ErrorCode::BadArguments,
        "[arange(0, 4)]",
    );
    expect(&k("let a = bid();"), ErrorCode::BadArguments, "bid()");
    expect(
        &k("let t = load(m, [i, 0], [2, 2]); let a = max(t, 1, axis = 0);"),
        ErrorCode::BadArguments,
        "max(t, 1, axis = 0)",
    );
    let e = errs(&k(
        "let t = load(x, [i], [8]); let a = sum(axis = 0, x = t);",
    ));
    assert_eq!((e[0].0, e[0].1.as_str()), (ErrorCode::BadArguments, "axis"));
}

#[test]
fn no_such_kernel() {
    let e = errs_with(
        "kernel a(x: tensor<f32, 1>) { }",
        &CompileOptions::new(Arch::Sm80).kernel("nope"),
    );
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].0, e[0].1.as_str()), (ErrorCode::NoSuchKernel, ""));
    let empty = ast::Module {
        kernels: vec![],
        functions: vec![],
    };
    let d = super::lower_kernel(&empty, &CompileOptions::new(Arch::Sm80)).unwrap_err();
    assert_eq!(d.0[0].code, ErrorCode::NoSuchKernel);
}

#[test]
fn type_mismatch() {
    let d = full_diag(&k("let a = load(x, [i], [8]) + load(h, [i], [8]);"));
    assert_eq!(d.code, ErrorCode::TypeMismatch);
    assert!(d.message.contains("`f32` and `f16`"), "{}", d.message);
    assert_eq!(d.labels.len(), 3, "primary + one label per operand");
    assert!(d.notes.iter().any(|n| n.contains(" as ")), "{:?}", d.notes);
    expect(
        &k("let a = load(xi, [i], [8]) * 1.5;"),
        ErrorCode::TypeMismatch,
        "1.5",
    );
    expect(
        &k("let a = exp(load(xi, [i], [8]));"),
        ErrorCode::TypeMismatch,
        "load(xi, [i], [8])",
    );
    expect(&k("let a = n && n;"), ErrorCode::TypeMismatch, "n && n");
    expect(
        &k("let a = (n as f32) & 1.0;"),
        ErrorCode::TypeMismatch,
        "(n as f32) & 1.0",
    );
    expect(
        &k("let a = (n > 0) + (n > 1);"),
        ErrorCode::TypeMismatch,
        "(n > 0) + (n > 1)",
    );
    expect(&k("let a = -(n > 0);"), ErrorCode::TypeMismatch, "-(n > 0)");
    expect(&k("let a = where(n, 1, 2);"), ErrorCode::TypeMismatch, "n");
    expect(
        &k("let a = fma(n, n, n);"),
        ErrorCode::TypeMismatch,
        "fma(n, n, n)",
    );
    expect(
        &k("let a = dot(load(m, [0, 0], [16, 16]), load(m, [0, 0], [16, 16]), zeros([16, 16], f16));"),
        ErrorCode::TypeMismatch,
        "zeros([16, 16], f16)",
    );
    expect(
        &k("let mut a = load(x, [i], [8]); a = load(xi, [i], [8]);"),
        ErrorCode::TypeMismatch,
        "load(xi, [i], [8])",
    );
    expect(
        &k("let mut a = n; a = 1.5;"),
        ErrorCode::TypeMismatch,
        "1.5",
    );
    expect(&k("let a: f32 = n;"), ErrorCode::TypeMismatch, "n");
    expect(&k("let a: i32 = 2.5;"), ErrorCode::TypeMismatch, "2.5");
    expect(
        &k("let a = gather(x, [arange(0, 4)], mask = arange(0, 4));"),
        ErrorCode::TypeMismatch,
        "arange(0, 4)",
    );
    expect(
        &k("let a = gather(x, [arange(0, 4) as f32]);"),
        ErrorCode::TypeMismatch,
        "arange(0, 4) as f32",
    );
    expect(
        &k("let a = sum(arange(0, 4) > 2, 0);"),
        ErrorCode::TypeMismatch,
        "arange(0, 4) > 2",
    );
    expect(
        &k("let a = load(xi, [i], [8], pad = 0.5);"),
        ErrorCode::TypeMismatch,
        "0.5",
    );
    expect(&k("static_assert(3, \"x\");"), ErrorCode::TypeMismatch, "3");
}

#[test]
fn wrong_kind() {
    let m = expect(&k("let a = x + 1.0;"), ErrorCode::WrongKind, "x");
    assert!(m.contains("the tensor `x`"), "{m}");
    expect(&k("let a = f32 + 1;"), ErrorCode::WrongKind, "f32");
    expect(&k("let a = zeros([4], 3);"), ErrorCode::WrongKind, "3");
    expect(&k("let a = load(n, [i], [4]);"), ErrorCode::WrongKind, "n");
    expect(
        &k("let a = full([4], load(x, [i], [4]));"),
        ErrorCode::WrongKind,
        "load(x, [i], [4])",
    );
    expect(
        &k("let a = store(x, [i], load(x, [i], [4]));"),
        ErrorCode::WrongKind,
        "store(x, [i], load(x, [i], [4]))",
    );
    expect(&k("let a = sum(n, 0);"), ErrorCode::WrongKind, "n");
    expect(&k("let a = n as B;"), ErrorCode::WrongKind, "B");
    expect(&k("let mut a = x;"), ErrorCode::WrongKind, "x");
    expect(&k("store(x, [i], 1.0);"), ErrorCode::WrongKind, "1.0");
}

#[test]
fn immutable_assign() {
    let d = full_diag(&k("let a = 1; a = 2;"));
    assert_eq!(d.code, ErrorCode::ImmutableAssign);
    assert_eq!(d.labels[1].message, "defined here");
    expect(&k("let a = 1; a = 2;"), ErrorCode::ImmutableAssign, "a");
    let m = expect(&k("n += 1;"), ErrorCode::ImmutableAssign, "n");
    assert!(m.contains("parameters are immutable"), "{m}");
    let m = expect(&k("x = 1;"), ErrorCode::ImmutableAssign, "x");
    assert!(m.contains("tensor parameter"), "{m}");
    let m = expect(&k("B = 1;"), ErrorCode::ImmutableAssign, "B");
    assert!(m.contains("compile-time parameter"), "{m}");
    // A `let` inside the body shadowing a parameter is an ordinary variable.
    let m = expect(&k("let n = 2; n = 3;"), ErrorCode::ImmutableAssign, "n");
    assert!(m.contains("immutable variable"), "{m}");
    expect(
        &k("for j in 0..2 { j = 1; }"),
        ErrorCode::ImmutableAssign,
        "j",
    );
}

#[test]
fn shape_mismatch() {
    let m = expect(
        &k("let a = load(x, [i], [8]) + load(x, [i], [4]);"),
        ErrorCode::ShapeMismatch,
        "load(x, [i], [8]) + load(x, [i], [4])",
    );
    assert!(m.contains("[8] and [4]"), "{m}");
    expect(
        &k("let a = reshape(load(x, [i], [8]), [3, 3]);"),
        ErrorCode::ShapeMismatch,
        "reshape(load(x, [i], [8]), [3, 3])",
    );
    expect(
        &k("let a = broadcast(load(m, [0, 0], [2, 3]), [4, 3]);"),
        ErrorCode::ShapeMismatch,
        "broadcast(load(m, [0, 0], [2, 3]), [4, 3])",
    );
    expect(
        &k("let a = dot(load(m, [0, 0], [16, 8]), load(m, [0, 0], [16, 16]), zeros([16, 16], f32));"),
        ErrorCode::ShapeMismatch,
        "dot(load(m, [0, 0], [16, 8]), load(m, [0, 0], [16, 16]), zeros([16, 16], f32))",
    );
    expect(
        &k("let a = gather(m, [arange(0, 4), arange(0, 8)]);"),
        ErrorCode::ShapeMismatch,
        "arange(0, 8)",
    );
    expect(
        &k("let a = where(arange(0, 3) > 1, load(x, [i], [4]), 0.0);"),
        ErrorCode::ShapeMismatch,
        "where(arange(0, 3) > 1, load(x, [i], [4]), 0.0)",
    );
}

#[test]
fn bad_axis() {
    let m = expect(
        &k("let a = sum(load(m, [0, 0], [2, 2]), 2);"),
        ErrorCode::BadAxis,
        "2",
    );
    assert!(m.contains("0..=1"), "{m}");
    expect(&k("let a = bid(3);"), ErrorCode::BadAxis, "3");
    expect(&k("let a = shape(x, 1);"), ErrorCode::BadAxis, "1");
    expect(
        &k("let a = expand_dims(arange(0, 4), 2);"),
        ErrorCode::BadAxis,
        "2",
    );
    expect(
        &k("let a = transpose(arange(0, 4));"),
        ErrorCode::BadAxis,
        "transpose(arange(0, 4))",
    );
    expect(
        &k("let a = permute(load(m, [0, 0], [2, 2]), [0, 0]);"),
        ErrorCode::BadAxis,
        "[0, 0]",
    );
    expect(
        &k("let a = max(arange(0, 4), axis = -1);"),
        ErrorCode::BadAxis,
        "-1",
    );
}

#[test]
fn bad_tile_shape() {
    let m = expect(
        &k("let a = load(x, [i], [0]);"),
        ErrorCode::BadTileShape,
        "[0]",
    );
    assert!(m.contains("at least 1"), "{m}");
    expect(
        &k("let a = zeros([1, 1, 1, 1], f32);"),
        ErrorCode::BadTileShape,
        "[1, 1, 1, 1]",
    );
    expect(&k("let a = zeros([], f32);"), ErrorCode::BadTileShape, "[]");
    expect(
        &k("let a = zeros([2048, 1024], f32);"),
        ErrorCode::BadTileShape,
        "[2048, 1024]",
    );
    expect(
        &k("let a = arange(5, 5);"),
        ErrorCode::BadTileShape,
        "arange(5, 5)",
    );
    expect(
        &k("let a = expand_dims(arange(0, 1024), 1) + expand_dims(arange(0, 2048), 0);"),
        ErrorCode::BadTileShape,
        "expand_dims(arange(0, 1024), 1) + expand_dims(arange(0, 2048), 0)",
    );
    expect(
        &k("let a = expand_dims(zeros([2, 2, 2], f32), 0);"),
        ErrorCode::BadTileShape,
        "expand_dims(zeros([2, 2, 2], f32), 0)",
    );
    expect(
        "kernel k(x: tensor<f32, 5>) { }",
        ErrorCode::BadTileShape,
        "5",
    );
    expect(
        "kernel k(x: tensor<f32, [0]>) { }",
        ErrorCode::BadTileShape,
        "0",
    );
}

#[test]
fn not_constant() {
    let m = expect(
        &k("let a = load(x, [i], [n]);"),
        ErrorCode::NotConstant,
        "n",
    );
    assert!(m.contains("compile-time constant"), "{m}");
    expect(
        &k("static_assert(n > 0, \"x\");"),
        ErrorCode::NotConstant,
        "n > 0",
    );
    expect(
        &k("let a = sum(arange(0, 4), n - n);"),
        ErrorCode::NotConstant,
        "n - n",
    );
    expect(&k("let a = arange(0, n);"), ErrorCode::NotConstant, "n");
    expect(
        &k("let a = load(x, [i], [4], pad = n as f32);"),
        ErrorCode::NotConstant,
        "n as f32",
    );
    expect(
        "kernel k(n: i32, x: tensor<f32, [n]>) { }",
        ErrorCode::NotConstant,
        "n",
    );
    expect(
        "kernel k<B: int = bid(0)>(x: tensor<f32, 1>) { }",
        ErrorCode::NotConstant,
        "bid(0)",
    );
}

#[test]
fn bad_specialization() {
    let m = expect(
        "kernel k<B: int>(x: tensor<f32, 1>) { }",
        ErrorCode::BadSpecialization,
        "B",
    );
    assert!(m.contains("has no value"), "{m}");
    expect(
        "kernel k<T: float = i32>(x: tensor<T, 1>) { }",
        ErrorCode::BadSpecialization,
        "i32",
    );
    expect(
        "kernel k<F: bool = 1>(x: tensor<f32, 1>) { }",
        ErrorCode::BadSpecialization,
        "1",
    );
    let src = "kernel k<B: int = 4>(x: tensor<f32, 1>) { }";
    let e = errs_with(src, &CompileOptions::new(Arch::Sm80).define("C", 3));
    assert_eq!(
        (e[0].0, e[0].1.as_str()),
        (ErrorCode::BadSpecialization, "")
    );
    assert!(e[0].2.contains("`-D C`"), "{}", e[0].2);
    let e = errs_with(src, &CompileOptions::new(Arch::Sm80).define("B", "12abc"));
    assert_eq!(e[0].0, ErrorCode::BadSpecialization);
    let e = errs_with(src, &CompileOptions::new(Arch::Sm80).define("B", "f16"));
    assert_eq!(e[0].0, ErrorCode::BadSpecialization);
    let opts = CompileOptions {
        num_warps: Some(3),
        ..CompileOptions::new(Arch::Sm80)
    };
    let e = errs_with(src, &opts);
    assert_eq!(e[0].0, ErrorCode::BadSpecialization);
    let opts = CompileOptions {
        num_warps: Some(64),
        ..CompileOptions::new(Arch::Sm80)
    };
    assert_eq!(errs_with(src, &opts)[0].0, ErrorCode::BadSpecialization);
}

#[test]
fn static_assert() {
    let m = expect(
        "kernel k<B: int = 100>(x: tensor<f32, 1>) { static_assert(B % 32 == 0, \"B must be a multiple of 32\"); }",
        ErrorCode::StaticAssert,
        "B % 32 == 0",
    );
    assert_eq!(m, "static_assert failed: B must be a multiple of 32");
}

#[test]
fn const_eval() {
    let m = expect(
        &k("let a = load(x, [i], [B / 0]);"),
        ErrorCode::ConstEval,
        "B / 0",
    );
    assert!(m.contains("division by zero"), "{m}");
    expect(&k("let a = B % 0;"), ErrorCode::ConstEval, "B % 0");
    expect(&k("let a = 1 << 70;"), ErrorCode::ConstEval, "1 << 70");
    expect(
        &k("let a = 0xFFFFFFFFFFFFFFFF * 2;"),
        ErrorCode::ConstEval,
        "0xFFFFFFFFFFFFFFFF * 2",
    );
    expect(
        &k("let a = -0xFFFFFFFFFFFFFFFF;"),
        ErrorCode::ConstEval,
        "-0xFFFFFFFFFFFFFFFF",
    );
    expect(
        &k("let a = cdiv(1, 0);"),
        ErrorCode::ConstEval,
        "cdiv(1, 0)",
    );
    let m = expect(
        &k("let a = n + 5000000000;"),
        ErrorCode::ConstEval,
        "5000000000",
    );
    assert!(m.contains("does not fit in `i32`"), "{m}");
    expect(
        &k("let a: i32 = -3000000000;"),
        ErrorCode::ConstEval,
        "-3000000000",
    );
    expect(
        "kernel k<B: int = 0xFFFFFFFFFFFFFFFF>(x: tensor<f32, 1>) { }",
        ErrorCode::ConstEval,
        "0xFFFFFFFFFFFFFFFF",
    );
    expect(
        &k("for j in 0..5000000000 { }"),
        ErrorCode::ConstEval,
        "5000000000",
    );
}

#[test]
fn bad_access() {
    let m = expect(
        &k("let a = load(m, [i], [8]);"),
        ErrorCode::BadAccess,
        "[i]",
    );
    assert!(m.contains("2 dimension(s)"), "{m}");
    expect(
        &k("let a = load(m, [i, 0], [8]);"),
        ErrorCode::BadAccess,
        "[8]",
    );
    expect(
        &k("store(m, [i, 0], load(x, [i], [8]));"),
        ErrorCode::BadAccess,
        "load(x, [i], [8])",
    );
    expect(
        &k("let a = load(x, [n as f32], [8]);"),
        ErrorCode::BadAccess,
        "n as f32",
    );
    expect(
        &k("let a = load(x, [arange(0, 4)], [8]);"),
        ErrorCode::BadAccess,
        "arange(0, 4)",
    );
    expect(&k("let a = load(x, i, [8]);"), ErrorCode::BadAccess, "i");
    expect(
        &k("let a = gather(m, [arange(0, 4)]);"),
        ErrorCode::BadAccess,
        "[arange(0, 4)]",
    );
    expect(
        &k("let a = gather(x, [i]);"),
        ErrorCode::BadAccess,
        "gather(x, [i])",
    );
}

#[test]
fn bad_memory_op() {
    let m = expect(
        &k("store(h, [i], load(x, [i], [8]));"),
        ErrorCode::BadMemoryOp,
        "load(x, [i], [8])",
    );
    assert!(m.contains("`f32` tile into a `f16` tensor"), "{m}");
    expect(
        &k("let a = atomic_add(h, [arange(0, 4)], 1.0);"),
        ErrorCode::BadMemoryOp,
        "h",
    );
    expect(
        &k("scatter(xi, [arange(0, 4)], load(x, [i], [4]));"),
        ErrorCode::BadMemoryOp,
        "load(x, [i], [4])",
    );
}

#[test]
fn bad_control_flow() {
    let d = full_diag(&k("let a = load(x, [i], [8]); if a > 0.0 { }"));
    assert_eq!(d.code, ErrorCode::BadControlFlow);
    assert!(d.notes.iter().any(|n| n.contains("where")), "{:?}", d.notes);
    expect(&k("if n { }"), ErrorCode::BadControlFlow, "n");
    expect(&k("if 1 { }"), ErrorCode::BadControlFlow, "1");
    expect(
        &k("for j in range(0, 8, 0) { }"),
        ErrorCode::BadControlFlow,
        "0",
    );
    expect(
        &k("for j in range(0, 8, n) { }"),
        ErrorCode::BadControlFlow,
        "n",
    );
    expect(
        &k("for j in 0..(n as f32) { }"),
        ErrorCode::BadControlFlow,
        "(n as f32)",
    );
    expect(
        &k("for j in 0..arange(0, 4) { }"),
        ErrorCode::BadControlFlow,
        "arange(0, 4)",
    );
}

#[test]
fn several_errors_are_reported_together() {
    let e = errs(&k(
        "let a = zz; let b = foo(1); let c = load(x, [i], [0]); store(h, [i], load(x, [i], [4]));",
    ));
    let codes: Vec<ErrorCode> = e.iter().map(|e| e.0).collect();
    assert_eq!(
        codes,
        vec![
            ErrorCode::UndefinedName,
            ErrorCode::UnknownFunction,
            ErrorCode::BadTileShape,
            ErrorCode::BadMemoryOp
        ]
    );
    // Errors in a loop body are found even when the header is wrong; errors in both
    // branches of an `if` with a bad condition too.
    let codes: Vec<ErrorCode> = errs(&k(
        "for j in 0..1.5 { let a = zz + j; } if n { let b = yy; } else { let c = ww; }",
    ))
    .iter()
    .map(|e| e.0)
    .collect();
    assert_eq!(
        codes,
        vec![
            ErrorCode::BadControlFlow,
            ErrorCode::UndefinedName,
            ErrorCode::BadControlFlow,
            ErrorCode::UndefinedName,
            ErrorCode::UndefinedName
        ]
    );
}

#[test]
fn poison_silences_follow_on_errors() {
    // One error per root cause: uses of a failed binding are quiet.
    assert_eq!(
        errs(&k(
            "let a = zz; let b = a + 1; let c = sum(b, 0); store(x, [i], c * b);"
        ))
        .len(),
        1
    );
    assert_eq!(
        errs(&k("let mut t = zeros([4], f32); t = t + zz; t = t * 2.0; for j in 0..2 { t += qq; } store(x, [i], t);"))
            .len(),
        2
    );
    // A failed generic or parameter type is reported once, not at every use.
    assert_eq!(
        errs("kernel k<B: int = zz>(x: tensor<f32, [B]>, y: tensor<f32, 1>) { }").len(),
        1
    );
    assert_eq!(
        errs("kernel k(x: tensor<T, 1>, a: T) { let v = load(x, [0], [4]) + a; }").len(),
        2
    );
}

#[test]
fn dot_input_precision_names_a_precision_of_f32_operands() {
    let mm = "load(m, [0, 0], [16, 16])";
    let m = expect(
        &k(&format!(
            "let a = dot({mm}, {mm}, zeros([16, 16], f32), input_precision = tf33);"
        )),
        ErrorCode::BadArguments,
        "tf33",
    );
    assert_eq!(m, "`input_precision` must name a precision, not `tf33`");
    let d = full_diag(&k(&format!(
        "let a = dot({mm}, {mm}, zeros([16, 16], f32), input_precision = tf33);"
    )));
    let notes = d.notes.join("\n");
    assert!(notes.contains("ieee, tf32, tf32x3"), "{notes}");
    assert!(notes.contains("did you mean `tf32`?"), "{notes}");
    expect(
        &k(&format!(
            "let a = dot({mm}, {mm}, zeros([16, 16], f32), input_precision = 1);"
        )),
        ErrorCode::BadArguments,
        "1",
    );
    expect(
        &k(&format!(
            "let a = dot({mm}, {mm}, zeros([16, 16], f32), input_precision = tf32, input_precision = ieee);"
        )),
        ErrorCode::BadArguments,
        "input_precision",
    );
    let hh = "load(h, [0], [256]).reshape([16, 16])";
    let m = expect(
        &k(&format!(
            "let a = dot({hh}, {hh}, zeros([16, 16], f32), input_precision = tf32);"
        )),
        ErrorCode::TypeMismatch,
        "tf32",
    );
    assert_eq!(
        m,
        "`input_precision = tf32` applies to f32 operands only; these are `f16`"
    );
    let ii = "load(xi, [0], [256]).reshape([16, 16])";
    expect(
        &k(&format!(
            "let a = dot({ii}, {ii}, zeros([16, 16], i32), input_precision = tf32x3);"
        )),
        ErrorCode::TypeMismatch,
        "tf32x3",
    );
    // `ieee` is every dtype's default, so it may be written for any of them.
    let src = k(&format!(
        "let a = dot({hh}, {hh}, zeros([16, 16], f32), input_precision = ieee); \
         let b = dot({mm}, {mm}, zeros([16, 16], f32), input_precision = tf32);"
    ));
    assert!(super::tests::compile_with(&src, &CompileOptions::new(Arch::Sm80)).is_ok());
}
