//! Compile-time constants: folding of operators over untyped constants and over typed
//! constants, constant arguments (axes, extents, shapes), and conversion of an untyped
//! constant to a `Scalar` of a dtype.
//!
//! Assumes: untyped integers come from literals (at most 2^64 - 1, checked by the
//! parser) and generics (i64). Typed constants are the scalar `Const` values listed in
//! `Checker::typed_consts`.
//! Guarantees: integer folding is exact and checked: every folded integer lies in
//! `INT_MIN..=INT_MAX` (the i64 and u64 bit patterns), anything else, and any division
//! by zero, is a `ConstEval` error; nothing here can overflow or panic. A constant that
//! meets a typed value must fit that dtype (as a signed or unsigned bit pattern). An
//! operation on typed constants folds to the value the interpreter (and the GPU)
//! computes in their dtype (`interp::fold_*`): wrapping, f16/bf16 rounding and all.

use super::{Checker, Ev};
use crate::abi::ConstArg;
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast::{self, BinOp, UnOp};
use crate::interp::{fold_binary, fold_cast, fold_compare, fold_unary};
use crate::ir::{BinaryOp, CmpOp, Op, UnaryOp};
use crate::span::Span;
use crate::types::{DType, Scalar, Shape, ValueType, MAX_TILE_ELEMENTS, MAX_TILE_RANK};

/// The smallest untyped integer constant (i64::MIN).
pub(crate) const INT_MIN: i128 = i64::MIN as i128;
/// The largest untyped integer constant (u64::MAX, the largest literal).
pub(crate) const INT_MAX: i128 = u64::MAX as i128;

impl Checker<'_> {
    /// Evaluates a compile-time constant expression (generic defaults, tensor extents).
    pub(crate) fn const_eval(&mut self, e: &ast::Expr) -> Option<ConstArg> {
        let ev = self.expr(e);
        self.const_arg(ev, e)
    }

    /// The compile-time value of `ev`, the value of expression `e`.
    pub(crate) fn const_arg(&mut self, ev: Ev, e: &ast::Expr) -> Option<ConstArg> {
        match ev {
            Ev::Int(i) => match i64::try_from(i) {
                Ok(v) => Some(ConstArg::Int(v)),
                Err(_) => {
                    self.error(
                        ErrorCode::ConstEval,
                        e.span,
                        format!("constant {i} does not fit in a 64-bit signed integer"),
                    );
                    None
                }
            },
            Ev::Bool(b) => Some(ConstArg::Bool(b)),
            Ev::DType(d) => Some(ConstArg::DType(d)),
            Ev::Poison => None,
            _ => {
                self.push(
                    Diagnostic::error(
                        ErrorCode::NotConstant,
                        e.span,
                        "this must be a compile-time constant",
                    )
                    .with_label_message("not a constant")
                    .with_note(
                        "constants are literals, compile-time parameters, and arithmetic on them",
                    ),
                );
                None
            }
        }
    }

    /// An integer constant, range-checked.
    pub(crate) fn checked_int(&mut self, v: Option<i128>, span: Span, what: &str) -> Ev {
        match v {
            Some(i) if (INT_MIN..=INT_MAX).contains(&i) => Ev::Int(i),
            _ => self.error(
                ErrorCode::ConstEval,
                span,
                format!("overflow in constant {what}"),
            ),
        }
    }

    /// Folds an operator over two constants; `None` when either side is not constant
    /// (or the pair is not foldable, e.g. `&&` on integers, which the caller reports).
    pub(crate) fn fold(&mut self, op: BinOp, a: &Ev, b: &Ev, span: Span) -> Option<Ev> {
        use BinOp::*;
        let r = match (a, b) {
            (Ev::Poison, _) | (_, Ev::Poison) => Ev::Poison,
            (Ev::Int(x), Ev::Int(y)) => {
                let (x, y) = (*x, *y);
                let what = format!("`{x} {} {y}`", op.symbol());
                let div0 = |c: &mut Self| {
                    c.error(
                        ErrorCode::ConstEval,
                        span,
                        format!("division by zero in constant {what}"),
                    )
                };
                match op {
                    Add => self.checked_int(x.checked_add(y), span, &what),
                    Sub => self.checked_int(x.checked_sub(y), span, &what),
                    Mul => self.checked_int(x.checked_mul(y), span, &what),
                    Div | Rem if y == 0 => div0(self),
                    Div => self.checked_int(x.checked_div(y), span, &what),
                    Rem => self.checked_int(x.checked_rem(y), span, &what),
                    Eq => Ev::Bool(x == y),
                    Ne => Ev::Bool(x != y),
                    Lt => Ev::Bool(x < y),
                    Le => Ev::Bool(x <= y),
                    Gt => Ev::Bool(x > y),
                    Ge => Ev::Bool(x >= y),
                    BitAnd => Ev::Int(x & y),
                    BitOr => Ev::Int(x | y),
                    BitXor => self.checked_int(Some(x ^ y), span, &what),
                    Shl => {
                        let v = u32::try_from(y)
                            .ok()
                            .filter(|s| *s < 64)
                            .and_then(|s| 2i128.checked_pow(s))
                            .and_then(|p| x.checked_mul(p));
                        self.checked_int(v, span, &what)
                    }
                    Shr => match u32::try_from(y).ok().filter(|s| *s < 64) {
                        Some(s) => Ev::Int(x >> s),
                        None => self.checked_int(None, span, &what),
                    },
                    And | Or | Pow => return None,
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

    /// The value of a typed constant (see `Checker::typed_consts`).
    pub(crate) fn typed_const(&self, ev: &Ev) -> Option<Scalar> {
        match ev {
            Ev::Value(v) => self.typed_consts.get(v).copied(),
            _ => None,
        }
    }

    /// Emits a typed constant.
    pub(crate) fn emit_const(&mut self, s: Scalar, span: Span) -> Ev {
        self.emit1(Op::Const(s), ValueType::Scalar(s.dtype()), span)
    }

    /// A constant operand as a scalar of `d`: a typed constant of `d`, or an untyped one
    /// that adapts to `d` (and fits it).
    fn const_operand(&self, ev: &Ev, d: DType) -> Option<Scalar> {
        match ev {
            Ev::Value(_) => self.typed_const(ev).filter(|s| s.dtype() == d),
            Ev::Int(i) if d.is_int() && !int_fits(*i, d) => None,
            Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) => scalar_const(d, ev),
            _ => None,
        }
    }

    /// Folds `a op b` when both sides are constants and at least one is typed (the other
    /// adapts to its dtype): a comparison gives a constant `bool`, anything else a typed
    /// constant. `None` when it does not fold; the caller's ordinary path then reports
    /// any error (mixed dtypes, an operator the dtype lacks). `**` is folded by `pow`.
    pub(crate) fn fold_typed(&mut self, op: BinOp, a: &Ev, b: &Ev, span: Span) -> Option<Ev> {
        use BinOp::*;
        let d = self.typed_const(a).or_else(|| self.typed_const(b))?.dtype();
        let x = self.const_operand(a, d)?;
        let y = self.const_operand(b, d)?;
        let numeric = d.is_int() || d.is_float();
        let cmp = match op {
            Eq => CmpOp::Eq,
            Ne => CmpOp::Ne,
            Lt | Le | Gt | Ge if !numeric => return None,
            Lt => CmpOp::Lt,
            Le => CmpOp::Le,
            Gt => CmpOp::Gt,
            Ge => CmpOp::Ge,
            _ => {
                let bop = match op {
                    Add | Sub | Mul | Div | Rem if !numeric => return None,
                    Add => BinaryOp::Add,
                    Sub => BinaryOp::Sub,
                    Mul => BinaryOp::Mul,
                    Div => BinaryOp::Div,
                    Rem => BinaryOp::Rem,
                    And | Or if d != DType::Bool => return None,
                    BitAnd | BitOr | BitXor | Shl | Shr if !d.is_int() => return None,
                    And | BitAnd => BinaryOp::And,
                    Or | BitOr => BinaryOp::Or,
                    BitXor => BinaryOp::Xor,
                    Shl => BinaryOp::Shl,
                    Shr => BinaryOp::Shr,
                    _ => return None,
                };
                let r = fold_binary(bop, x, y)?;
                return Some(self.emit_const(r, span));
            }
        };
        fold_compare(cmp, x, y).map(Ev::Bool)
    }

    /// Folds `-c` / `!c` on a typed constant (`None` otherwise, or where the dtype has no
    /// such operator).
    pub(crate) fn fold_typed_unary(&mut self, op: UnOp, v: &Ev, span: Span) -> Option<Ev> {
        let s = self.typed_const(v)?;
        let u = match op {
            UnOp::Neg if s.dtype() != DType::Bool => UnaryOp::Neg,
            UnOp::Not if !s.dtype().is_float() => UnaryOp::Not,
            _ => return None,
        };
        let r = fold_unary(u, s)?;
        Some(self.emit_const(r, span))
    }

    /// Folds `c as d` on a typed constant.
    pub(crate) fn fold_typed_cast(&mut self, v: &Ev, d: DType, span: Span) -> Option<Ev> {
        let s = self.typed_const(v)?;
        let r = fold_cast(s, d)?;
        Some(self.emit_const(r, span))
    }

    /// `dtype(x)` / `x.dtype`: the dtype of a tensor's elements, of a tile or scalar value
    /// (a typed constant included), or a dtype itself. An untyped constant has none.
    pub(crate) fn dtype_builtin(&mut self, a: &super::builtins::Args) -> Ev {
        let (x, xs) = a.p(0);
        match &x {
            Ev::Tensor(t) => match self.func.tensor_param(*t) {
                Some(tp) => Ev::DType(tp.dtype),
                None => Ev::Poison,
            },
            Ev::Value(v) => Ev::DType(self.ty(*v).dtype()),
            Ev::DType(d) => Ev::DType(*d),
            Ev::Poison => Ev::Poison,
            Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) => {
                let desc = self.describe(&x);
                self.push(
                    Diagnostic::error(
                        ErrorCode::WrongKind,
                        xs,
                        format!("{desc} has no dtype: it takes the dtype of the value it meets"),
                    )
                    .with_label_message("untyped constant")
                    .with_note("help: give it one with a cast, e.g. `1.0 as f32`"),
                )
            }
            other => {
                let desc = self.describe(other);
                self.error(
                    ErrorCode::WrongKind,
                    xs,
                    format!("`dtype` needs a tensor, a tile or a scalar, found {desc}"),
                )
            }
        }
    }

    /// `lowest(T)` / `highest(T)`: the least / greatest value of dtype `T`, as a typed
    /// constant: the identities of `max` / `min` (-inf / +inf for floats, MIN / MAX for
    /// integers, `false` / `true` for `bool`).
    pub(crate) fn extreme(&mut self, name: &str, a: &super::builtins::Args, span: Span) -> Ev {
        let Some(d) = self.expect_dtype(&a.p(0)) else {
            return Ev::Poison;
        };
        let low = name == "lowest";
        let s = match d {
            DType::Bool => Scalar::Bool(!low),
            DType::I32 => Scalar::Int(if low { i32::MIN } else { i32::MAX } as i64, d),
            DType::U32 => Scalar::Int(if low { 0 } else { u32::MAX as i64 }, d),
            DType::I64 => Scalar::Int(if low { i64::MIN } else { i64::MAX }, d),
            DType::F16 | DType::BF16 | DType::F32 => Scalar::Float(
                if low {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                },
                d,
            ),
        };
        self.emit_const(s, span)
    }

    /// A constant integer argument in `lo..=hi` (axes, grid axes, extents).
    pub(crate) fn const_int(
        &mut self,
        (e, sp): &(Ev, Span),
        lo: i64,
        hi: i64,
        what: &str,
    ) -> Option<i64> {
        match e {
            Ev::Int(i) if (lo as i128..=hi as i128).contains(i) => Some(*i as i64),
            Ev::Int(i) => {
                let code = if what.contains("axis") || what.contains("dimension") {
                    ErrorCode::BadAxis
                } else {
                    ErrorCode::BadTileShape
                };
                let msg = if hi < lo {
                    format!("{what} {i} is out of range: there is no valid {what} here")
                } else {
                    format!("{what} {i} is out of range {lo}..={hi}")
                };
                self.error(code, *sp, msg);
                None
            }
            Ev::Poison => None,
            Ev::Value(_) => {
                self.push(
                    Diagnostic::error(
                        ErrorCode::NotConstant,
                        *sp,
                        format!("the {what} must be a compile-time constant"),
                    )
                    .with_label_message("this is a runtime value"),
                );
                None
            }
            other => {
                let desc = self.describe(other);
                self.error(
                    ErrorCode::WrongKind,
                    *sp,
                    format!("expected an integer {what}, found {desc}"),
                );
                None
            }
        }
    }

    /// A list of integer constants (`[2, 0, 1]`), unchecked in value.
    pub(crate) fn const_list(&mut self, (e, sp): &(Ev, Span), what: &str) -> Option<Vec<i64>> {
        let Ev::List(items) = e else {
            if !matches!(e, Ev::Poison) {
                let desc = self.describe(e);
                self.error(
                    ErrorCode::WrongKind,
                    *sp,
                    format!("expected a list like `[4, 128]`, found {desc}"),
                );
            }
            return None;
        };
        let mut out = Vec::new();
        let mut ok = true;
        for it in items {
            match self.const_int(it, i64::MIN, i64::MAX, what) {
                Some(v) => out.push(v),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// A constant tile shape: rank 1 to `MAX_TILE_RANK`, extents ≥ 1, at most
    /// `MAX_TILE_ELEMENTS` elements.
    pub(crate) fn const_shape(&mut self, arg: &(Ev, Span)) -> Option<Shape> {
        let raw = self.const_list(arg, "extent")?;
        let sp = arg.1;
        if raw.is_empty() || raw.len() > MAX_TILE_RANK {
            self.error(
                ErrorCode::BadTileShape,
                sp,
                format!(
                    "a tile has 1 to {MAX_TILE_RANK} dimensions, this shape has {}",
                    raw.len()
                ),
            );
            return None;
        }
        if let Some(bad) = raw.iter().find(|d| **d < 1) {
            self.error(
                ErrorCode::BadTileShape,
                sp,
                format!("tile extent {bad} is not allowed: every extent must be at least 1"),
            );
            return None;
        }
        if let Some(bad) = raw.iter().find(|d| **d > MAX_TILE_ELEMENTS as i64) {
            self.error(
                ErrorCode::BadTileShape,
                sp,
                format!("tile extent {bad} is too large: a tile has at most {MAX_TILE_ELEMENTS} elements"),
            );
            return None;
        }
        let shape = Shape(raw.iter().map(|d| *d as u32).collect());
        self.check_tile_shape(&shape, sp).then_some(shape)
    }

    /// A constant as a `Scalar` of `dtype`, or a reported error (`TypeMismatch` for a
    /// kind that cannot become the dtype, `ConstEval` for an integer that does not fit).
    pub(crate) fn const_scalar(
        &mut self,
        ev: &Ev,
        dtype: DType,
        span: Span,
        what: &str,
    ) -> Option<Scalar> {
        if let Ev::Int(i) = ev {
            if dtype.is_int() && !int_fits(*i, dtype) {
                self.push(
                    Diagnostic::error(
                        ErrorCode::ConstEval,
                        span,
                        format!("the constant {i} does not fit in `{dtype}`{what}"),
                    )
                    .with_label_message(format!("out of range for `{dtype}`")),
                );
                return None;
            }
        }
        match scalar_const(dtype, ev) {
            Some(s) => Some(s),
            None => {
                if !matches!(ev, Ev::Poison) {
                    let desc = self.describe(ev);
                    self.push(
                        Diagnostic::error(
                            ErrorCode::TypeMismatch,
                            span,
                            format!("{desc} cannot be used as `{dtype}`{what}"),
                        )
                        .with_label_message(format!("expected `{dtype}`")),
                    );
                }
                None
            }
        }
    }
}

/// Whether an untyped integer fits an integer dtype as a signed or unsigned bit pattern
/// (`0xFFFFFFFF` is accepted for `i32`, as -1).
pub(crate) fn int_fits(i: i128, d: DType) -> bool {
    let bits = match d {
        DType::I32 | DType::U32 => 32,
        DType::I64 => 64,
        _ => return true,
    };
    let lo = -(1i128 << (bits - 1));
    let hi = (1i128 << bits) - 1;
    (lo..=hi).contains(&i)
}

/// A constant scalar of `dtype` from an untyped constant (integers wrap to the dtype's
/// width); `None` for a kind that cannot become the dtype (a float for an integer, a
/// number for `bool`, ...).
pub(crate) fn scalar_const(dtype: DType, ev: &Ev) -> Option<Scalar> {
    Some(match (ev, dtype) {
        (Ev::Bool(b), DType::Bool) => Scalar::Bool(*b),
        (Ev::Int(i), d) if d.is_int() => Scalar::Int(wrap_int(*i, d), d),
        (Ev::Int(i), d) if d.is_float() => crate::host::scalar_from_f64(d, *i as f64),
        (Ev::Float(f), d) if d.is_float() => crate::host::scalar_from_f64(d, *f),
        _ => return None,
    })
}

/// Wraps an integer to the dtype's width (kept as an i64 bit pattern, sign-extended for
/// signed types, zero-extended for u32).
pub(crate) fn wrap_int(i: i128, d: DType) -> i64 {
    match d {
        DType::I32 => i as i32 as i64,
        DType::U32 => i as u32 as i64,
        _ => i as i64,
    }
}
