//! Dtype rules: what kind of thing an expression is (value, constant, dtype, tensor,
//! list), literal adaptation, unification of operands to one dtype and one broadcast
//! shape, and casts.
//!
//! Assumes: constants are untyped until they meet a typed value.
//! Guarantees: `unify` either reports one error (pointing at the offending operand, with
//! labels giving each operand's type) or returns values of exactly one type; a lone
//! constant defaults to `i32` / `f32` / `bool`; an integer constant adapts to an integer
//! or float dtype (and must fit an integer one), a float constant only to a float dtype,
//! and values of different dtypes never mix implicitly.

use super::{Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::ir::{Op, ValueId};
use crate::span::Span;
use crate::types::{DType, Scalar, Shape, ValueType};

impl Checker<'_> {
    /// The type of a value-like Ev (None for constants and non-values).
    pub(crate) fn ev_type(&self, ev: &Ev) -> Option<ValueType> {
        match ev {
            Ev::Value(v) => Some(self.ty(*v)),
            _ => None,
        }
    }

    /// A short description for messages: "`tile<f32, [128]>`", "an integer constant".
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
            Ev::Scratch(b) => format!(
                "the scratch buffer `{}`",
                self.func
                    .scratch
                    .get(*b as usize)
                    .map_or("?", |s| s.name.as_str())
            ),
            Ev::List(_) => "a list".into(),
            Ev::Unit => "no value (the result of a `store`, `scatter` or similar)".into(),
            Ev::Poison => "an invalid value".into(),
        }
    }

    /// Errors (`WrongKind`) unless `ev` is a value or a constant usable in arithmetic.
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
                match other {
                    Ev::Tensor(_) => {
                        d = d.with_note("help: read a tensor's elements with `load(t, [index...], [shape...])` or `gather`");
                    }
                    Ev::DType(dt) => {
                        d = d.with_note(format!(
                            "help: a dtype names a type; to convert a value use `x as {dt}`"
                        ));
                    }
                    _ => {}
                }
                self.push(d)
            }
        }
    }

    /// A dtype argument (`zeros([4], f32)`), else `WrongKind`.
    pub(crate) fn expect_dtype(&mut self, (e, sp): &(Ev, Span)) -> Option<DType> {
        match e {
            Ev::DType(d) => Some(*d),
            Ev::Poison => None,
            other => {
                let desc = self.describe(other);
                self.error(
                    ErrorCode::WrongKind,
                    *sp,
                    format!("expected a dtype, found {desc}"),
                );
                None
            }
        }
    }

    /// A tensor parameter argument, else `WrongKind`.
    pub(crate) fn expect_tensor(&mut self, (e, sp): &(Ev, Span)) -> Option<u32> {
        match e {
            Ev::Tensor(t) => Some(*t),
            Ev::Poison => None,
            other => {
                let desc = self.describe(other);
                self.error(
                    ErrorCode::WrongKind,
                    *sp,
                    format!("expected a tensor parameter, found {desc}"),
                );
                None
            }
        }
    }

    /// A tile value argument, else `WrongKind`.
    pub(crate) fn expect_tile(&mut self, (e, sp): &(Ev, Span)) -> Option<(ValueId, DType, Shape)> {
        if let Ev::Value(v) = e {
            if let ValueType::Tile(d, s) = self.ty(*v) {
                return Some((*v, d, s));
            }
        }
        if !matches!(e, Ev::Poison) {
            let desc = self.describe(e);
            self.error(
                ErrorCode::WrongKind,
                *sp,
                format!("expected a tile, found {desc}"),
            );
        }
        None
    }

    /// Materializes a value or constant as an IR value of `dtype`. Constants become
    /// `Const` scalars (errors reported: a kind that cannot become the dtype, an integer
    /// that does not fit); values are returned as they are (callers check their dtype);
    /// other kinds give `None` silently (callers check kinds first).
    pub(crate) fn materialize(&mut self, ev: &Ev, dtype: DType, span: Span) -> Option<ValueId> {
        match ev {
            Ev::Value(v) => Some(*v),
            Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) => {
                let s = self.const_scalar(ev, dtype, span, "")?;
                self.emit_v(Op::Const(s), ValueType::Scalar(dtype), span)
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

    /// Unifies several operands (values or constants) to one dtype and one broadcast
    /// shape. Constants adapt to the values' dtype. Returns the materialized values and
    /// their common type; on `None` an error has been reported (or an operand was poison).
    pub(crate) fn unify(
        &mut self,
        items: &[(Ev, Span)],
        at: Span,
        what: &str,
    ) -> Option<(Vec<ValueId>, ValueType)> {
        if items.iter().any(|(e, _)| matches!(e, Ev::Poison)) {
            return None;
        }
        let mut dtype: Option<(DType, Span)> = None;
        for (e, sp) in items {
            let Some(t) = self.ev_type(e) else { continue };
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
        let dtype = match dtype {
            Some((d, _)) => d,
            // All constants: floats win over ints.
            None if items.iter().any(|(e, _)| matches!(e, Ev::Float(_))) => DType::F32,
            None => Self::default_dtype(&items.first()?.0)?,
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
            let Some(t) = self.ev_type(e) else { continue };
            match Self::broadcast_shapes(shape.as_ref(), t.shape()) {
                Ok(s) => shape = s,
                Err(()) => {
                    let a = shape.map_or("scalar".into(), |s| s.to_string());
                    let b = t.shape().map_or("scalar".into(), |s| s.to_string());
                    self.push(
                        Diagnostic::error(
                            ErrorCode::ShapeMismatch,
                            at,
                            format!("shapes {a} and {b} cannot be broadcast together in {what}"),
                        )
                        .with_secondary(*sp, format!("this has shape {b}"))
                        .with_note("extents must be equal or 1, aligned from the right"),
                    );
                    return None;
                }
            }
        }
        if let Some(s) = &shape {
            if !self.check_tile_shape(s, at) {
                return None;
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

    /// `x as D` / `cast(x, D)`, between any dtypes. Integer constants wrap to the dtype;
    /// float constants truncate toward zero and saturate when converted to integers.
    pub(crate) fn cast(&mut self, v: Ev, d: DType, vspan: Span, span: Span) -> Ev {
        let v = self.expect_value(v, vspan);
        let s = match &v {
            Ev::Poison => return Ev::Poison,
            Ev::Value(x) => {
                let t = self.ty(*x);
                if t.dtype() == d {
                    return v;
                }
                if let Some(folded) = self.fold_typed_cast(&v, d, span) {
                    return folded;
                }
                return self.emit1(Op::Cast(*x), t.with_dtype(d), span);
            }
            Ev::Int(i) => match d {
                DType::Bool => Scalar::Bool(*i != 0),
                d if d.is_int() => Scalar::Int(super::wrap_int(*i, d), d),
                d => crate::host::scalar_from_f64(d, *i as f64),
            },
            Ev::Float(f) => match d {
                d if d.is_float() => crate::host::scalar_from_f64(d, *f),
                DType::Bool => Scalar::Bool(*f != 0.0),
                d => crate::host::scalar_from_f64(d, f.trunc()),
            },
            Ev::Bool(b) => match d {
                DType::Bool => Scalar::Bool(*b),
                d if d.is_float() => Scalar::Float(*b as u8 as f64, d),
                d => Scalar::Int(*b as i64, d),
            },
            _ => return Ev::Poison,
        };
        self.emit1(Op::Const(s), ValueType::Scalar(d), span)
    }
}
