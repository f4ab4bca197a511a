//! Expressions: names, literals (untyped until they meet a typed value), unary and
//! binary operators with numpy broadcasting made explicit, casts.
//!
//! Assumes: scopes hold the bindings of the enclosing statements.
//! Guarantees: every `Ev::Value` returned is a valid IR value; binary IR ops get
//! operands of identical type (`Splat`, `Reshape`, `Broadcast` inserted); constant
//! integer/float/bool subexpressions are folded (checked i128 arithmetic).

use super::{scalar_const, Binding, Checker, Ev};
use crate::abi::ConstArg;
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast::{self, BinOp, ExprKind, UnOp};
use crate::ir::{BinaryOp, CmpOp, Op, UnaryOp};
use crate::span::Span;
use crate::types::{DType, Scalar, Shape, ValueType};

impl Checker<'_> {
    pub(crate) fn expr(&mut self, e: &ast::Expr) -> Ev {
        match &e.kind {
            ExprKind::Int(i) => Ev::Int(*i),
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
            ExprKind::Call { func, args, .. } => self.call(func, args, e.span),
        }
    }

    fn name(&mut self, id: &ast::Ident) -> Ev {
        if self.poisoned.contains(&id.name) && self.lookup(&id.name).is_none() {
            return Ev::Poison;
        }
        if let Some(b) = self.lookup(&id.name) {
            return match b.clone() {
                Binding::Var { value, .. } => value,
                Binding::Tensor { index, .. } => Ev::Tensor(index),
                Binding::Generic { value, .. } => match value {
                    ConstArg::Int(i) => Ev::Int(i as i128),
                    ConstArg::Bool(b) => Ev::Bool(b),
                    ConstArg::DType(d) => Ev::DType(d),
                },
            };
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
        }
        self.push(d)
    }

    /// The type of a value-like Ev (None for constants and non-values).
    pub(crate) fn ev_type(&self, ev: &Ev) -> Option<ValueType> {
        match ev {
            Ev::Value(v) => Some(self.ty(*v)),
            _ => None,
        }
    }

    pub(crate) fn describe(&self, ev: &Ev) -> String {
        match ev {
            Ev::Value(v) => format!("`{}`", self.ty(*v)),
            Ev::Int(_) => "an integer constant".into(),
            Ev::Float(_) => "a float constant".into(),
            Ev::Bool(_) => "a bool constant".into(),
            Ev::DType(d) => format!("the dtype `{d}`"),
            Ev::Tensor(i) => format!(
                "the tensor `{}`",
                self.func
                    .params
                    .get(*i as usize)
                    .map_or("?", |p| p.name.as_str())
            ),
            Ev::List(_) => "a list".into(),
            Ev::Poison => "an invalid value".into(),
        }
    }

    /// Errors unless `ev` is a value or a constant usable in arithmetic.
    pub(crate) fn expect_value(&mut self, ev: Ev, span: Span) -> Ev {
        match ev {
            Ev::Value(_) | Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) | Ev::Poison => ev,
            other => {
                let what = self.describe(&other);
                let mut d = Diagnostic::error(
                    ErrorCode::WrongKind,
                    span,
                    format!("expected a value, found {what}"),
                );
                if let Ev::Tensor(_) = other {
                    d = d.with_note("help: read a tensor's elements with `load(t, [index...], [shape...])` or `gather`");
                }
                self.push(d)
            }
        }
    }

    /// Materializes a value or constant as an IR value of `dtype` (constants only;
    /// values must already have it).
    pub(crate) fn materialize(
        &mut self,
        ev: &Ev,
        dtype: DType,
        span: Span,
    ) -> Option<crate::ir::ValueId> {
        match ev {
            Ev::Value(v) => Some(*v),
            Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) => {
                let s = scalar_const(dtype, ev)?;
                match self.emit1(Op::Const(s), ValueType::Scalar(dtype), span) {
                    Ev::Value(v) => Some(v),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The default dtype of a lone constant.
    pub(crate) fn default_dtype(ev: &Ev) -> Option<DType> {
        match ev {
            Ev::Int(_) => Some(DType::I32),
            Ev::Float(_) => Some(DType::F32),
            Ev::Bool(_) => Some(DType::Bool),
            _ => None,
        }
    }

    /// Makes a value of exactly `want` from `ev` (a value of `want`'s dtype with a
    /// broadcastable shape, or a constant).
    pub(crate) fn coerce_to(
        &mut self,
        ev: &Ev,
        want: &ValueType,
        span: Span,
    ) -> Option<crate::ir::ValueId> {
        let v = self.materialize(ev, want.dtype(), span)?;
        self.broadcast_to(v, want.shape(), span)
    }

    /// Broadcasts a value to a tile shape (or leaves a scalar when `shape` is None).
    pub(crate) fn broadcast_to(
        &mut self,
        v: crate::ir::ValueId,
        shape: Option<&Shape>,
        span: Span,
    ) -> Option<crate::ir::ValueId> {
        let ty = self.ty(v);
        let Some(target) = shape else {
            return if ty.shape().is_none() { Some(v) } else { None };
        };
        let d = ty.dtype();
        match ty.shape() {
            None => match self.emit1(Op::Splat(v), ValueType::Tile(d, target.clone()), span) {
                Ev::Value(x) => Some(x),
                _ => None,
            },
            Some(s) if s == target => Some(v),
            Some(s) => {
                if s.rank() > target.rank() {
                    return None;
                }
                let mut cur = v;
                if s.rank() < target.rank() {
                    let mut dims = vec![1u32; target.rank() - s.rank()];
                    dims.extend_from_slice(s.dims());
                    cur = match self.emit1(
                        Op::Reshape(cur),
                        ValueType::Tile(d, Shape(dims.clone())),
                        span,
                    ) {
                        Ev::Value(x) => x,
                        _ => return None,
                    };
                    if dims == target.dims() {
                        return Some(cur);
                    }
                }
                match self.emit1(Op::Broadcast(cur), ValueType::Tile(d, target.clone()), span) {
                    Ev::Value(x) => Some(x),
                    _ => None,
                }
            }
        }
    }

    /// numpy broadcasting of two shapes (None = scalar).
    pub(crate) fn broadcast_shapes(
        a: Option<&Shape>,
        b: Option<&Shape>,
    ) -> Result<Option<Shape>, ()> {
        match (a, b) {
            (None, None) => Ok(None),
            (Some(s), None) | (None, Some(s)) => Ok(Some(s.clone())),
            (Some(x), Some(y)) => {
                let r = x.rank().max(y.rank());
                let mut out = vec![0u32; r];
                for (i, slot) in out.iter_mut().enumerate() {
                    let dx = if i < r - x.rank() {
                        1
                    } else {
                        x.dims()[i - (r - x.rank())]
                    };
                    let dy = if i < r - y.rank() {
                        1
                    } else {
                        y.dims()[i - (r - y.rank())]
                    };
                    *slot = match (dx, dy) {
                        (p, q) if p == q => p,
                        (1, q) => q,
                        (p, 1) => p,
                        _ => return Err(()),
                    };
                }
                Ok(Some(Shape(out)))
            }
        }
    }

    /// Unifies several operands to one dtype and one broadcast shape. Constants adapt to
    /// the values' dtype. Returns the materialized values and their common type.
    pub(crate) fn unify(
        &mut self,
        items: &[(Ev, Span)],
        at: Span,
        what: &str,
    ) -> Option<(Vec<crate::ir::ValueId>, ValueType)> {
        if items.iter().any(|(e, _)| matches!(e, Ev::Poison)) {
            return None;
        }
        let mut dtype: Option<(DType, Span)> = None;
        for (e, sp) in items {
            if let Some(t) = self.ev_type(e) {
                match dtype {
                    None => dtype = Some((t.dtype(), *sp)),
                    Some((d, dsp)) if d != t.dtype() => {
                        let msg = format!("mismatched dtypes in {what}: `{d}` and `{}`", t.dtype());
                        self.push(
                            Diagnostic::error(ErrorCode::TypeMismatch, at, msg)
                                .with_secondary(dsp, format!("this is `{d}`"))
                                .with_secondary(*sp, format!("this is `{}`", t.dtype()))
                                .with_note(format!(
                                    "help: convert one side explicitly, e.g. `(...) as {d}`"
                                )),
                        );
                        return None;
                    }
                    _ => {}
                }
            }
        }
        let dtype = match dtype {
            Some((d, _)) => d,
            None => {
                // All constants: floats win over ints.
                if items.iter().any(|(e, _)| matches!(e, Ev::Float(_))) {
                    DType::F32
                } else {
                    Self::default_dtype(&items[0].0)?
                }
            }
        };
        for (e, sp) in items {
            let ok = match e {
                Ev::Value(_) => true,
                Ev::Int(_) => dtype.is_int() || dtype.is_float(),
                Ev::Float(_) => dtype.is_float(),
                Ev::Bool(_) => dtype == DType::Bool,
                _ => false,
            };
            if !ok {
                let desc = self.describe(e);
                self.push(
                    Diagnostic::error(
                        ErrorCode::TypeMismatch,
                        *sp,
                        format!("{desc} cannot be used as `{dtype}` in {what}"),
                    )
                    .with_label_message(format!("expected `{dtype}`")),
                );
                return None;
            }
        }
        let mut shape: Option<Shape> = None;
        for (e, sp) in items {
            if let Some(t) = self.ev_type(e) {
                match Self::broadcast_shapes(shape.as_ref(), t.shape()) {
                    Ok(s) => shape = s,
                    Err(()) => {
                        let a = shape.map_or("scalar".into(), |s| s.to_string());
                        let b = t.shape().map_or("scalar".into(), |s| s.to_string());
                        self.push(
                            Diagnostic::error(
                                ErrorCode::ShapeMismatch,
                                at,
                                format!(
                                    "shapes {a} and {b} cannot be broadcast together in {what}"
                                ),
                            )
                            .with_secondary(*sp, format!("this has shape {b}"))
                            .with_note("extents must be equal or 1, aligned from the right"),
                        );
                        return None;
                    }
                }
            }
        }
        let ty = match shape {
            Some(s) => ValueType::Tile(dtype, s),
            None => ValueType::Scalar(dtype),
        };
        let mut vals = Vec::new();
        for (e, sp) in items {
            vals.push(self.coerce_to(e, &ty, *sp)?);
        }
        Some((vals, ty))
    }

    fn unary(&mut self, op: UnOp, v: Ev, vspan: Span, span: Span) -> Ev {
        let v = self.expect_value(v, vspan);
        match (op, &v) {
            (_, Ev::Poison) => Ev::Poison,
            (UnOp::Neg, Ev::Int(i)) => Ev::Int(-*i),
            (UnOp::Neg, Ev::Float(f)) => Ev::Float(-*f),
            (UnOp::Not, Ev::Bool(b)) => Ev::Bool(!*b),
            (UnOp::Not, Ev::Int(i)) => Ev::Int(!*i),
            (_, Ev::Value(x)) => {
                let t = self.ty(*x);
                let d = t.dtype();
                let ok = match op {
                    UnOp::Neg => d.is_int() || d.is_float(),
                    UnOp::Not => d == DType::Bool || d.is_int(),
                };
                if !ok {
                    let sym = if op == UnOp::Neg { "-" } else { "!" };
                    return self.error(
                        ErrorCode::TypeMismatch,
                        span,
                        format!("cannot apply unary `{sym}` to `{t}`"),
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
                    format!("cannot apply this operator to {desc}"),
                )
            }
        }
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
        if let Some(folded) = self.fold(op, &a, &b, span) {
            return folded;
        }
        let what = format!("`{}`", op.symbol());
        let Some((vals, ty)) = self.unify(&[(a, aspan), (b, bspan)], span, &what) else {
            return Ev::Poison;
        };
        let d = ty.dtype();
        let (x, y) = (vals[0], vals[1]);
        let bad = |c: &mut Self, need: &str| {
            c.error(
                ErrorCode::TypeMismatch,
                span,
                format!("`{}` needs {need} operands, found `{d}`", op.symbol()),
            )
        };
        let bin = |c: &mut Self, bo: BinaryOp| c.emit1(Op::Binary(bo, x, y), ty.clone(), span);
        let cmp = |c: &mut Self, co: CmpOp| {
            c.emit1(Op::Compare(co, x, y), ty.with_dtype(DType::Bool), span)
        };
        match op {
            BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem if d == DType::Bool => {
                bad(self, "numeric")
            }
            BinOp::Add => bin(self, BinaryOp::Add),
            BinOp::Sub => bin(self, BinaryOp::Sub),
            BinOp::Mul => bin(self, BinaryOp::Mul),
            BinOp::Div => bin(self, BinaryOp::Div),
            BinOp::Rem => bin(self, BinaryOp::Rem),
            BinOp::Eq => cmp(self, CmpOp::Eq),
            BinOp::Ne => cmp(self, CmpOp::Ne),
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge if d == DType::Bool => {
                bad(self, "numeric")
            }
            BinOp::Lt => cmp(self, CmpOp::Lt),
            BinOp::Le => cmp(self, CmpOp::Le),
            BinOp::Gt => cmp(self, CmpOp::Gt),
            BinOp::Ge => cmp(self, CmpOp::Ge),
            BinOp::And | BinOp::Or if d != DType::Bool => bad(self, "`bool`"),
            BinOp::And => bin(self, BinaryOp::And),
            BinOp::Or => bin(self, BinaryOp::Or),
            BinOp::BitAnd | BinOp::BitOr | BinOp::BitXor | BinOp::Shl | BinOp::Shr
                if !d.is_int() =>
            {
                bad(self, "integer")
            }
            BinOp::BitAnd => bin(self, BinaryOp::And),
            BinOp::BitOr => bin(self, BinaryOp::Or),
            BinOp::BitXor => bin(self, BinaryOp::Xor),
            BinOp::Shl => bin(self, BinaryOp::Shl),
            BinOp::Shr => bin(self, BinaryOp::Shr),
        }
    }

    /// Folds an operator over two constants; `None` when either side is not constant.
    fn fold(&mut self, op: BinOp, a: &Ev, b: &Ev, span: Span) -> Option<Ev> {
        use BinOp::*;
        let r = match (a, b) {
            (Ev::Poison, _) | (_, Ev::Poison) => Ev::Poison,
            (Ev::Int(x), Ev::Int(y)) => {
                let (x, y) = (*x, *y);
                let overflow = |c: &mut Self| {
                    c.error(
                        ErrorCode::ConstEval,
                        span,
                        format!("overflow in constant `{x} {} {y}`", op.symbol()),
                    )
                };
                let div0 = |c: &mut Self| {
                    c.error(
                        ErrorCode::ConstEval,
                        span,
                        format!("division by zero in constant `{x} {} {y}`", op.symbol()),
                    )
                };
                match op {
                    Add => x.checked_add(y).map_or_else(|| overflow(self), Ev::Int),
                    Sub => x.checked_sub(y).map_or_else(|| overflow(self), Ev::Int),
                    Mul => x.checked_mul(y).map_or_else(|| overflow(self), Ev::Int),
                    Div if y == 0 => div0(self),
                    Rem if y == 0 => div0(self),
                    Div => Ev::Int(x / y),
                    Rem => Ev::Int(x % y),
                    Eq => Ev::Bool(x == y),
                    Ne => Ev::Bool(x != y),
                    Lt => Ev::Bool(x < y),
                    Le => Ev::Bool(x <= y),
                    Gt => Ev::Bool(x > y),
                    Ge => Ev::Bool(x >= y),
                    BitAnd => Ev::Int(x & y),
                    BitOr => Ev::Int(x | y),
                    BitXor => Ev::Int(x ^ y),
                    Shl if (0..64).contains(&y) => x
                        .checked_shl(y as u32)
                        .map_or_else(|| overflow(self), Ev::Int),
                    Shr if (0..64).contains(&y) => Ev::Int(x >> y),
                    Shl | Shr => overflow(self),
                    And | Or => return None,
                }
            }
            (Ev::Float(_) | Ev::Int(_), Ev::Float(_) | Ev::Int(_)) => {
                let f = |e: &Ev| match e {
                    Ev::Float(v) => *v,
                    Ev::Int(i) => *i as f64,
                    _ => 0.0,
                };
                let (x, y) = (f(a), f(b));
                match op {
                    Add => Ev::Float(x + y),
                    Sub => Ev::Float(x - y),
                    Mul => Ev::Float(x * y),
                    Div => Ev::Float(x / y),
                    Rem => Ev::Float(x % y),
                    Eq => Ev::Bool(x == y),
                    Ne => Ev::Bool(x != y),
                    Lt => Ev::Bool(x < y),
                    Le => Ev::Bool(x <= y),
                    Gt => Ev::Bool(x > y),
                    Ge => Ev::Bool(x >= y),
                    _ => return None,
                }
            }
            (Ev::Bool(x), Ev::Bool(y)) => match op {
                And => Ev::Bool(*x && *y),
                Or => Ev::Bool(*x || *y),
                Eq => Ev::Bool(x == y),
                Ne => Ev::Bool(x != y),
                _ => return None,
            },
            _ => return None,
        };
        Some(r)
    }

    /// `x as D` / `cast(x, D)`.
    pub(crate) fn cast(&mut self, v: Ev, d: DType, vspan: Span, span: Span) -> Ev {
        let v = self.expect_value(v, vspan);
        match &v {
            Ev::Poison => Ev::Poison,
            Ev::Value(x) => {
                let t = self.ty(*x);
                if t.dtype() == d {
                    return v;
                }
                self.emit1(Op::Cast(*x), t.with_dtype(d), span)
            }
            Ev::Int(i) => match d {
                DType::Bool => Ev::Bool(*i != 0),
                _ => match self.materialize(&Ev::Int(*i), d, span) {
                    Some(x) => Ev::Value(x),
                    None => Ev::Poison,
                },
            },
            Ev::Float(f) => {
                let s = if d.is_float() {
                    crate::host::scalar_from_f64(d, *f)
                } else {
                    crate::host::scalar_from_f64(d, f.trunc())
                };
                self.emit1(Op::Const(s), ValueType::Scalar(d), span)
            }
            Ev::Bool(b) => {
                let s = match d {
                    DType::Bool => Scalar::Bool(*b),
                    d if d.is_float() => Scalar::Float(*b as u8 as f64, d),
                    d => Scalar::Int(*b as i64, d),
                };
                self.emit1(Op::Const(s), ValueType::Scalar(d), span)
            }
            _ => Ev::Poison,
        }
    }
}

/// The closest candidate by edit distance, if close enough to be a likely typo.
pub(crate) fn closest(name: &str, candidates: &[String]) -> Option<String> {
    let mut best: Option<(usize, &String)> = None;
    for c in candidates {
        let d = edit_distance(name, c);
        if d <= (name.len().max(2) / 3).max(1) && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c.clone())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        prev = cur;
    }
    prev[b.len()]
}
