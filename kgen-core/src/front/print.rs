//! A pretty-printer from [`ast::Module`] back to `.kg` source text.
//!
//! Used by the `#[kernel]` macro to embed a kernel as `.kg` text (the runtime compiles
//! that text for any specialization). Guarantees: for every module the `.kg` parser
//! produces, `parse(print(m))` equals `m` up to spans. Parentheses are inserted only
//! where the grammar needs them (Rust precedence; comparisons never chain).
//! Comments are not part of the AST and are lost.

use super::ast::*;
use std::fmt::Write;

/// The `.kg` text of a whole module.
pub fn print_module(m: &Module) -> String {
    let mut out = String::new();
    for (i, f) in m.functions.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        print_function(&mut out, f);
    }
    for (i, k) in m.kernels.iter().enumerate() {
        if i > 0 || !m.functions.is_empty() {
            out.push('\n');
        }
        print_kernel(&mut out, k);
    }
    out
}

fn print_function(out: &mut String, f: &FnDef) {
    let params: Vec<&str> = f.params.iter().map(|p| p.name.as_str()).collect();
    let _ = write!(out, "fn {}({}) ", f.name.name, params.join(", "));
    print_block(out, &f.body, 0);
    out.push('\n');
}

fn print_kernel(out: &mut String, k: &Kernel) {
    let _ = write!(out, "kernel {}", k.name.name);
    if !k.generics.is_empty() {
        out.push('<');
        for (i, g) in k.generics.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let kind = match g.kind {
                GenericKind::Int => "int",
                GenericKind::Bool => "bool",
                GenericKind::DType => "dtype",
                GenericKind::Float => "float",
                GenericKind::FloatValue(d) => d.name(),
            };
            let _ = write!(out, "{}: {kind}", g.name.name);
            if let Some(d) = &g.default {
                out.push_str(" = ");
                out.push_str(&print_expr(d));
            }
        }
        out.push('>');
    }
    out.push_str("(\n");
    for p in &k.params {
        let _ = write!(out, "    {}: ", p.name.name);
        match &p.ty {
            ParamType::Scalar(t) => out.push_str(&t.name),
            ParamType::Tensor(t) => {
                let _ = write!(out, "tensor<{}, ", t.elem.name);
                match &t.dims {
                    TensorDims::Rank(r, _) => {
                        let _ = write!(out, "{r}");
                    }
                    TensorDims::List(dims) => {
                        let items: Vec<String> = dims
                            .iter()
                            .map(|d| match d {
                                DimSpec::Dynamic(_) => "_".to_string(),
                                DimSpec::Const(e) => print_expr(e),
                            })
                            .collect();
                        let _ = write!(out, "[{}]", items.join(", "));
                    }
                }
                if t.contiguous {
                    out.push_str(", contiguous");
                }
                out.push('>');
            }
        }
        out.push_str(",\n");
    }
    out.push_str(") ");
    print_block(out, &k.body, 0);
    out.push('\n');
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("    ");
    }
}

fn print_block(out: &mut String, b: &Block, level: usize) {
    out.push_str("{\n");
    for s in &b.stmts {
        print_stmt(out, s, level + 1);
    }
    indent(out, level);
    out.push('}');
}

fn print_stmt(out: &mut String, s: &Stmt, level: usize) {
    indent(out, level);
    match s {
        Stmt::Let {
            name,
            mutable,
            ty,
            value,
            ..
        } => {
            out.push_str("let ");
            if *mutable {
                out.push_str("mut ");
            }
            out.push_str(&name.name);
            if let Some(t) = ty {
                let _ = write!(out, ": {}", t.name);
            }
            let _ = writeln!(out, " = {};", print_expr(value));
        }
        Stmt::LetList {
            names,
            mutable,
            value,
            ..
        } => {
            let names: Vec<&str> = names.iter().map(|n| n.name.as_str()).collect();
            let m = if *mutable { "mut " } else { "" };
            let _ = writeln!(
                out,
                "let {m}[{}] = {};",
                names.join(", "),
                print_expr(value)
            );
        }
        Stmt::Assign {
            target, op, value, ..
        } => {
            let op = op.map_or(String::new(), |o| o.symbol().to_string());
            let _ = writeln!(out, "{} {op}= {};", target.name, print_expr(value));
        }
        Stmt::Expr(e) => {
            let _ = writeln!(out, "{};", print_expr(e));
        }
        Stmt::For {
            var,
            start,
            end,
            step,
            body,
            ..
        } => {
            match step {
                None => {
                    let _ = write!(
                        out,
                        "for {} in {}..{} ",
                        var.name,
                        print_expr(start),
                        print_expr(end)
                    );
                }
                Some(st) => {
                    let _ = write!(
                        out,
                        "for {} in range({}, {}, {}) ",
                        var.name,
                        print_expr(start),
                        print_expr(end),
                        print_expr(st)
                    );
                }
            }
            print_block(out, body, level);
            out.push('\n');
        }
        Stmt::If { .. } => {
            print_if(out, s, level);
            out.push('\n');
        }
        Stmt::StaticAssert { cond, message, .. } => {
            let _ = write!(out, "static_assert({}", print_expr(cond));
            if let Some(m) = message {
                let _ = write!(out, ", {}", quote_str(m));
            }
            out.push_str(");\n");
        }
        Stmt::Return { value, .. } => {
            let _ = writeln!(out, "return {};", print_expr(value));
        }
    }
}

/// `if` with `else if` chains: an else block holding exactly one `If` prints as `else if`.
fn print_if(out: &mut String, s: &Stmt, level: usize) {
    let Stmt::If {
        cond,
        then_block,
        else_block,
        ..
    } = s
    else {
        return;
    };
    let _ = write!(out, "if {} ", print_expr(cond));
    print_block(out, then_block, level);
    if let Some(eb) = else_block {
        out.push_str(" else ");
        match eb.stmts.as_slice() {
            [inner @ Stmt::If { .. }] => print_if(out, inner, level),
            _ => print_block(out, eb, level),
        }
    }
}

fn quote_str(s: &str) -> String {
    let mut q = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// Binding strength of a binary operator (Rust's table; higher binds tighter).
fn prec(op: BinOp) -> u8 {
    use BinOp::*;
    match op {
        Or => 1,
        And => 2,
        Eq | Ne | Lt | Le | Gt | Ge => 3,
        BitOr => 4,
        BitXor => 5,
        BitAnd => 6,
        Shl | Shr => 7,
        Add | Sub => 8,
        Mul | Div | Rem => 9,
        Pow => 10,
    }
}

/// The `.kg` text of one expression.
pub fn print_expr(e: &Expr) -> String {
    let mut out = String::new();
    expr(&mut out, e);
    out
}

/// True for expressions that print as one primary (no operator outside brackets).
fn is_atom(e: &Expr) -> bool {
    matches!(
        e.kind,
        ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Bool(_)
            | ExprKind::Name(_)
            | ExprKind::List(_)
            | ExprKind::Call { .. }
    )
}

fn paren_if(out: &mut String, e: &Expr, needed: bool) {
    if needed {
        out.push('(');
        expr(out, e);
        out.push(')');
    } else {
        expr(out, e);
    }
}

fn float_text(v: f64) -> String {
    // `{:?}` gives the shortest text that reads back to the same value: `1.0`, `1e-6`,
    // `1e20`; all of them are `.kg` float literals.
    let s = format!("{v:?}");
    if s.contains('.') || s.contains('e') || s.contains("inf") || s.contains("NaN") {
        s
    } else {
        format!("{s}.0")
    }
}

fn expr(out: &mut String, e: &Expr) {
    match &e.kind {
        ExprKind::Int(v) => {
            let _ = write!(out, "{v}");
        }
        ExprKind::Float(v) => {
            if v.is_nan() {
                out.push_str("nan");
            } else if v.is_infinite() {
                out.push_str(if *v > 0.0 { "inf" } else { "(-inf)" });
            } else {
                out.push_str(&float_text(*v));
            }
        }
        ExprKind::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        ExprKind::Name(n) => out.push_str(&n.name),
        ExprKind::Unary { op, operand } => {
            out.push(match op {
                UnOp::Neg => '-',
                UnOp::Not => '!',
            });
            let needed = !is_atom(operand) || is_method(operand);
            paren_if(out, operand, needed);
        }
        ExprKind::Binary {
            op: BinOp::Pow,
            lhs,
            rhs,
        } => {
            // `**` groups to the right and binds tighter than prefix operators; a cast
            // next to it needs parentheses.
            let negative = match lhs.kind {
                ExprKind::Int(v) => v < 0,
                ExprKind::Float(v) => v.is_sign_negative(),
                _ => false,
            };
            let l_needed = !is_atom(lhs) || negative;
            paren_if(out, lhs, l_needed);
            out.push_str(" ** ");
            let r_needed = match &rhs.kind {
                ExprKind::Binary { op, .. } => *op != BinOp::Pow,
                ExprKind::Cast { .. } => true,
                _ => false,
            };
            paren_if(out, rhs, r_needed);
        }
        ExprKind::Binary { op, lhs, rhs } => {
            let p = prec(*op);
            let cmp = p == 3;
            let l_needed = matches!(&lhs.kind, ExprKind::Binary { op: o, .. }
                if prec(*o) < p || (cmp && prec(*o) == p));
            let r_needed = matches!(&rhs.kind, ExprKind::Binary { op: o, .. } if prec(*o) <= p);
            paren_if(out, lhs, l_needed);
            let _ = write!(out, " {} ", op.symbol());
            paren_if(out, rhs, r_needed);
        }
        ExprKind::Call {
            func,
            args,
            method_syntax,
        } => {
            let rest = if *method_syntax && !args.is_empty() && args[0].name.is_none() {
                let recv = &args[0].value;
                paren_if(out, recv, !is_atom(recv));
                out.push('.');
                &args[1..]
            } else {
                &args[..]
            };
            out.push_str(&func.name);
            out.push('(');
            for (i, a) in rest.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if let Some(n) = &a.name {
                    let _ = write!(out, "{} = ", n.name);
                }
                expr(out, &a.value);
            }
            out.push(')');
        }
        ExprKind::List(items) => {
            out.push('[');
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                expr(out, it);
            }
            out.push(']');
        }
        ExprKind::Cast { expr: inner, dtype } => {
            let needed = !(is_atom(inner) || matches!(inner.kind, ExprKind::Cast { .. }));
            paren_if(out, inner, needed);
            let _ = write!(out, " as {}", dtype.name);
        }
    }
}

fn is_method(e: &Expr) -> bool {
    matches!(
        e.kind,
        ExprKind::Call {
            method_syntax: true,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::parse;
    use crate::span::SourceFile;

    /// The Debug text of a module with every `Span { .. }` removed.
    fn without_spans(m: &Module) -> String {
        let s = format!("{m:?}");
        let mut out = String::with_capacity(s.len());
        let mut rest = s.as_str();
        while let Some(i) = rest.find("Span { start: ") {
            out.push_str(&rest[..i]);
            let after = &rest[i..];
            let close = after.find('}').map_or(after.len(), |j| j + 1);
            rest = &after[close..];
        }
        out.push_str(rest);
        out
    }

    fn round_trip(name: &str, text: &str) {
        let m1 = parse(&SourceFile::new(name, text)).expect("source parses");
        let printed = print_module(&m1);
        let m2 = parse(&SourceFile::new("<printed>", printed.as_str()))
            .unwrap_or_else(|d| panic!("printed {name} does not parse: {d}\n{printed}"));
        assert_eq!(without_spans(&m1), without_spans(&m2), "{name}:\n{printed}");
    }

    #[test]
    fn round_trips_every_kernel_source() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels-src");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("kernels-src exists") {
            let path = entry.expect("dir entry").path();
            if path.extension().and_then(|e| e.to_str()) == Some("kg") {
                let text = std::fs::read_to_string(&path).expect("readable");
                round_trip(&path.display().to_string(), &text);
                n += 1;
            }
        }
        assert!(n >= 6, "found only {n} kernels");
    }

    #[test]
    fn round_trips_language_doc_examples() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/LANGUAGE.md");
        let doc = std::fs::read_to_string(path).expect("docs/LANGUAGE.md");
        let mut n = 0;
        for (i, block) in doc.split("```kg\n").skip(1).enumerate() {
            let code = block.split("```").next().unwrap_or("");
            round_trip(&format!("LANGUAGE.md example {i}"), code);
            n += 1;
        }
        assert!(n >= 10, "found only {n} examples");
    }

    #[test]
    fn round_trips_tricky_expressions() {
        let src = r#"
kernel k<A: int = 2 * (3 + 4), B: bool = true, T: dtype = f32, EPS: bf16 = -1e-5>(x: tensor<T, [_, A * 2]>, s: f32) {
    let p = -a ** 2 ** -b + (a ** b) ** 2 + (-a) ** 2 + (a as f32) ** 2.0 * a.sum(0) ** (1 + 1);
    let q = cast(p, x.dtype) + dtype(p).lowest() + !(a ** b);
    let a = -(1 + 2) * 3 - (4 - 5) - -6;
    let b = (a < 3) == (a > 2) && !(a == 1 || false);
    let c = (a + 1) as f32 as i32 << 2 >> (1 + 1);
    let d = (-a).abs().max(2) + (a + 1).min(3) + (a as f32 * 2.0) as i32;
    let mut e = load(x, [0, 0], [1, 4], pad = -inf).reshape([4]) % 2.5e-7;
    e -= 1e20 - 0.1;
    static_assert(A % 2 == 0, "quote \" back\\slash\n");
    if s > 0.0 { e = e; } else if s < 0.0 { e = -e; } else { e = e * 2.0; }
    for i in range(0, 10, 3) { e += i as f32; }
    for i in a..a + 2 { e &= e; }
}
kernel second() {}
"#;
        round_trip("tricky", src);
    }
}
