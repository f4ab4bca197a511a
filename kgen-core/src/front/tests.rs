//! Unit tests of the `.kg` parser: the AST shape of every construct in
//! docs/LANGUAGE.md, spans, literal validation, nesting limits, and snapshots of the
//! rendered syntax errors (`src/front/snapshots/`).
//!
//! Expressions are compared through a compact S-expression form ([`sx`]), so that a
//! precedence test reads like the grouping it expects.

use super::ast::*;
use super::*;

fn file(src: &str) -> SourceFile {
    SourceFile::new("t.kg", src)
}

fn ok(src: &str) -> Module {
    match parse(&file(src)) {
        Ok(m) => m,
        Err(d) => panic!("expected a parse, got:\n{}", d.render(&file(src))),
    }
}

fn fail(src: &str) -> Diagnostics {
    match parse(&file(src)) {
        Ok(m) => panic!("expected an error, parsed:\n{m:#?}"),
        Err(d) => d,
    }
}

/// The rendered error text, as a user sees it.
fn rendered(src: &str) -> String {
    fail(src).render(&file(src))
}

/// The statements of `kernel k() { BODY }`.
fn body(stmts: &str) -> Vec<Stmt> {
    let m = ok(&format!("kernel k() {{\n{stmts}\n}}\n"));
    m.kernels.into_iter().next().expect("one kernel").body.stmts
}

/// The expression of `let _e = EXPR;` in S-expression form.
fn ex(expr: &str) -> String {
    match body(&format!("let e = {expr};")).as_slice() {
        [Stmt::Let { value, .. }] => sx(value),
        other => panic!("unexpected statements {other:?}"),
    }
}

fn sx(e: &Expr) -> String {
    match &e.kind {
        ExprKind::Int(v) => v.to_string(),
        ExprKind::Float(v) => format!("{v:?}"),
        ExprKind::Bool(b) => b.to_string(),
        ExprKind::Name(id) => id.name.clone(),
        ExprKind::Unary { op, operand } => {
            let o = match op {
                UnOp::Neg => "neg",
                UnOp::Not => "not",
            };
            format!("({o} {})", sx(operand))
        }
        ExprKind::Binary { op, lhs, rhs } => {
            format!("({} {} {})", op.symbol(), sx(lhs), sx(rhs))
        }
        ExprKind::Call {
            func,
            args,
            method_syntax,
        } => {
            let mut s = format!("({}{}", if *method_syntax { "." } else { "" }, func.name);
            for a in args {
                s.push(' ');
                if let Some(n) = &a.name {
                    s.push_str(&n.name);
                    s.push('=');
                }
                s.push_str(&sx(&a.value));
            }
            s + ")"
        }
        ExprKind::List(items) => {
            let v: Vec<String> = items.iter().map(sx).collect();
            format!("[{}]", v.join(" "))
        }
        ExprKind::Cast { expr, dtype } => format!("(as {} {})", sx(expr), dtype.name),
    }
}

fn text(src: &str, span: Span) -> &str {
    &src[span.range()]
}

const VEC_ADD: &str = "// kernels-src/vec_add.kg
kernel vec_add<T: float = f32, BLOCK: int = 1024>(
    x: tensor<T, 1, contiguous>,
    y: tensor<T, 1, contiguous>,
    out: tensor<T, 1, contiguous>,
) {
    let i = bid(0);                       // this block's index along grid axis 0
    let a = load(x, [i], [BLOCK]);        // elements i*BLOCK .. i*BLOCK+BLOCK, masked
    let b = load(y, [i], [BLOCK]);
    store(out, [i], a + b);               // out-of-bounds elements are not written
}
";

// ---------------------------------------------------------------- items

#[test]
fn vec_add_from_the_language_doc() {
    let m = ok(VEC_ADD);
    assert_eq!(m.kernels.len(), 1);
    let k = &m.kernels[0];
    assert_eq!(k.name.name, "vec_add");
    assert_eq!(k.generics.len(), 2);
    assert_eq!(k.params.len(), 3);
    assert_eq!(k.body.stmts.len(), 4);
    match &k.body.stmts[3] {
        Stmt::Expr(e) => assert_eq!(sx(e), "(store out [i] (+ a b))"),
        s => panic!("{s:?}"),
    }
    match &k.body.stmts[1] {
        Stmt::Let { value, .. } => assert_eq!(sx(value), "(load x [i] [BLOCK])"),
        s => panic!("{s:?}"),
    }
}

#[test]
fn generics_kinds_and_defaults() {
    let m = ok(
        "kernel k<T: float = bf16, B: int = 1024, N: int = B * 2, M: bool = false, \
                D: dtype, E: int,>() {}",
    );
    let g = &m.kernels[0].generics;
    let kinds: Vec<GenericKind> = g.iter().map(|g| g.kind).collect();
    use GenericKind::*;
    assert_eq!(kinds, [Float, Int, Int, Bool, DType, Int]);
    let defaults: Vec<Option<String>> = g.iter().map(|g| g.default.as_ref().map(sx)).collect();
    assert_eq!(
        defaults,
        [
            Some("bf16".into()),
            Some("1024".into()),
            Some("(* B 2)".into()),
            Some("false".into()),
            None,
            None
        ]
    );
}

#[test]
fn generic_default_may_compare_in_parentheses() {
    let m = ok("kernel k<A: int = 4, B: bool = (A > 2)>() {}");
    assert_eq!(
        sx(m.kernels[0].generics[1].default.as_ref().unwrap()),
        "(> A 2)"
    );
    // Without parentheses `>` closes the list when what follows cannot continue an
    // expression.
    let m = ok("kernel k<A: int = 4>() {}");
    assert_eq!(m.kernels[0].generics.len(), 1);
}

#[test]
fn empty_generics_params_and_body() {
    let m = ok("kernel k<>() {}");
    assert!(m.kernels[0].generics.is_empty() && m.kernels[0].params.is_empty());
    assert!(m.kernels[0].body.stmts.is_empty());
}

#[test]
fn params_tensor_forms_and_scalars() {
    let src = "kernel k(a: tensor<T, 2>, b: tensor<T, [_, D]>, c: tensor<f32, 2, contiguous>,
        d: tensor<T, [_, 2*D], contiguous>, e: tensor<i32, [4, _,],>, eps: f32, n: i32, al: T,) {}";
    let m = ok(src);
    let p = &m.kernels[0].params;
    assert_eq!(p.len(), 8);
    let t = |i: usize| match &p[i].ty {
        ParamType::Tensor(t) => t.clone(),
        ParamType::Scalar(s) => panic!("scalar {s:?}"),
    };
    assert!(matches!(t(0).dims, TensorDims::Rank(2, _)) && !t(0).contiguous);
    assert_eq!(t(0).elem.name, "T");
    match t(1).dims {
        TensorDims::List(l) => {
            assert!(matches!(l[0], DimSpec::Dynamic(_)));
            assert!(matches!(&l[1], DimSpec::Const(e) if sx(e) == "D"));
        }
        d => panic!("{d:?}"),
    }
    assert!(t(2).contiguous && t(2).elem.name == "f32");
    match t(3).dims {
        TensorDims::List(l) => assert!(matches!(&l[1], DimSpec::Const(e) if sx(e) == "(* 2 D)")),
        d => panic!("{d:?}"),
    }
    assert!(t(3).contiguous);
    assert!(matches!(&t(4).dims, TensorDims::List(l) if l.len() == 2));
    for (i, ty) in [(5, "f32"), (6, "i32"), (7, "T")] {
        assert!(
            matches!(&p[i].ty, ParamType::Scalar(id) if id.name == ty),
            "{i}"
        );
    }
    // Spans.
    assert_eq!(text(src, p[0].span), "a: tensor<T, 2>");
    assert_eq!(text(src, t(3).span), "tensor<T, [_, 2*D], contiguous>");
    match t(0).dims {
        TensorDims::Rank(_, sp) => assert_eq!(text(src, sp), "2"),
        d => panic!("{d:?}"),
    }
    match t(1).dims {
        TensorDims::List(l) => match &l[0] {
            DimSpec::Dynamic(sp) => assert_eq!(text(src, *sp), "_"),
            d => panic!("{d:?}"),
        },
        d => panic!("{d:?}"),
    }
}

#[test]
fn several_kernels() {
    let m = ok("kernel a() {}\n/* two */ kernel b(x: f32) { let y = x; }\n// end");
    let names: Vec<&str> = m.kernels.iter().map(|k| k.name.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn empty_file_has_no_kernels() {
    assert!(ok("").kernels.is_empty());
    assert!(ok("  // only a comment\n/* and another */")
        .kernels
        .is_empty());
}

// ---------------------------------------------------------------- statements

#[test]
fn let_forms() {
    let s = body("let a = 1; let mut b = 2.0; let c: f32 = 0.0; let mut d: bf16 = x;");
    let v: Vec<(String, bool, Option<String>)> = s
        .iter()
        .map(|s| match s {
            Stmt::Let {
                name, mutable, ty, ..
            } => (
                name.name.clone(),
                *mutable,
                ty.as_ref().map(|t| t.name.clone()),
            ),
            s => panic!("{s:?}"),
        })
        .collect();
    assert_eq!(
        v,
        [
            ("a".into(), false, None),
            ("b".into(), true, None),
            ("c".into(), false, Some("f32".into())),
            ("d".into(), true, Some("bf16".into())),
        ]
    );
}

#[test]
fn assignments_and_compound_assignments() {
    let s = body(
        "x = 1; x += 1; x -= 1; x *= 1; x /= 1; x %= 1; x &= 1; x |= 1; x ^= 1; x <<= 1; x >>= 1;",
    );
    let ops: Vec<Option<BinOp>> = s
        .iter()
        .map(|s| match s {
            Stmt::Assign { target, op, .. } => {
                assert_eq!(target.name, "x");
                *op
            }
            s => panic!("{s:?}"),
        })
        .collect();
    use BinOp::*;
    let want = [
        None,
        Some(Add),
        Some(Sub),
        Some(Mul),
        Some(Div),
        Some(Rem),
        Some(BitAnd),
        Some(BitOr),
        Some(BitXor),
        Some(Shl),
        Some(Shr),
    ];
    assert_eq!(ops, want);
}

#[test]
fn expression_statements_and_empty_statements() {
    let s = body("store(y, [i], v);; x == 3; f();");
    assert_eq!(s.len(), 3);
    assert!(matches!(&s[1], Stmt::Expr(e) if sx(e) == "(== x 3)"));
}

#[test]
fn for_loops() {
    let s = body(
        "for k in 0..cdiv(n, BLOCK) { acc += 1; }
         for i in range(0, n) {}
         for j in range(a, b, 2,) {}
         for q in x.shape(0)..n + 1 {}",
    );
    let v: Vec<(String, String, String, Option<String>, usize)> = s
        .iter()
        .map(|s| match s {
            Stmt::For {
                var,
                start,
                end,
                step,
                body,
                ..
            } => (
                var.name.clone(),
                sx(start),
                sx(end),
                step.as_ref().map(sx),
                body.stmts.len(),
            ),
            s => panic!("{s:?}"),
        })
        .collect();
    assert_eq!(
        v,
        [
            ("k".into(), "0".into(), "(cdiv n BLOCK)".into(), None, 1),
            ("i".into(), "0".into(), "n".into(), None, 0),
            ("j".into(), "a".into(), "b".into(), Some("2".into()), 0),
            ("q".into(), "(.shape x 0)".into(), "(+ n 1)".into(), None, 0),
        ]
    );
}

#[test]
fn for_needs_a_range() {
    for src in [
        "for i in n {}",
        "for i in range(n) {}",
        "for i in range(0, 1, 2, 3) {}",
        "for i in n.range(1) {}",
        "for i in range(0, n, step = 2) {}",
    ] {
        let d = fail(&format!("kernel k() {{ {src} }}"));
        assert_eq!(d.0[0].code, ErrorCode::Syntax, "{src}");
    }
}

#[test]
fn if_else_if_else() {
    let s = body("if a { x = 1; } else if b { x = 2; } else { x = 3; } if c {}");
    assert_eq!(s.len(), 2);
    let Stmt::If {
        cond,
        then_block,
        else_block: Some(eb),
        ..
    } = &s[0]
    else {
        panic!("{:?}", s[0]);
    };
    assert_eq!(sx(cond), "a");
    assert_eq!(then_block.stmts.len(), 1);
    // `else if` nests an `If` inside the else block.
    let [Stmt::If {
        cond,
        else_block: Some(inner_else),
        ..
    }] = eb.stmts.as_slice()
    else {
        panic!("{eb:?}");
    };
    assert_eq!(sx(cond), "b");
    assert_eq!(inner_else.stmts.len(), 1);
    assert!(matches!(
        &s[1],
        Stmt::If {
            else_block: None,
            ..
        }
    ));
}

#[test]
fn static_asserts() {
    let s = body(
        r#"static_assert(BLOCK % 32 == 0, "BLOCK must be a \"multiple\" of 32\n",); static_assert(N > 0);"#,
    );
    match &s[0] {
        Stmt::StaticAssert { cond, message, .. } => {
            assert_eq!(sx(cond), "(== (% BLOCK 32) 0)");
            assert_eq!(
                message.as_deref(),
                Some("BLOCK must be a \"multiple\" of 32\n")
            );
        }
        s => panic!("{s:?}"),
    }
    assert!(matches!(&s[1], Stmt::StaticAssert { message: None, .. }));
    let d = fail(r#"kernel k() { static_assert(1, "bad \q"); }"#);
    assert_eq!(d.0[0].code, ErrorCode::BadLiteral);
}

// ---------------------------------------------------------------- expressions

#[test]
fn precedence_is_rusts() {
    let cases = [
        ("a || b && c", "(|| a (&& b c))"),
        ("a && b == c", "(&& a (== b c))"),
        ("a == b | c", "(== a (| b c))"),
        ("a | b ^ c", "(| a (^ b c))"),
        ("a ^ b & c", "(^ a (& b c))"),
        ("a & b << c", "(& a (<< b c))"),
        ("a << b + c", "(<< a (+ b c))"),
        ("a >> b - c", "(>> a (- b c))"),
        ("a + b * c", "(+ a (* b c))"),
        ("a - b / c % d", "(- a (% (/ b c) d))"),
        ("a - b - c", "(- (- a b) c)"),
        ("a / b / c", "(/ (/ a b) c)"),
        ("a * b as f32", "(* a (as b f32))"),
        ("-a as f32", "(as (neg a) f32)"),
        ("-a * b", "(* (neg a) b)"),
        ("!a && b", "(&& (not a) b)"),
        ("--a", "(neg (neg a))"),
        ("-x.sum(0)", "(neg (.sum x 0))"),
        ("(a + b) * c", "(* (+ a b) c)"),
        ("a < b || c >= d", "(|| (< a b) (>= c d))"),
        ("a != b && c <= d", "(&& (!= a b) (<= c d))"),
        ("x as f32 as bf16", "(as (as x f32) bf16)"),
        ("a + b as i32 * c", "(+ a (* (as b i32) c))"),
        ("1 - -2", "(- 1 (neg 2))"),
        ("a<b", "(< a b)"),
        ("a<<b>>c", "(>> (<< a b) c)"),
    ];
    for (src, want) in cases {
        assert_eq!(ex(src), want, "{src}");
    }
}

#[test]
fn power_binds_tightest_groups_right_and_under_prefixes() {
    let cases = [
        ("a ** b", "(** a b)"),
        ("a**b", "(** a b)"),
        ("a ** b ** c", "(** a (** b c))"),
        ("-x ** 2", "(neg (** x 2))"),
        ("!x ** 2", "(not (** x 2))"),
        ("2 ** -x", "(** 2 (neg x))"),
        ("2 ** -x ** 2", "(** 2 (neg (** x 2)))"),
        ("a * b ** c", "(* a (** b c))"),
        ("a ** b * c", "(* (** a b) c)"),
        ("-a * b ** c", "(* (neg a) (** b c))"),
        ("(a ** b) ** c", "(** (** a b) c)"),
        ("(-x) ** 2", "(** (neg x) 2)"),
        ("x.sum(0) ** 2", "(** (.sum x 0) 2)"),
        ("-x.sum(0) ** 2", "(neg (** (.sum x 0) 2))"),
        ("a + b ** 2 < c", "(< (+ a (** b 2)) c)"),
        ("a * *b", "(* a (* b))"),
    ];
    for (src, want) in cases {
        if want.contains("(* b)") {
            // `* *` with a space is not `**`: a syntax error, not a power.
            assert!(parse(&file(&format!("kernel k() {{ let e = {src}; }}"))).is_err());
            continue;
        }
        assert_eq!(ex(src), want, "{src}");
    }
}

#[test]
fn a_cast_next_to_a_power_needs_parentheses() {
    for src in [
        "x as f32 ** 2",
        "2 ** x as f32",
        "-x as f32 ** 2",
        "a ** b ** c as i32",
    ] {
        let d = fail(&format!("kernel k() {{ let e = {src}; }}"));
        assert_eq!(
            d.0[0].message, "`as` cannot be mixed with `**` without parentheses",
            "{src}"
        );
    }
    assert_eq!(ex("(x as f32) ** 2"), "(** (as x f32) 2)");
    assert_eq!(ex("(2 ** x) as f32"), "(as (** 2 x) f32)");
}

#[test]
fn dtype_is_a_property_and_a_function() {
    assert_eq!(ex("x.dtype"), "(.dtype x)");
    assert_eq!(ex("x.dtype()"), "(.dtype x)");
    assert_eq!(ex("dtype(x)"), "(dtype x)");
    assert_eq!(ex("-x.dtype"), "(neg (.dtype x))");
    assert_eq!(
        ex("cast(y, load(t, [0], [4]).dtype)"),
        "(cast y (.dtype (load t [0] [4])))"
    );
    assert_eq!(ex("x.reshape([4]).dtype"), "(.dtype (.reshape x [4]))");
    // `a..b` (a range) and `x.f()` (a call) are not properties.
    assert!(matches!(
        body("for i in a..b { }").as_slice(),
        [Stmt::For { .. }]
    ));
}

#[test]
fn float_value_generics() {
    let m = ok("kernel k<EPS: f32 = 1e-5, H: f16 = 0.5, B: bf16 = -1, T: float = f32>() {}");
    let kinds: Vec<GenericKind> = m.kernels[0].generics.iter().map(|g| g.kind).collect();
    use crate::types::DType;
    assert_eq!(
        kinds,
        [
            GenericKind::FloatValue(DType::F32),
            GenericKind::FloatValue(DType::F16),
            GenericKind::FloatValue(DType::BF16),
            GenericKind::Float
        ]
    );
    let d = fail("kernel k<N: i32 = 3>() {}");
    assert_eq!(
        d.0[0].message,
        "a compile-time parameter cannot have the dtype `i32`"
    );
}

#[test]
fn comparisons_do_not_chain() {
    for src in ["a < b < c", "a == b == c", "a < b > c", "a == b != c"] {
        let d = fail(&format!("kernel k() {{ let e = {src}; }}"));
        assert_eq!(
            d.0[0].message, "comparison operators cannot be chained",
            "{src}"
        );
    }
    assert_eq!(ex("(a < b) == c"), "(== (< a b) c)");
    assert_eq!(ex("a < b && b < c"), "(&& (< a b) (< b c))");
}

#[test]
fn calls_methods_lists_and_keywords() {
    let cases = [
        ("f()", "(f)"),
        ("f(1,)", "(f 1)"),
        (
            "load(x, [i], [B], pad = -inf)",
            "(load x [i] [B] pad=(neg inf))",
        ),
        (
            "gather(t, [o0, o1,], mask = m, other = 0.0,)",
            "(gather t [o0 o1] mask=m other=0.0)",
        ),
        ("x.sum(1)", "(.sum x 1)"),
        ("a.b().c(1)", "(.c (.b a) 1)"),
        (
            "load(x, [r, k], [1, B]).reshape([B]) as f32",
            "(as (.reshape (load x [r k] [1 B]) [B]) f32)",
        ),
        ("[]", "[]"),
        ("[[1, 2], [3]]", "[[1 2] [3]]"),
        ("f(a == b)", "(f (== a b))"),
        ("(1.0).max(x)", "(.max 1.0 x)"),
        ("t.shape(0) * 2", "(* (.shape t 0) 2)"),
        ("cast(x, f32)", "(cast x f32)"),
    ];
    for (src, want) in cases {
        assert_eq!(ex(src), want, "{src}");
    }
}

#[test]
fn literals() {
    let cases = [
        ("42", "42"),
        ("0x2A", "42"),
        ("0X2a", "42"),
        ("1_000", "1000"),
        ("0xFFFF_FFFF", "4294967295"),
        ("18446744073709551615", "18446744073709551615"),
        ("1.0", "1.0"),
        ("1e-6", "1e-6"),
        ("2.5e3", "2500.0"),
        ("2.5E3", "2500.0"),
        ("1E+2", "100.0"),
        ("1_0.2_5", "10.25"),
        ("true", "true"),
        ("false", "false"),
        ("inf", "inf"),
        ("nan", "nan"),
    ];
    for (src, want) in cases {
        assert_eq!(ex(src), want, "{src}");
    }
}

#[test]
fn bad_literals() {
    for src in [
        "99999999999999999999999",
        "18446744073709551616",
        "0x1_0000_0000_0000_0000",
        "0x",
        "0xZZ",
        "12abc",
        "1.5f",
        "1e",
        "1e999",
        "1.0e",
    ] {
        let d = fail(&format!("kernel k() {{ let e = {src}; }}"));
        assert_eq!(d.0[0].code, ErrorCode::BadLiteral, "{src}");
        let sp = d.0[0].primary_span().unwrap();
        assert_eq!(sp.range().len(), src.len(), "{src}");
    }
    // `.5` and `1.` are not literals.
    assert_eq!(
        fail("kernel k() { let e = .5; }").0[0].code,
        ErrorCode::Syntax
    );
    assert_eq!(
        fail("kernel k() { let e = 1.; }").0[0].code,
        ErrorCode::Syntax
    );
}

#[test]
fn keywords_are_not_names_but_kinds_and_builtins_are() {
    for src in [
        "kernel for() {}",
        "kernel k(tensor: f32) {}",
        "kernel k() { let let = 1; }",
        "kernel k() { let x = in + 1; }",
        "kernel k() { mut = 1; }",
        "kernel k<as: int>() {}",
        "kernel k() { let x = contiguous; }",
    ] {
        let d = fail(src);
        assert_eq!(d.0[0].code, ErrorCode::Syntax, "{src}");
    }
    // Only the keywords are reserved; words that merely start with one are names.
    let s = body("let int = 1; let float = range; let inner = iffy + letter + as_f32 + tensors;");
    assert_eq!(s.len(), 3);
}

#[test]
fn comments_anywhere() {
    let s = body("let /* a */ x /**/ = // c\n 1 /* * / */ + 2; // end\n/* last */");
    assert!(matches!(&s[0], Stmt::Let { value, .. } if sx(value) == "(+ 1 2)"));
}

// ---------------------------------------------------------------- spans

#[test]
fn spans_are_exact() {
    let src = "kernel k<B: int = 4>(x: tensor<f32, 1>) {\n    let mut acc: f32 = (a + b) * c.sum(0);\n    acc += -x as f32;\n    for i in 0..n { f(i, pad = 1); }\n    if p { } else if q { }\n}\n";
    let m = ok(src);
    let k = &m.kernels[0];
    assert_eq!(text(src, k.span), src.trim_end());
    assert_eq!(text(src, k.name.span), "k");
    assert_eq!(text(src, k.generics[0].span), "B: int = 4");
    assert_eq!(text(src, k.generics[0].kind_span), "int");
    assert_eq!(text(src, k.generics[0].name.span), "B");
    let st = &k.body.stmts;
    assert_eq!(
        text(src, st[0].span()),
        "let mut acc: f32 = (a + b) * c.sum(0);"
    );
    let Stmt::Let {
        value, ty, name, ..
    } = &st[0]
    else {
        panic!()
    };
    assert_eq!(text(src, name.span), "acc");
    assert_eq!(text(src, ty.as_ref().unwrap().span), "f32");
    assert_eq!(text(src, value.span), "(a + b) * c.sum(0)");
    let ExprKind::Binary { lhs, rhs, .. } = &value.kind else {
        panic!()
    };
    assert_eq!(text(src, lhs.span), "(a + b)");
    assert_eq!(text(src, rhs.span), "c.sum(0)");
    let ExprKind::Call { func, args, .. } = &rhs.kind else {
        panic!()
    };
    assert_eq!(text(src, func.span), "sum");
    assert_eq!(text(src, args[0].value.span), "c");
    assert_eq!(text(src, args[1].value.span), "0");
    assert_eq!(text(src, st[1].span()), "acc += -x as f32;");
    let Stmt::Assign { value, .. } = &st[1] else {
        panic!()
    };
    assert_eq!(text(src, value.span), "-x as f32");
    let ExprKind::Cast { expr, dtype } = &value.kind else {
        panic!()
    };
    assert_eq!(text(src, expr.span), "-x");
    assert_eq!(text(src, dtype.span), "f32");
    assert_eq!(text(src, st[2].span()), "for i in 0..n { f(i, pad = 1); }");
    let Stmt::For { body, var, end, .. } = &st[2] else {
        panic!()
    };
    assert_eq!(text(src, var.span), "i");
    assert_eq!(text(src, end.span), "n");
    assert_eq!(text(src, body.span), "{ f(i, pad = 1); }");
    let Stmt::Expr(call) = &body.stmts[0] else {
        panic!()
    };
    assert_eq!(text(src, call.span), "f(i, pad = 1)");
    let ExprKind::Call { args, .. } = &call.kind else {
        panic!()
    };
    assert_eq!(text(src, args[1].name.as_ref().unwrap().span), "pad");
    assert_eq!(text(src, args[1].value.span), "1");
    let Stmt::If { else_block, .. } = &st[3] else {
        panic!()
    };
    assert_eq!(text(src, else_block.as_ref().unwrap().span), "if q { }");
}

#[test]
fn spans_exclude_trailing_whitespace_and_comments() {
    let src = "kernel k<B: int /* no default */, C: int = 2 // c\n>() {\n    let x = a + b /* c */ ;\n    if c { }   // t\n    f(x)  ;\n}\n";
    let m = ok(src);
    let k = &m.kernels[0];
    assert_eq!(text(src, k.generics[0].span), "B: int");
    assert_eq!(text(src, k.generics[1].span), "C: int = 2");
    let st = &k.body.stmts;
    let Stmt::Let { value, .. } = &st[0] else {
        panic!()
    };
    assert_eq!(text(src, value.span), "a + b");
    assert_eq!(text(src, st[1].span()), "if c { }");
    assert_eq!(text(src, st[2].span()), "f(x)");
}

#[test]
fn spans_stay_on_char_boundaries_with_unicode() {
    let src = "// größe → ok\nkernel k() { /* ü */ let x = 1; }";
    let m = ok(src);
    assert_eq!(text(src, m.kernels[0].body.stmts[0].span()), "let x = 1;");
    let src = "kernel k() { let x = ü; }";
    let d = fail(src);
    assert_eq!(text(src, d.0[0].primary_span().unwrap()), "ü");
}

// ---------------------------------------------------------------- limits

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let deep = format!("kernel k() {{ let x = {}1; }}", "(".repeat(10_000));
    assert!(fail(&deep).0[0].message.contains("nested too deeply"));
    let deep = format!(
        "kernel k() {{ let x = {}1{}; }}",
        "(".repeat(300),
        ")".repeat(300)
    );
    assert!(fail(&deep).0[0].message.contains("nested too deeply"));
    let deep = format!("kernel k() {{ let x = {}1; }}", "-".repeat(10_000));
    assert!(fail(&deep).0[0].message.contains("nested too deeply"));
    let long = format!("kernel k() {{ let x = 1{}; }}", " + 1".repeat(10_000));
    assert!(fail(&long).0[0].message.contains("nested too deeply"));
    let long = format!("kernel k() {{ let x = x{}; }}", ".f()".repeat(10_000));
    assert!(fail(&long).0[0].message.contains("nested too deeply"));
    let long = format!("kernel k() {{ let x = x{}; }}", " as f32".repeat(10_000));
    assert!(fail(&long).0[0].message.contains("nested too deeply"));
}

#[test]
fn nesting_up_to_the_limits_parses() {
    // Run where the stack is the default for spawned threads (2 MiB), like a test.
    let h = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            let n = MAX_NESTING - 2;
            let parens = format!(
                "kernel k() {{ let x = {}1{}; }}",
                "(".repeat(n),
                ")".repeat(n)
            );
            ok(&parens);
            let lists = format!(
                "kernel k() {{ let x = {}1{}; }}",
                "[".repeat(n),
                "]".repeat(n)
            );
            ok(&lists);
            let calls = format!(
                "kernel k() {{ let x = {}1{}; }}",
                "f(".repeat(n),
                ")".repeat(n)
            );
            ok(&calls);
            let ifs = format!("kernel k() {{ {}{} }}", "if c { ".repeat(n), "}".repeat(n));
            ok(&ifs);
            let neg = format!("kernel k() {{ let x = {}1; }}", "-".repeat(200));
            ok(&neg);
            let sum = format!("kernel k() {{ let x = 1{}; }}", " + 1".repeat(200));
            ok(&sum);
        })
        .expect("spawn");
    h.join().expect("no stack overflow");
}

// ---------------------------------------------------------------- error snapshots

macro_rules! snap {
    ($name:ident, $src:expr) => {
        #[test]
        fn $name() {
            insta::assert_snapshot!(stringify!($name), rendered($src));
        }
    };
}

snap!(
    err_missing_semicolon,
    "kernel k() {\n    let x = 1\n    let y = 2;\n}\n"
);
snap!(
    err_missing_semicolon_same_line,
    "kernel k() {\n    let x = f(1) g(2);\n}\n"
);
snap!(
    err_unclosed_brace,
    "kernel k(x: f32) {\n    if x > 0.0 {\n        let y = x;\n}\n"
);
snap!(
    err_mismatched_delimiter,
    "kernel k() {\n    let x = (1 + 2];\n}\n"
);
snap!(err_stray_closing, "kernel k() {\n    let x = 1;\n}\n}\n");
snap!(err_bad_token, "kernel k() {\n    let x = a @ b;\n}\n");
snap!(err_keyword_as_name, "kernel k() {\n    let in = 1;\n}\n");
snap!(err_missing_param_type, "kernel k(x, y: f32) {\n}\n");
snap!(err_bad_tensor_type, "kernel k(x: tensor<f32>) {\n}\n");
snap!(
    err_bad_tensor_option,
    "kernel k(x: tensor<f32, 2, contigous>) {\n}\n"
);
snap!(
    err_overflowing_int,
    "kernel k() {\n    let x = 99999999999999999999999;\n}\n"
);
snap!(err_bad_float, "kernel k() {\n    let x = 1.5f;\n}\n");
snap!(
    err_unterminated_comment,
    "kernel k() {\n    /* TODO\n    let x = 1;\n}\n"
);
snap!(
    err_unterminated_string,
    "kernel k() {\n    static_assert(B > 0, \"oops);\n}\n"
);
snap!(
    err_stray_else,
    "kernel k() {\n    let x = 1;\n    else { }\n}\n"
);
snap!(err_missing_expression, "kernel k() {\n    let x = ;\n}\n");
snap!(
    err_missing_call_comma,
    "kernel k() {\n    let x = load(x, [i] [B]);\n}\n"
);
snap!(
    err_chained_comparison,
    "kernel k() {\n    let x = a < b < c;\n}\n"
);
snap!(err_bad_generic_kind, "kernel k<B: integer = 4>() {\n}\n");
snap!(err_integer_dtype_generic, "kernel k<N: i32 = 4>() {\n}\n");
snap!(
    err_not_a_property,
    "kernel k(x: tensor<f32, 1>) {\n    let n = x.shape;\n}\n"
);
snap!(
    err_cast_in_a_power,
    "kernel k() {\n    let y = 2 ** n as f32;\n}\n"
);
snap!(
    err_not_a_range,
    "kernel k() {\n    for i in n {\n    }\n}\n"
);
snap!(err_junk_after_kernel, "kernel k() {\n}\nlet x = 1;\n");
snap!(err_unexpected_eof, "kernel k(x: f32");
snap!(err_eof_after_signature, "kernel k(x: f32)\n");
snap!(
    err_missing_comma_between_params,
    "kernel k(\n    x: f32\n    y: f32,\n) {\n}\n"
);
snap!(
    err_else_without_block,
    "kernel k() {\n    if c { } else x = 1;\n}\n"
);

#[test]
fn rendered_errors_show_location_and_caret() {
    let r = rendered("kernel k() {\n    let x = 1\n    let y = 2;\n}\n");
    assert!(r.contains("t.kg:2:14"), "{r}");
    assert!(r.contains('^'), "{r}");
    assert!(r.contains("error[E0101]"), "{r}");
}
