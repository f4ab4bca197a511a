//! Checker tests: `.kg` snippets through the parser and checker, asserting on the IR and
//! on the error codes and spans.

use crate::diag::ErrorCode;
use crate::ir::Op;
use crate::span::SourceFile;
use crate::target::Arch;
use crate::{front, pipeline::CompileOptions};

fn lower(src: &str) -> Result<crate::ir::Function, crate::diag::Diagnostics> {
    let file = SourceFile::new("t.kg", src);
    let m = front::parse(&file)?;
    super::lower_kernel(&m, &CompileOptions::new(Arch::Sm80)).map(|(f, _)| f)
}

fn err_codes(src: &str) -> Vec<ErrorCode> {
    match lower(src) {
        Ok(f) => panic!("expected an error, got IR:\n{f}"),
        Err(d) => d.0.iter().map(|d| d.code).collect(),
    }
}

#[test]
fn vec_add_lowers_to_valid_ir() {
    let f = lower(
        "kernel k<T: float = f32, B: int = 256>(x: tensor<T, 1>, y: tensor<T, 1>) {
            let i = bid(0);
            store(y, [i], load(x, [i], [B]) * 2.0 + 1);
        }",
    )
    .unwrap();
    crate::valid::validate(&f).unwrap();
    assert!(f.name.starts_with("k__T_f32__B_256__w"), "{}", f.name);
    let text = f.to_string();
    assert!(text.contains("load @x"), "{text}");
    assert!(text.contains("store @y"), "{text}");
}

#[test]
fn loops_carry_mutable_tiles_and_scalars() {
    let f = lower(
        "kernel k(x: tensor<f32, 2>, y: tensor<f32, 1>) {
            let r = bid(0);
            let mut acc = zeros([1, 64], f32);
            let mut n = 0;
            for k in 0..cdiv(shape(x, 1), 64) {
                acc += load(x, [r, k], [1, 64]);
                n += 1;
            }
            if n > 2 { acc = acc * 2.0; } else { n = 3; }
            store(y, [r], sum(acc, 1) + full([1], n as f32));
        }",
    )
    .unwrap();
    crate::valid::validate(&f).expect("valid");
    let fors = f
        .insts
        .iter()
        .filter(|(_, i)| matches!(i.op, Op::For { .. }))
        .count();
    let ifs = f
        .insts
        .iter()
        .filter(|(_, i)| matches!(i.op, Op::If { .. }))
        .count();
    assert_eq!((fors, ifs), (1, 1), "{f}");
}

#[test]
fn broadcasting_is_explicit() {
    let f = lower(
        "kernel k(a: tensor<f32, 1>, o: tensor<f32, 2>) {
            let c = expand_dims(load(a, [0], [8]), 1);
            let r = expand_dims(load(a, [0], [4]), 0);
            store(o, [0, 0], c * r);
        }",
    )
    .unwrap();
    crate::valid::validate(&f).expect("valid");
    assert!(f.to_string().contains("broadcast"));
}

#[test]
fn error_codes() {
    let k = |body: &str| {
        format!(
            "kernel k(x: tensor<f32, 1>, y: tensor<i32, 1>, n: i32) {{ let i = bid(0); {body} }}"
        )
    };
    assert_eq!(err_codes(&k("let a = zz;")), vec![ErrorCode::UndefinedName]);
    assert_eq!(
        err_codes(&k("let a = foo(1);")),
        vec![ErrorCode::UnknownFunction]
    );
    assert_eq!(
        err_codes(&k("let a = load(x, [i]);")),
        vec![ErrorCode::BadArguments]
    );
    assert_eq!(
        err_codes(&k("let a = load(x, [i], [8]) + load(y, [i], [8]);")),
        vec![ErrorCode::TypeMismatch]
    );
    assert_eq!(
        err_codes(&k("let a = x + 1.0;")),
        vec![ErrorCode::WrongKind]
    );
    assert_eq!(
        err_codes(&k("let a = 1; a = 2;")),
        vec![ErrorCode::ImmutableAssign]
    );
    assert_eq!(
        err_codes(&k("let a = load(x, [i], [8]) + load(x, [i], [4]);")),
        vec![ErrorCode::ShapeMismatch]
    );
    assert_eq!(
        err_codes(&k("let a = sum(load(x, [i], [8]), 1);")),
        vec![ErrorCode::BadAxis]
    );
    assert_eq!(
        err_codes(&k("let a = load(x, [i], [0]);")),
        vec![ErrorCode::BadTileShape]
    );
    assert_eq!(
        err_codes(&k("let a = load(x, [i], [n]);")),
        vec![ErrorCode::NotConstant]
    );
    assert_eq!(
        err_codes(&k("static_assert(1 == 2, \"no\");")),
        vec![ErrorCode::StaticAssert]
    );
    assert_eq!(
        err_codes(&k("let a = load(x, [i], [8 / 0]);")),
        vec![ErrorCode::ConstEval]
    );
    assert_eq!(
        err_codes(&k("let a = load(x, [i, i], [8, 8]);")),
        vec![ErrorCode::BadAccess]
    );
    assert_eq!(
        err_codes(&k("store(y, [i], load(x, [i], [8]));")),
        vec![ErrorCode::BadMemoryOp]
    );
    assert_eq!(
        err_codes(&k("let mut a = load(x, [i], [8]); if a > 0.0 { a = a; }")),
        vec![ErrorCode::BadControlFlow]
    );
    // Several independent errors are reported together.
    assert_eq!(
        err_codes(&k("let a = zz; let b = foo(1);")),
        vec![ErrorCode::UndefinedName, ErrorCode::UnknownFunction]
    );
}
