//! Expressions: names, literals (untyped until they meet a typed value), unary and
//! binary operators, casts; calls go to `builtins.rs`.
//!
//! Assumes: scopes hold the bindings of the enclosing statements.
//! Guarantees: every `Ev::Value` returned is a valid IR value; binary IR ops get
//! operands of identical type (via `unify`); operators over constants are folded
//! (`consteval`), so `BLOCK / 2` stays a constant usable in shapes, and so are
//! operators over typed constants (`EPS * 2.0` is a typed constant); `**` is `pow`.
//! Comparisons give `bool`; `&& || !` need `bool`; bitwise operators and shifts need
//! integers (`!` also takes integers: bitwise not); arithmetic needs numbers (`%` on
//! floats is fmod).

use super::scope::closest;
use super::{Binding, Checker, Ev};
use crate::abi::ConstArg;
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast::{self, BinOp, ExprKind, UnOp};
use crate::ir::{BinaryOp, CmpOp, Op, UnaryOp};
use crate::span::Span;
use crate::types::{DType, Scalar, ValueType};

impl Checker<'_> {
    pub(crate) fn expr(&mut self, e: &ast::Expr) -> Ev {
        self.nested(e.span, |c| c.expr_inner(e))
            .unwrap_or(Ev::Poison)
    }

    fn expr_inner(&mut self, e: &ast::Expr) -> Ev {
        match &e.kind {
            ExprKind::Int(i) => self.checked_int(Some(*i), e.span, "literal"),
            ExprKind::Float(f) => Ev::Float(*f),
            ExprKind::Bool(b) => Ev::Bool(*b),
            ExprKind::Name(id) => self.name(id),
            ExprKind::List(items) => {
                Ev::List(items.iter().map(|x| (self.expr(x), x.span)).collect())
            }
            ExprKind::Unary { op, operand } => {
                let v = self.expr(operand);
                self.unary(*op, v, operand.span, e.span)
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let a = self.expr(lhs);
                let b = self.expr(rhs);
                self.binary(*op, a, lhs.span, b, rhs.span, e.span)
            }
            ExprKind::Cast { expr, dtype } => {
                let v = self.expr(expr);
                match self.dtype_of(dtype) {
                    Some(d) => self.cast(v, d, expr.span, e.span),
                    None => Ev::Poison,
                }
            }
            ExprKind::Call {
                func,
                args,
                method_syntax,
            } => self.call(func, args, *method_syntax, e.span),
        }
    }

    fn name(&mut self, id: &ast::Ident) -> Ev {
        if let Some(b) = self.lookup(&id.name) {
            return match b.clone() {
                Binding::Var { value, .. } => value,
                Binding::Tensor { index, .. } => Ev::Tensor(index),
                Binding::Generic { value, .. } => match value {
                    ConstArg::Int(i) => Ev::Int(i as i128),
                    ConstArg::Bool(b) => Ev::Bool(b),
                    ConstArg::DType(d) => Ev::DType(d),
                    ConstArg::Float(d, bits) => {
                        self.emit_const(Scalar::Float(f32::from_bits(bits) as f64, d), id.span)
                    }
                },
            };
        }
        if self.poisoned.contains(&id.name) {
            return Ev::Poison;
        }
        match id.name.as_str() {
            "inf" => return Ev::Float(f64::INFINITY),
            "nan" => return Ev::Float(f64::NAN),
            _ => {}
        }
        if let Some(d) = DType::from_name(&id.name) {
            return Ev::DType(d);
        }
        let mut d = Diagnostic::error(
            ErrorCode::UndefinedName,
            id.span,
            format!("cannot find `{}` in this scope", id.name),
        )
        .with_label_message("not found");
        if let Some(s) = closest(&id.name, &self.visible_names()) {
            d = d.with_note(format!("help: a binding with a similar name exists: `{s}`"));
        } else if super::builtins::is_builtin(&id.name) {
            d = d.with_note(format!(
                "`{}` is a function: call it, e.g. `{}(...)`",
                id.name, id.name
            ));
        }
        self.push(d)
    }

    fn unary(&mut self, op: UnOp, v: Ev, vspan: Span, span: Span) -> Ev {
        let v = self.expect_value(v, vspan);
        let sym = if op == UnOp::Neg { "-" } else { "!" };
        match (op, &v) {
            (_, Ev::Poison) => Ev::Poison,
            (UnOp::Neg, Ev::Int(i)) => self.checked_int(i.checked_neg(), span, &format!("`-{i}`")),
            (UnOp::Neg, Ev::Float(f)) => Ev::Float(-*f),
            (UnOp::Not, Ev::Bool(b)) => Ev::Bool(!*b),
            (UnOp::Not, Ev::Int(i)) => self.checked_int(Some(!*i), span, &format!("`!{i}`")),
            (_, Ev::Value(x)) => {
                if let Some(folded) = self.fold_typed_unary(op, &v, span) {
                    return folded;
                }
                let t = self.ty(*x);
                let d = t.dtype();
                let ok = match op {
                    UnOp::Neg => d.is_int() || d.is_float(),
                    UnOp::Not => d == DType::Bool || d.is_int(),
                };
                if !ok {
                    let need = if op == UnOp::Neg {
                        "a number"
                    } else {
                        "a bool or an integer"
                    };
                    return self.push(
                        Diagnostic::error(
                            ErrorCode::TypeMismatch,
                            span,
                            format!("cannot apply unary `{sym}` to `{t}`"),
                        )
                        .with_secondary(vspan, format!("this is `{t}`"))
                        .with_note(format!("unary `{sym}` needs {need}")),
                    );
                }
                let uop = if op == UnOp::Neg {
                    UnaryOp::Neg
                } else {
                    UnaryOp::Not
                };
                self.emit1(Op::Unary(uop, *x), t, span)
            }
            _ => {
                let desc = self.describe(&v);
                self.error(
                    ErrorCode::TypeMismatch,
                    span,
                    format!("cannot apply unary `{sym}` to {desc}"),
                )
            }
        }
    }

    /// `&&` / `||` with a compile-time `bool` on one side and a runtime scalar `bool` on
    /// the other: `true || x` is `true`, `false && x` is `false`, `false || x` and
    /// `true && x` are `x` (either order; expressions have no side effects). So a branch
    /// on `FLAG || n == 1` with a constant `FLAG = true` is a constant `if` and the other
    /// branch is not compiled. Tiles are left to the element-wise path (the result's
    /// shape comes from the tile).
    fn short_circuit(&self, op: BinOp, a: &Ev, b: &Ev) -> Option<Ev> {
        if !matches!(op, BinOp::And | BinOp::Or) {
            return None;
        }
        let (c, other) = match (a, b) {
            (Ev::Bool(c), Ev::Value(x)) | (Ev::Value(x), Ev::Bool(c)) => (*c, *x),
            _ => return None,
        };
        if self.ty(other) != ValueType::Scalar(DType::Bool) {
            return None;
        }
        Some(match (op, c) {
            (BinOp::Or, true) => Ev::Bool(true),
            (BinOp::And, false) => Ev::Bool(false),
            _ => Ev::Value(other),
        })
    }

    pub(crate) fn binary(
        &mut self,
        op: BinOp,
        a: Ev,
        aspan: Span,
        b: Ev,
        bspan: Span,
        span: Span,
    ) -> Ev {
        let a = self.expect_value(a, aspan);
        let b = self.expect_value(b, bspan);
        if op == BinOp::Pow {
            return self.pow((a, aspan), (b, bspan), span, "`**`");
        }
        if let Some(folded) = self.fold(op, &a, &b, span) {
            return folded;
        }
        if let Some(folded) = self.fold_typed(op, &a, &b, span) {
            return folded;
        }
        if let Some(short) = self.short_circuit(op, &a, &b) {
            return short;
        }
        let what = format!("`{}`", op.symbol());
        let Some((vals, ty)) = self.unify(&[(a, aspan), (b, bspan)], span, &what) else {
            return Ev::Poison;
        };
        let d = ty.dtype();
        let (Some(&x), Some(&y)) = (vals.first(), vals.get(1)) else {
            return Ev::Poison;
        };
        let bad = |c: &mut Self, need: &str, help: &str| {
            let mut diag = Diagnostic::error(
                ErrorCode::TypeMismatch,
                span,
                format!("`{}` needs {need} operands, found `{d}`", op.symbol()),
            )
            .with_secondary(aspan, format!("this is `{}`", c.operand_desc(x)))
            .with_secondary(bspan, format!("this is `{}`", c.operand_desc(y)));
            if !help.is_empty() {
                diag = diag.with_note(help.to_string());
            }
            c.push(diag)
        };
        let bin = |c: &mut Self, bo: BinaryOp| c.emit1(Op::Binary(bo, x, y), ty.clone(), span);
        let cmp = |c: &mut Self, co: CmpOp| {
            c.emit1(Op::Compare(co, x, y), ty.with_dtype(DType::Bool), span)
        };
        let numeric = d.is_int() || d.is_float();
        match op {
            BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem if !numeric => {
                bad(self, "numeric", "help: convert bools to numbers first, e.g. `m as i32`")
            }
            BinOp::Add => bin(self, BinaryOp::Add),
            BinOp::Sub => bin(self, BinaryOp::Sub),
            BinOp::Mul => bin(self, BinaryOp::Mul),
            BinOp::Div => bin(self, BinaryOp::Div),
            BinOp::Rem => bin(self, BinaryOp::Rem),
            BinOp::Eq => cmp(self, CmpOp::Eq),
            BinOp::Ne => cmp(self, CmpOp::Ne),
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge if !numeric => bad(self, "numeric", ""),
            BinOp::Lt => cmp(self, CmpOp::Lt),
            BinOp::Le => cmp(self, CmpOp::Le),
            BinOp::Gt => cmp(self, CmpOp::Gt),
            BinOp::Ge => cmp(self, CmpOp::Ge),
            BinOp::And | BinOp::Or if d != DType::Bool => bad(
                self,
                "`bool`",
                "help: compare first (`x != 0`), or use `&` / `|` for bitwise operations on integers",
            ),
            BinOp::And => bin(self, BinaryOp::And),
            BinOp::Or => bin(self, BinaryOp::Or),
            BinOp::BitAnd | BinOp::BitOr | BinOp::BitXor | BinOp::Shl | BinOp::Shr if !d.is_int() => {
                let help = if d == DType::Bool && matches!(op, BinOp::BitAnd | BinOp::BitOr) {
                    "help: use `&&` / `||` on bools"
                } else {
                    ""
                };
                bad(self, "integer", help)
            }
            BinOp::BitAnd => bin(self, BinaryOp::And),
            BinOp::BitOr => bin(self, BinaryOp::Or),
            BinOp::BitXor => bin(self, BinaryOp::Xor),
            BinOp::Shl => bin(self, BinaryOp::Shl),
            BinOp::Shr => bin(self, BinaryOp::Shr),
            // Routed to `pow` above.
            BinOp::Pow => Ev::Poison,
        }
    }

    /// The type of an operand value, for labels.
    fn operand_desc(&self, v: crate::ir::ValueId) -> ValueType {
        self.ty(v)
    }
}
