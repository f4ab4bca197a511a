//! Element-wise math builtins: the one-argument functions (`exp` ... `erf`), `min` /
//! `max` (element-wise or a reduction, by their arguments), `maximum` / `minimum`,
//! `where`, `fma`, `fdiv`, `pow` and `**`, `cdiv`.
//!
//! Assumes: arguments were matched against the builtin table and evaluated (none is
//! poison); `min`/`max` with a tile and an integer constant were refused as ambiguous by
//! `builtins.rs`.
//! Guarantees: operands are unified to one dtype and one broadcast shape (`unify`)
//! before any IR is emitted; constants fold (`pow(2, 10)` is the constant 1024); an
//! integer power has a constant non-negative exponent and becomes multiplications
//! (square and multiply), so the IR's `Pow` is float-only; every refused form is a
//! located `TypeMismatch` / `NotConstant` / `ConstEval` error with a help.

use super::builtins::Args;
use super::{Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::ir::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::span::Span;
use crate::types::{DType, ValueType};

impl Checker<'_> {
    /// `cdiv(a, b)` = `(a + b - 1) / b` on integers (folded for constants).
    pub(crate) fn cdiv(&mut self, a: &Args, span: Span) -> Ev {
        let (x, xs) = a.p(0);
        let (y, ys) = a.p(1);
        let x = self.expect_value(x, xs);
        let y = self.expect_value(y, ys);
        if let (Ev::Int(m), Ev::Int(n)) = (&x, &y) {
            if *n == 0 {
                return self.error(ErrorCode::ConstEval, span, "division by zero in `cdiv`");
            }
            let v = m
                .checked_add(*n)
                .and_then(|s| s.checked_sub(1))
                .and_then(|s| s.checked_div(*n));
            return self.checked_int(v, span, &format!("`cdiv({m}, {n})`"));
        }
        let Some((vals, ty)) = self.unify(&[(x, xs), (y, ys)], span, "`cdiv`") else {
            return Ev::Poison;
        };
        if !ty.dtype().is_int() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    span,
                    format!("`cdiv` needs integers, found `{}`", ty.dtype()),
                )
                .with_note("help: for floats, use `ceil(a / b)`"),
            );
        }
        let (Some(&p), Some(&q)) = (vals.first(), vals.get(1)) else {
            return Ev::Poison;
        };
        let Some(one) = self.coerce_to(&Ev::Int(1), &ty, span) else {
            return Ev::Poison;
        };
        let Some(s) = self.emit_v(Op::Binary(BinaryOp::Add, p, q), ty.clone(), span) else {
            return Ev::Poison;
        };
        let Some(s) = self.emit_v(Op::Binary(BinaryOp::Sub, s, one), ty.clone(), span) else {
            return Ev::Poison;
        };
        self.emit1(Op::Binary(BinaryOp::Div, s, q), ty, span)
    }

    /// The one-argument math functions: floats only, except `abs` (any number).
    pub(crate) fn math(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        let u = match name {
            "exp" => UnaryOp::Exp,
            "exp2" => UnaryOp::Exp2,
            "log" => UnaryOp::Log,
            "log2" => UnaryOp::Log2,
            "sqrt" => UnaryOp::Sqrt,
            "rsqrt" => UnaryOp::Rsqrt,
            "tanh" => UnaryOp::Tanh,
            "sigmoid" => UnaryOp::Sigmoid,
            "sin" => UnaryOp::Sin,
            "cos" => UnaryOp::Cos,
            "floor" => UnaryOp::Floor,
            "ceil" => UnaryOp::Ceil,
            "erf" => UnaryOp::Erf,
            _ => UnaryOp::Abs,
        };
        let (x, xs) = a.p(0);
        let x = match self.expect_value(x, xs) {
            // A lone integer constant is a float argument here (`exp(1)`).
            Ev::Int(i) if u != UnaryOp::Abs => Ev::Float(i as f64),
            Ev::Int(i) if u == UnaryOp::Abs => {
                return self.checked_int(i.checked_abs(), span, &format!("`abs({i})`"))
            }
            Ev::Float(f) if u == UnaryOp::Abs => return Ev::Float(f.abs()),
            other => other,
        };
        let Some((vals, ty)) = self.unify(&[(x, xs)], span, &format!("`{name}`")) else {
            return Ev::Poison;
        };
        let d = ty.dtype();
        let ok = if u == UnaryOp::Abs {
            d.is_int() || d.is_float()
        } else {
            d.is_float()
        };
        if !ok {
            let need = if u == UnaryOp::Abs {
                "a number"
            } else {
                "a float (f16, bf16 or f32)"
            };
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    xs,
                    format!("`{name}` needs {need}, found `{ty}`"),
                )
                .with_note(format!("help: cast first, e.g. `{name}(x as f32)`")),
            );
        }
        let Some(&v) = vals.first() else {
            return Ev::Poison;
        };
        self.emit1(Op::Unary(u, v), ty, span)
    }

    /// `min` / `max`: `max(a, b)` element-wise (any numbers, broadcasting), `max(t,
    /// axis = k)` the reduction along `k`, `max(t)` the reduction over every element;
    /// `maximum(a, b)` / `minimum(a, b)` are always element-wise. (`max(t, k)` with an
    /// integer constant `k` never reaches here: `builtins.rs` refuses it as ambiguous.)
    pub(crate) fn min_max(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        let is_max = matches!(name, "max" | "maximum");
        let elementwise = matches!(name, "maximum" | "minimum");
        if !elementwise && (a.kw("axis").is_some() || a.pos.len() == 1) {
            let op = if is_max { ReduceOp::Max } else { ReduceOp::Min };
            return self.reduce(op, a.p(0), a.kw("axis"), span);
        }
        let (x, xs) = a.p(0);
        let (y, ys) = a.p(1);
        let x = self.expect_value(x, xs);
        let y = self.expect_value(y, ys);
        match (&x, &y) {
            (Ev::Int(m), Ev::Int(n)) => return Ev::Int(if is_max { *m.max(n) } else { *m.min(n) }),
            (Ev::Float(_) | Ev::Int(_), Ev::Float(_) | Ev::Int(_)) => {
                let f = |e: &Ev| match e {
                    Ev::Float(v) => *v,
                    Ev::Int(i) => *i as f64,
                    _ => 0.0,
                };
                let (p, q) = (f(&x), f(&y));
                return Ev::Float(if is_max { p.max(q) } else { p.min(q) });
            }
            _ => {}
        }
        let Some((vals, ty)) = self.unify(&[(x, xs), (y, ys)], span, &format!("`{name}`")) else {
            return Ev::Poison;
        };
        if ty.dtype() == DType::Bool {
            return self.error(
                ErrorCode::TypeMismatch,
                span,
                format!("`{name}` needs numbers, found `bool`"),
            );
        }
        let bo = if is_max { BinaryOp::Max } else { BinaryOp::Min };
        let (Some(&p), Some(&q)) = (vals.first(), vals.get(1)) else {
            return Ev::Poison;
        };
        self.emit1(Op::Binary(bo, p, q), ty, span)
    }

    /// `where(cond, a, b)`: `cond` is bool; all three broadcast together.
    pub(crate) fn select(&mut self, a: &Args, span: Span) -> Ev {
        let (c, cs) = a.p(0);
        let c = self.expect_value(c, cs);
        let cond_ok = match self.ev_type(&c) {
            Some(t) => t.dtype() == DType::Bool,
            None => matches!(c, Ev::Bool(_) | Ev::Poison),
        };
        if !cond_ok {
            let desc = self.describe(&c);
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    cs,
                    format!("`where` needs a bool condition, found {desc}"),
                )
                .with_label_message("not bool")
                .with_note("help: compare to get a bool, e.g. `x > 0.0`"),
            );
        }
        let Some((vals, ty)) = self.unify(&[a.p(1), a.p(2)], span, "`where`") else {
            return Ev::Poison;
        };
        let cshape = self.ev_type(&c).and_then(|t| t.shape().cloned());
        let shape = match Self::broadcast_shapes(cshape.as_ref(), ty.shape()) {
            Ok(s) => s,
            Err(()) => {
                let cs_text = cshape.map_or("scalar".to_string(), |s| s.to_string());
                let vs_text = ty.shape().map_or("scalar".to_string(), |s| s.to_string());
                return self.push(
                    Diagnostic::error(
                        ErrorCode::ShapeMismatch,
                        span,
                        format!("shapes {cs_text} and {vs_text} cannot be broadcast together in `where`"),
                    )
                    .with_secondary(cs, format!("the condition has shape {cs_text}"))
                    .with_note("extents must be equal or 1, aligned from the right"),
                );
            }
        };
        if let Some(s) = &shape {
            if !self.check_tile_shape(s, span) {
                return Ev::Poison;
            }
        }
        let full = match &shape {
            Some(s) => ValueType::Tile(ty.dtype(), s.clone()),
            None => ValueType::Scalar(ty.dtype()),
        };
        let (Some(&x), Some(&y)) = (vals.first(), vals.get(1)) else {
            return Ev::Poison;
        };
        let (Some(x), Some(y), Some(cv)) = (
            self.broadcast_to(x, full.shape(), span),
            self.broadcast_to(y, full.shape(), span),
            self.coerce_to(&c, &full.with_dtype(DType::Bool), cs),
        ) else {
            return Ev::Poison;
        };
        self.emit1(Op::Select(cv, x, y), full, span)
    }

    /// `fdiv(a, b)` and `fma(a, b, c)` (and `pow`, see [`Checker::pow`]): floats,
    /// broadcasting; integer constants are floats.
    pub(crate) fn float_op(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        if name == "pow" {
            return self.pow(a.p(0), a.p(1), span, "`pow`");
        }
        let items: Vec<(Ev, Span)> = a
            .pos
            .iter()
            .map(|(e, s)| match e {
                Ev::Int(i) => (Ev::Float(*i as f64), *s),
                other => (other.clone(), *s),
            })
            .collect();
        let mut checked = Vec::new();
        for (e, s) in items {
            checked.push((self.expect_value(e, s), s));
        }
        let Some((vals, ty)) = self.unify(&checked, span, &format!("`{name}`")) else {
            return Ev::Poison;
        };
        if !ty.dtype().is_float() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    span,
                    format!("`{name}` needs floats, found `{}`", ty.dtype()),
                )
                .with_note(format!("help: cast first, e.g. `{name}(x as f32, ...)`")),
            );
        }
        match (name, vals.as_slice()) {
            ("pow", [x, y]) => self.emit1(Op::Binary(BinaryOp::Pow, *x, *y), ty, span),
            ("fdiv", [x, y]) => self.emit1(Op::Binary(BinaryOp::FDiv, *x, *y), ty, span),
            ("fma", [x, y, z]) => self.emit1(Op::Fma(*x, *y, *z), ty, span),
            _ => Ev::Poison,
        }
    }

    /// `pow(a, b)` and `a ** b`. Constants fold (`2 ** 10` is 1024; a negative integer
    /// exponent of an integer constant is an error). An integer base needs a constant
    /// exponent ≥ 0 and becomes multiplications (`x ** 0` is 1, wrapping like `*`); a
    /// float base is the IR's `Pow` (C's `powf`), integer constants adapting as floats.
    pub(crate) fn pow(&mut self, a: (Ev, Span), b: (Ev, Span), span: Span, what: &str) -> Ev {
        let (x, xs) = (self.expect_value(a.0, a.1), a.1);
        let (y, ys) = (self.expect_value(b.0, b.1), b.1);
        let float = |e: &Ev| match e {
            Ev::Float(v) => *v,
            Ev::Int(i) => *i as f64,
            _ => 0.0,
        };
        match (&x, &y) {
            (Ev::Poison, _) | (_, Ev::Poison) => return Ev::Poison,
            (Ev::Int(m), Ev::Int(n)) => {
                let Ok(e) = u32::try_from(*n) else {
                    return self.push(
                        Diagnostic::error(
                            ErrorCode::ConstEval,
                            span,
                            format!("the integer power {what} `{m} ** {n}` needs an exponent of at least 0"),
                        )
                        .with_note(format!(
                            "help: for a float result, make the base a float: `{m}.0 ** {n}`"
                        )),
                    );
                };
                return self.checked_int(m.checked_pow(e), span, &format!("`{m} ** {n}`"));
            }
            (Ev::Int(_) | Ev::Float(_), Ev::Int(_) | Ev::Float(_)) => {
                return Ev::Float(float(&x).powf(float(&y)))
            }
            _ => {}
        }
        let int_base = match self.ev_type(&x) {
            Some(t) => t.dtype().is_int(),
            None => matches!(x, Ev::Int(_)) && self.ev_type(&y).is_some_and(|t| t.dtype().is_int()),
        };
        if int_base {
            return self.int_pow((x, xs), (y, ys), span, what);
        }
        let items: Vec<(Ev, Span)> = [(x, xs), (y, ys)]
            .into_iter()
            .map(|(e, s)| match e {
                Ev::Int(i) => (Ev::Float(i as f64), s),
                other => (other, s),
            })
            .collect();
        let Some((vals, ty)) = self.unify(&items, span, what) else {
            return Ev::Poison;
        };
        if !ty.dtype().is_float() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    span,
                    format!("{what} needs numbers, found `{}`", ty.dtype()),
                )
                .with_note("help: convert first, e.g. `(m as f32) ** 2.0`"),
            );
        }
        let (Some(&p), Some(&q)) = (vals.first(), vals.get(1)) else {
            return Ev::Poison;
        };
        let folded = match (
            self.typed_consts.get(&p).copied(),
            self.typed_consts.get(&q).copied(),
        ) {
            (Some(m), Some(n)) => crate::interp::fold_binary(BinaryOp::Pow, m, n),
            _ => None,
        };
        match folded {
            Some(r) => self.emit_const(r, span),
            None => self.emit1(Op::Binary(BinaryOp::Pow, p, q), ty, span),
        }
    }

    /// An integer power: the exponent must be a constant ≥ 0 (an untyped constant or a
    /// typed integer constant); square and multiply, most significant bit first.
    fn int_pow(&mut self, (x, xs): (Ev, Span), (y, ys): (Ev, Span), span: Span, what: &str) -> Ev {
        let e = match (&y, self.typed_const(&y)) {
            (Ev::Int(n), _) => Some(*n),
            (_, Some(crate::types::Scalar::Int(n, _))) => Some(n as i128),
            _ => None,
        };
        let Some(e) = e else {
            let desc = self.describe(&y);
            let runtime = matches!(y, Ev::Value(_)) && self.typed_const(&y).is_none();
            let (code, msg) = if runtime {
                (
                    ErrorCode::NotConstant,
                    format!("an integer power {what} needs a compile-time exponent"),
                )
            } else {
                (
                    ErrorCode::TypeMismatch,
                    format!("an integer power {what} needs an integer exponent, found {desc}"),
                )
            };
            let mut d = Diagnostic::error(code, ys, msg)
                .with_label_message(if runtime {
                    "a runtime value"
                } else {
                    "not an integer"
                })
                .with_secondary(xs, "the base is an integer");
            if matches!(x, Ev::Int(2)) {
                d = d.with_note("help: `1 << n` is 2 to the power `n`");
            }
            d = d.with_note("help: for a float power, convert the base: `(x as f32) ** e`");
            return self.push(d);
        };
        let Ok(e) = u64::try_from(e) else {
            return self.push(
                Diagnostic::error(
                    ErrorCode::ConstEval,
                    ys,
                    format!("an integer power {what} needs an exponent of at least 0, found {e}"),
                )
                .with_label_message("negative")
                .with_note("help: for a float power, convert the base: `(x as f32) ** e`"),
            );
        };
        let Some((vals, ty)) = self.unify(&[(x, xs)], span, what) else {
            return Ev::Poison;
        };
        let Some(&base) = vals.first() else {
            return Ev::Poison;
        };
        if e == 0 {
            return match self.coerce_to(&Ev::Int(1), &ty, span) {
                Some(v) => Ev::Value(v),
                None => Ev::Poison,
            };
        }
        let mut acc = base;
        for bit in (0..63 - e.leading_zeros()).rev() {
            acc = self.mul_folded(acc, acc, &ty, span);
            if (e >> bit) & 1 == 1 {
                acc = self.mul_folded(acc, base, &ty, span);
            }
        }
        Ev::Value(acc)
    }

    /// `a * b` of type `ty`, folded when both are typed constants.
    fn mul_folded(
        &mut self,
        a: crate::ir::ValueId,
        b: crate::ir::ValueId,
        ty: &ValueType,
        span: Span,
    ) -> crate::ir::ValueId {
        let folded = match (self.typed_consts.get(&a), self.typed_consts.get(&b)) {
            (Some(&m), Some(&n)) => crate::interp::fold_binary(BinaryOp::Mul, m, n),
            _ => None,
        };
        let ev = match folded {
            Some(r) => self.emit_const(r, span),
            None => self.emit1(Op::Binary(BinaryOp::Mul, a, b), ty.clone(), span),
        };
        match ev {
            Ev::Value(v) => v,
            _ => a,
        }
    }
}
