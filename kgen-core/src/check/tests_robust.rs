//! Checker robustness tests: ASTs of any depth are bounded (an error, never a stack
//! overflow), and random ASTs never panic the checker, while whatever it accepts passes
//! the validator before and after optimization.

use crate::diag::ErrorCode;
use crate::front::ast::{self, Arg, BinOp, Expr, ExprKind, Ident, UnOp};
use crate::pipeline::CompileOptions;
use crate::span::Span;
use crate::target::Arch;

/// ASTs deeper than any parser output (e.g. built by the proc macro) are an error, not a
/// stack overflow; nesting up to the limit is fine.
#[test]
fn deep_asts_are_bounded() {
    let build = |depth: usize, stmt_depth: usize| {
        let mut e = ex(ExprKind::Name(id("n")));
        for _ in 0..depth {
            e = ex(ExprKind::Binary {
                op: BinOp::Add,
                lhs: Box::new(e),
                rhs: Box::new(ex(ExprKind::Int(1))),
            });
        }
        let mut body = ast::Block {
            stmts: vec![ast::Stmt::Let {
                name: id("a"),
                mutable: false,
                ty: None,
                value: e,
                span: Span::DUMMY,
            }],
            span: Span::DUMMY,
        };
        for _ in 0..stmt_depth {
            body = ast::Block {
                stmts: vec![ast::Stmt::If {
                    cond: ex(ExprKind::Name(id("c"))),
                    then_block: body,
                    else_block: None,
                    span: Span::DUMMY,
                }],
                span: Span::DUMMY,
            };
        }
        let mut m = crate::front::parse(&crate::span::SourceFile::new(
            "t.kg",
            "kernel k(n: i32, c: bool) { }",
        ))
        .expect("parses");
        if let Some(kern) = m.kernels.first_mut() {
            kern.body = body;
        }
        m
    };
    let run = move |depth: usize, stmt_depth: usize| {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let m = build(depth, stmt_depth);
                let r = super::lower_kernel(&m, &CompileOptions::new(Arch::Sm80))
                    .map(|_| ())
                    .map_err(|d| d.0.iter().map(|d| d.code).collect::<Vec<_>>());
                // Drop the deep AST iteratively-enough: leak it, dropping is recursive.
                std::mem::forget(m);
                r
            })
            .expect("thread")
            .join()
            .expect("no stack overflow")
    };
    assert_eq!(run(500, 0), Ok(()));
    assert_eq!(run(5000, 0), Err(vec![ErrorCode::Unsupported]));
    assert_eq!(run(0, 200), Ok(()));
    assert_eq!(run(0, 3000), Err(vec![ErrorCode::Unsupported]));
}

// ---------------------------------------------------------------------------------
// Robustness: random ASTs.

/// A tiny deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items.get(self.below(items.len())).copied().unwrap_or("x")
    }
}

const NAMES: &[&str] = &[
    "x", "m", "xi", "n", "i", "t", "u", "B", "T", "f32", "i32", "bool", "inf", "nan", "zz",
];
const FUNCS: &[&str] = &[
    "bid",
    "num_bids",
    "arange",
    "zeros",
    "full",
    "shape",
    "stride",
    "cdiv",
    "exp",
    "abs",
    "min",
    "max",
    "fma",
    "pow",
    "fdiv",
    "where",
    "cast",
    "reshape",
    "expand_dims",
    "broadcast",
    "transpose",
    "permute",
    "sum",
    "argmax",
    "load",
    "store",
    "gather",
    "scatter",
    "atomic_add",
    "dot",
    "scratch_fetch",
    "scratch_gather",
    "scratch_wait",
    "gdc_wait",
    "gdc_launch_dependents",
    "barrier",
    "nope",
];
const KEYWORDS: &[&str] = &["pad", "mask", "other", "axis", "x", "shape", "bogus"];

fn id(name: &str) -> Ident {
    Ident {
        name: name.to_string(),
        span: Span::DUMMY,
    }
}

fn ex(kind: ExprKind) -> Expr {
    Expr {
        kind,
        span: Span::DUMMY,
    }
}

fn rand_expr(r: &mut Rng, depth: usize) -> Expr {
    let leaf = depth == 0 || r.below(3) == 0;
    if leaf {
        return match r.below(6) {
            0 => ex(ExprKind::Int(
                [
                    0i128,
                    1,
                    2,
                    4,
                    8,
                    16,
                    -1,
                    3,
                    1 << 20,
                    u64::MAX as i128,
                    i64::MIN as i128,
                ][r.below(11)],
            )),
            1 => ex(ExprKind::Float(
                [0.0, 1.5, -2.0, f64::NAN, f64::INFINITY][r.below(5)],
            )),
            2 => ex(ExprKind::Bool(r.below(2) == 0)),
            _ => ex(ExprKind::Name(id(r.pick(NAMES)))),
        };
    }
    match r.below(6) {
        0 => ex(ExprKind::Unary {
            op: if r.below(2) == 0 {
                UnOp::Neg
            } else {
                UnOp::Not
            },
            operand: Box::new(rand_expr(r, depth - 1)),
        }),
        1 => {
            let ops = [
                BinOp::Add,
                BinOp::Sub,
                BinOp::Mul,
                BinOp::Div,
                BinOp::Rem,
                BinOp::Lt,
                BinOp::Eq,
                BinOp::And,
                BinOp::Or,
                BinOp::BitAnd,
                BinOp::Shl,
                BinOp::Shr,
            ];
            ex(ExprKind::Binary {
                op: ops[r.below(ops.len())],
                lhs: Box::new(rand_expr(r, depth - 1)),
                rhs: Box::new(rand_expr(r, depth - 1)),
            })
        }
        2 => ex(ExprKind::List(
            (0..r.below(5)).map(|_| rand_expr(r, depth - 1)).collect(),
        )),
        3 => ex(ExprKind::Cast {
            expr: Box::new(rand_expr(r, depth - 1)),
            dtype: id(r.pick(&["f32", "i32", "bool", "f16", "T", "B", "u32", "i64"])),
        }),
        _ => {
            let n = r.below(5);
            let args = (0..n)
                .map(|_| Arg {
                    name: (r.below(5) == 0).then(|| id(r.pick(KEYWORDS))),
                    value: rand_expr(r, depth - 1),
                })
                .collect();
            ex(ExprKind::Call {
                func: id(r.pick(FUNCS)),
                args,
                method_syntax: false,
            })
        }
    }
}

fn rand_block(r: &mut Rng, depth: usize) -> ast::Block {
    let stmts = (0..r.below(6)).map(|_| rand_stmt(r, depth)).collect();
    ast::Block {
        stmts,
        span: Span::DUMMY,
    }
}

fn rand_stmt(r: &mut Rng, depth: usize) -> ast::Stmt {
    use ast::Stmt;
    let choice = if depth == 0 { r.below(4) } else { r.below(7) };
    match choice {
        0 | 1 => Stmt::Let {
            name: id(r.pick(&["t", "u", "n", "x"])),
            mutable: r.below(2) == 0,
            ty: (r.below(4) == 0).then(|| id(r.pick(&["f32", "i32", "T"]))),
            value: rand_expr(r, 3),
            span: Span::DUMMY,
        },
        2 => Stmt::Assign {
            target: id(r.pick(&["t", "u", "n", "B"])),
            op: (r.below(2) == 0).then_some(BinOp::Add),
            value: rand_expr(r, 3),
            span: Span::DUMMY,
        },
        3 => Stmt::Expr(rand_expr(r, 3)),
        4 => Stmt::For {
            var: id(r.pick(&["j", "i", "t"])),
            start: rand_expr(r, 1),
            end: rand_expr(r, 1),
            step: (r.below(2) == 0).then(|| rand_expr(r, 1)),
            body: rand_block(r, depth - 1),
            span: Span::DUMMY,
        },
        5 => Stmt::If {
            cond: rand_expr(r, 2),
            then_block: rand_block(r, depth - 1),
            else_block: (r.below(2) == 0).then(|| rand_block(r, depth - 1)),
            span: Span::DUMMY,
        },
        _ => Stmt::StaticAssert {
            cond: rand_expr(r, 2),
            message: None,
            span: Span::DUMMY,
        },
    }
}

/// A fixed, valid signature with a random body: the checker never panics, and any IR
/// it accepts passes the validator.
#[test]
fn random_asts_never_panic_and_accepted_ir_is_valid() {
    let base = crate::front::parse(&crate::span::SourceFile::new(
        "t.kg",
        "kernel k<B: int = 8, T: float = f32>(x: tensor<T, 1>, m: tensor<f32, [4, B]>, xi: tensor<i32, 2, contiguous>, n: i32) {
            let i = bid(0);
            let mut t = load(x, [i], [B]);
            let mut u = arange(0, 8);
        }",
    ))
    .expect("base kernel parses");
    let mut accepted = 0;
    for seed in 1..20_000u64 {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut module = base.clone();
        if let Some(kern) = module.kernels.first_mut() {
            let extra = rand_block(&mut r, 2);
            kern.body.stmts.extend(extra.stmts);
        }
        match super::lower_kernel(&module, &CompileOptions::new(Arch::Sm80)) {
            Ok((mut f, _)) => {
                accepted += 1;
                if let Err(d) = crate::valid::validate(&f) {
                    panic!("seed {seed}: checker accepted invalid IR: {d}\n{f}\n{module:#?}");
                }
                crate::passes::optimize(&mut f, &crate::passes::PassOptions::default()).unwrap();
                if let Err(d) = crate::valid::validate(&f) {
                    panic!("seed {seed}: invalid IR after optimization: {d}\n{f}");
                }
            }
            Err(d) => {
                for e in &d.0 {
                    assert_ne!(e.code, ErrorCode::InvalidIr, "seed {seed}");
                    assert!(!e.message.is_empty(), "seed {seed}");
                }
            }
        }
    }
    assert!(
        accepted > 1000,
        "only {accepted} random kernels were accepted"
    );
}
