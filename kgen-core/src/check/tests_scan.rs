//! Checker tests of the scans: the IR `cumsum` and friends lower to (op, axis, flags,
//! types, the text form), and one test per error the scan builtins report.

use super::tests::compile_with;
use crate::diag::ErrorCode;
use crate::ir::{Function, Op, ScanOp};
use crate::pipeline::CompileOptions;
use crate::target::Arch;
use crate::types::{DType, Shape, ValueType};

fn kernel(body: &str) -> String {
    format!(
        "kernel k<E: bool = true>(m: tensor<f32, 2>, xi: tensor<i32, 1>, h: tensor<f16, 1>, n: i32) {{ let i = bid(0); {body} }}"
    )
}

fn lower(body: &str) -> Function {
    let src = kernel(body);
    let f = match compile_with(&src, &CompileOptions::new(Arch::Sm80)) {
        Ok((f, _)) => f,
        Err(d) => panic!(
            "{}",
            d.render(&crate::span::SourceFile::new("t.kg", src.as_str()))
        ),
    };
    crate::valid::validate(&f).expect("valid IR");
    f
}

/// Every scan of `f`: (op, axis, reverse, exclusive, result type).
fn scans(f: &Function) -> Vec<(ScanOp, u8, bool, bool, ValueType)> {
    f.insts
        .iter()
        .filter_map(|(_, i)| match i.op {
            Op::Scan {
                op,
                axis,
                reverse,
                exclusive,
                value,
            } => {
                let ty = f.values[i.results[0]].ty.clone();
                assert_eq!(f.values[value].ty, ty, "a scan keeps its operand's type");
                Some((op, axis, reverse, exclusive, ty))
            }
            _ => None,
        })
        .collect()
}

fn tile(d: DType, dims: &[u32]) -> ValueType {
    ValueType::Tile(d, Shape(dims.to_vec()))
}

#[test]
fn every_spelling_lowers_to_one_scan() {
    let f = lower(
        "let t = load(m, [i, 0], [4, 100]);
         let a = cumsum(t, 1);
         let b = t.cummax(0, reverse = true);
         let c = cumprod(t, axis = 1, exclusive = E);
         let d = scan(t, 0, combine = min, reverse = true, exclusive = false);
         let v = load(xi, [i], [7]);
         let e = cumsum(v);
         let g = scan(v > 0, combine = xor);
         let w = scan(v, combine = and, exclusive = true);
         let hh = cummin(load(h, [i], [9]));
         store(m, [i, 0], a + b + c + d);",
    );
    let f32t = tile(DType::F32, &[4, 100]);
    assert_eq!(
        scans(&f),
        vec![
            (ScanOp::Add, 1, false, false, f32t.clone()),
            (ScanOp::Max, 0, true, false, f32t.clone()),
            (ScanOp::Mul, 1, false, true, f32t.clone()),
            (ScanOp::Min, 0, true, false, f32t),
            (ScanOp::Add, 0, false, false, tile(DType::I32, &[7])),
            (ScanOp::Xor, 0, false, false, tile(DType::Bool, &[7])),
            (ScanOp::And, 0, false, true, tile(DType::I32, &[7])),
            (ScanOp::Min, 0, false, false, tile(DType::F16, &[9])),
        ]
    );
    let text = f.to_string();
    assert!(text.contains("scan.max "), "{text}");
    assert!(text.contains(", axis 0, reverse\n"), "{text}");
    assert!(text.contains(", axis 1, exclusive\n"), "{text}");
}

/// (code, text under the primary span, message) of the one error `body` gives.
fn err(body: &str) -> (ErrorCode, String, String) {
    let src = kernel(body);
    match compile_with(&src, &CompileOptions::new(Arch::Sm80)) {
        Ok((f, _)) => panic!("expected an error, got IR:\n{f}"),
        Err(d) => {
            assert_eq!(d.0.len(), 1, "{d:?}");
            let d = &d.0[0];
            let text = d
                .primary_span()
                .and_then(|s| src.get(s.range()))
                .unwrap_or("")
                .to_string();
            (d.code, text, d.message.clone())
        }
    }
}

#[test]
fn errors() {
    let t = "let t = load(m, [i, 0], [4, 100]);";
    let cases: Vec<(String, ErrorCode, &str, &str)> = vec![
        (
            format!("{t} let s = cumsum(t > 0.0, 1);"),
            ErrorCode::TypeMismatch,
            "t > 0.0",
            "`cumsum` needs numbers, found `bool`",
        ),
        (
            format!("{t} let s = scan(t, 1, combine = xor);"),
            ErrorCode::TypeMismatch,
            "t",
            "`scan` with `combine = xor` needs integers or bool, found `f32`",
        ),
        (
            format!("{t} let s = cumsum(t, 2);"),
            ErrorCode::BadAxis,
            "2",
            "axis 2 is out of range 0..=1",
        ),
        (
            format!("{t} let s = cumsum(t);"),
            ErrorCode::BadArguments,
            "cumsum(t)",
            "`cumsum` of a rank-2 tile needs an axis",
        ),
        (
            format!("{t} let s = scan(t, 1);"),
            ErrorCode::BadArguments,
            "scan(t, 1)",
            "`scan` needs `combine = ...`",
        ),
        (
            format!("{t} let s = scan(t, 1, combine = sum);"),
            ErrorCode::BadArguments,
            "sum",
            "`combine` must name a combine op, not `sum`",
        ),
        (
            format!("{t} let s = scan(t, 1, combine = |a, b| a + b);"),
            ErrorCode::Syntax,
            "|",
            "",
        ),
        (
            format!("{t} let s = scan(t, 1, combine = max, combine = min);"),
            ErrorCode::BadArguments,
            "combine",
            "argument `combine` given twice",
        ),
        (
            format!("{t} let s = cumsum(t, 1, reverse = n > 0);"),
            ErrorCode::NotConstant,
            "n > 0",
            "`reverse` must be a compile-time constant",
        ),
        (
            format!("{t} let s = cumsum(t, 1, exclusive = 1);"),
            ErrorCode::WrongKind,
            "1",
            "`exclusive` must be `true` or `false`, found an integer constant",
        ),
        (
            format!("{t} let s = cumsum(t, 1, inclusive = true);"),
            ErrorCode::BadArguments,
            "inclusive",
            "`cumsum` has no argument named `inclusive`",
        ),
        (
            "let s = cumsum(n, 0);".to_string(),
            ErrorCode::WrongKind,
            "n",
            "expected a tile, found `i32`",
        ),
        (
            format!("{t} let s = cumsum(t, i);"),
            ErrorCode::NotConstant,
            "i",
            "the axis must be a compile-time constant",
        ),
    ];
    for (body, code, span, msg) in cases {
        if code == ErrorCode::Syntax {
            // A closure is not an expression of the language: the parser stops first.
            let src = kernel(&body);
            let file = crate::span::SourceFile::new("t.kg", src.as_str());
            let e = crate::front::parse(&file).expect_err("a syntax error");
            assert_eq!(e.0[0].code, ErrorCode::Syntax, "{body}");
            continue;
        }
        let (c, s, m) = err(&body);
        assert_eq!((c, s.as_str(), m.as_str()), (code, span, msg), "{body}");
    }
}
