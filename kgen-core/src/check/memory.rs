//! Memory access and matrix multiply: cuTile-style `load`/`store` (tile coordinates),
//! Triton-style `gather`/`scatter`/`atomic_add` (element offsets and masks), `dot`.
//!
//! Assumes: arguments were matched against the builtin table (`builtins.rs`), so the
//! required positional arguments exist and none is poison.
//! Guarantees: the emitted ops follow their `ir::Op` contracts: one `i32` scalar index
//! per tensor dimension for `Load`/`Store` and a tile of the tensor's rank and dtype;
//! for `Gather`/`Scatter`/`AtomicAdd` one integer tile per dimension, the mask (bool)
//! and the value all of one broadcast shape, the value of the tensor's dtype
//! (`atomic_add`: f32 and i32 tensors only); padding and `other` are constants of the
//! tensor's dtype (an untyped constant that fits it, or a typed constant of it:
//! `pad = lowest(T)`). `dot` checks `[M, K] x [K, N] + [M, N]`, the accumulator dtype and
//! that a TF32 `input_precision` has f32 operands.

use super::builtins::{Args, PRECISION_KW};
use super::{Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::ir::{InputPrecision, Op, TensorParam, ValueId};
use crate::span::Span;
use crate::types::{DType, Scalar, Shape, ValueType};

/// The checked operands of an offset access (see `Checker::indexed_parts`).
pub(super) struct IndexedParts {
    pub tensor: u32,
    pub param: TensorParam,
    pub offsets: Vec<crate::ir::ValueId>,
    pub mask: Option<crate::ir::ValueId>,
    pub shape: Shape,
    /// The value argument of `scatter` / `atomic_add`.
    pub value: Option<(Ev, Span)>,
}

impl Checker<'_> {
    /// The tensor argument of a memory builtin and its declaration.
    pub(super) fn tensor_arg(&mut self, arg: &(Ev, Span)) -> Option<(u32, TensorParam)> {
        let t = self.expect_tensor(arg)?;
        let tp = self.func.tensor_param(t).cloned()?;
        Some((t, tp))
    }

    /// One i32 scalar per tensor dimension (tile coordinates of `load`/`store`).
    pub(super) fn tile_index(
        &mut self,
        tp: &TensorParam,
        arg: &(Ev, Span),
    ) -> Option<Vec<ValueId>> {
        let rank = tp.rank();
        let Ev::List(items) = &arg.0 else {
            let desc = self.describe(&arg.0);
            self.push(
                Diagnostic::error(
                    ErrorCode::BadAccess,
                    arg.1,
                    format!("the index must be a list with one entry per tensor dimension, like `[row, 0]`; found {desc}"),
                ),
            );
            return None;
        };
        if items.len() != rank {
            self.push(
                Diagnostic::error(
                    ErrorCode::BadAccess,
                    arg.1,
                    format!(
                        "this tensor has {rank} dimension(s), but the index has {}",
                        items.len()
                    ),
                )
                .with_note("give one tile coordinate per dimension"),
            );
            return None;
        }
        let mut out = Vec::new();
        for (e, sp) in items {
            match e {
                Ev::Value(v) if self.ty(*v) == ValueType::Scalar(DType::I32) => out.push(*v),
                Ev::Int(_) => out.push(self.materialize(e, DType::I32, *sp)?),
                Ev::Poison => return None,
                other => {
                    let desc = self.describe(other);
                    let mut d = Diagnostic::error(
                        ErrorCode::BadAccess,
                        *sp,
                        format!("a tile coordinate must be an i32 scalar, found {desc}"),
                    );
                    if let Some(ValueType::Tile(..)) = self.ev_type(other) {
                        d = d.with_note("help: `load`/`store` take tile coordinates; use `gather`/`scatter` for per-element offsets");
                    }
                    self.push(d);
                    return None;
                }
            }
        }
        Some(out)
    }

    /// A constant of the tensor's dtype for `pad` / `other` (default 0).
    pub(super) fn fill_value(
        &mut self,
        arg: Option<(Ev, Span)>,
        dtype: DType,
        what: &str,
    ) -> Option<Scalar> {
        let Some((e, sp)) = arg else {
            return super::scalar_const(dtype, &Ev::Int(0)).or(Some(Scalar::Bool(false)));
        };
        if let Some(c) = self.typed_const(&e) {
            if c.dtype() == dtype {
                return Some(c);
            }
            self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    sp,
                    format!(
                        "`{what}` is a `{}` constant, but the tensor holds `{dtype}`",
                        c.dtype()
                    ),
                )
                .with_label_message(format!("a `{}` constant", c.dtype()))
                .with_note(format!("help: convert it: `(...) as {dtype}`")),
            );
            return None;
        }
        if let Ev::Value(_) = e {
            self.push(
                Diagnostic::error(
                    ErrorCode::NotConstant,
                    sp,
                    format!("`{what}` must be a compile-time constant"),
                )
                .with_label_message("this is a runtime value")
                .with_note("help: use `where(mask, x, value)` on the result for a runtime value"),
            );
            return None;
        }
        let e = self.expect_value(e, sp);
        if matches!(e, Ev::Poison) {
            return None;
        }
        self.const_scalar(
            &e,
            dtype,
            sp,
            &format!(" as `{what}` of a `{dtype}` tensor"),
        )
    }

    pub(crate) fn load(&mut self, a: &Args, span: Span) -> Ev {
        let Some((t, tp)) = self.tensor_arg(&a.p(0)) else {
            return Ev::Poison;
        };
        let index = self.tile_index(&tp, &a.p(1));
        let shape = self.const_shape(&a.p(2));
        let (Some(index), Some(shape)) = (index, shape) else {
            return Ev::Poison;
        };
        if shape.rank() != tp.rank() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadAccess,
                    a.p(2).1,
                    format!(
                        "the tile shape has {} dimension(s), the tensor {}",
                        shape.rank(),
                        tp.rank()
                    ),
                )
                .with_note("use 1 for a dimension you index one at a time, then `reshape`"),
            );
        }
        let Some(padding) = self.fill_value(a.kw("pad"), tp.dtype, "pad") else {
            return Ev::Poison;
        };
        self.emit1(
            Op::Load {
                tensor: t,
                index,
                padding,
                eviction: a.eviction,
            },
            ValueType::Tile(tp.dtype, shape),
            span,
        )
    }

    pub(crate) fn store(&mut self, a: &Args, span: Span) -> Ev {
        let Some((t, tp)) = self.tensor_arg(&a.p(0)) else {
            return Ev::Poison;
        };
        let index = self.tile_index(&tp, &a.p(1));
        let (v, vs) = a.p(2);
        let tile = self.expect_tile(&(v, vs));
        let (Some(index), Some((v, d, s))) = (index, tile) else {
            return Ev::Poison;
        };
        if d != tp.dtype {
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadMemoryOp,
                    vs,
                    format!("cannot store a `{d}` tile into a `{}` tensor", tp.dtype),
                )
                .with_note(format!("help: convert it: `(...) as {}`", tp.dtype)),
            );
        }
        if s.rank() != tp.rank() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadAccess,
                    vs,
                    format!(
                        "the tile {s} has {} dimension(s), the tensor {}",
                        s.rank(),
                        tp.rank()
                    ),
                )
                .with_note("reshape the tile to the tensor's rank, using 1 for indexed dimensions"),
            );
        }
        self.emit(
            Op::Store {
                tensor: t,
                index,
                value: v,
                eviction: a.eviction,
            },
            vec![],
            span,
        );
        Ev::Unit
    }

    /// `gather`, `scatter` and `atomic_add`.
    pub(crate) fn indexed(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        match self.indexed_parts(name, a, span, None) {
            Ok(parts) => self.emit_indexed(name, a, span, parts),
            Err(e) => e,
        }
    }

    /// The checked operands of an offset access (`gather`, `scatter`, `atomic_add`, and
    /// the gather of `scratch_gather`, whose shape is `fixed`: its slots'): the tensor,
    /// the offsets and mask coerced to the common shape, and the value to write.
    pub(super) fn indexed_parts(
        &mut self,
        name: &str,
        a: &Args,
        span: Span,
        fixed: Option<&Shape>,
    ) -> Result<IndexedParts, Ev> {
        let Some((t, tp)) = self.tensor_arg(&a.p(0)) else {
            return Err(Ev::Poison);
        };
        let (offs_ev, offs_span) = a.p(1);
        let Ev::List(offs) = offs_ev else {
            let desc = self.describe(&offs_ev);
            return Err(self.error(
                ErrorCode::BadAccess,
                offs_span,
                format!("offsets must be a list with one integer tile per tensor dimension, found {desc}"),
            ));
        };
        if offs.len() != tp.rank() {
            return Err(self.push(
                Diagnostic::error(
                    ErrorCode::BadAccess,
                    offs_span,
                    format!(
                        "this tensor has {} dimension(s), but {} offset(s) were given",
                        tp.rank(),
                        offs.len()
                    ),
                )
                .with_note("give one element-offset tile per dimension"),
            ));
        }
        if name == "atomic_add" && !matches!(tp.dtype, DType::F32 | DType::I32) {
            return Err(self.push(
                Diagnostic::error(
                    ErrorCode::BadMemoryOp,
                    a.p(0).1,
                    format!(
                        "`atomic_add` supports f32 and i32 tensors, not `{}`",
                        tp.dtype
                    ),
                )
                .with_note("accumulate in an f32 or i32 tensor and convert afterwards"),
            ));
        }
        let mask = a.kw("mask");
        let value = if matches!(name, "gather" | "scratch_gather") {
            None
        } else {
            Some(a.p(2))
        };
        // The common shape: offsets, mask and value broadcast together.
        let mut parts: Vec<(Ev, Span)> = offs.clone();
        parts.extend(mask.iter().cloned());
        parts.extend(value.iter().cloned());
        let mut shape: Option<Shape> = fixed.cloned();
        for (e, sp) in &parts {
            let e = self.expect_value(e.clone(), *sp);
            if matches!(e, Ev::Poison) {
                return Err(Ev::Poison);
            }
            let Some(ty) = self.ev_type(&e) else { continue };
            match Self::broadcast_shapes(shape.as_ref(), ty.shape()) {
                Ok(s) => shape = s,
                Err(()) => {
                    let have = shape.map_or("scalar".into(), |s| s.to_string());
                    let this = ty.shape().map_or("scalar".into(), |s| s.to_string());
                    if let Some(want) = fixed {
                        return Err(self.push(
                            Diagnostic::error(
                                ErrorCode::ShapeMismatch,
                                *sp,
                                format!("shape {this} does not broadcast to the slots' shape {want}"),
                            )
                            .with_label_message(format!("this has shape {this}"))
                            .with_note(format!(
                                "`{name}` fills one slot: its offsets and mask must broadcast to {want}"
                            )),
                        ));
                    }
                    return Err(self.push(
                        Diagnostic::error(
                            ErrorCode::ShapeMismatch,
                            *sp,
                            format!("shape {this} does not broadcast with the other offsets"),
                        )
                        .with_label_message(format!("this has shape {this}"))
                        .with_note(format!(
                            "the offsets, mask and value before it broadcast to {have}"
                        )),
                    ));
                }
            }
        }
        if let (Some(want), Some(got)) = (fixed, &shape) {
            if want != got {
                return Err(self.push(
                    Diagnostic::error(
                        ErrorCode::ShapeMismatch,
                        a.p(1).1,
                        format!("the offsets and mask broadcast to {got}, not to the slots' shape {want}"),
                    )
                    .with_note(format!("`{name}` fills one slot: its offsets must broadcast to {want}")),
                ));
            }
        }
        let Some(shape) = shape else {
            return Err(self.push(
                Diagnostic::error(
                    ErrorCode::BadAccess,
                    span,
                    format!("`{name}` needs at least one tile among its offsets or value"),
                )
                .with_note("help: use `arange` to build offset tiles, or `load` for one tile"),
            ));
        };
        if !self.check_tile_shape(&shape, span) {
            return Err(Ev::Poison);
        }
        let mut offsets = Vec::new();
        for (e, sp) in &offs {
            let d = match self.ev_type(e) {
                Some(t) if t.dtype().is_int() => t.dtype(),
                None if matches!(e, Ev::Int(_)) => DType::I32,
                _ => {
                    let desc = self.describe(e);
                    return Err(self.error(
                        ErrorCode::TypeMismatch,
                        *sp,
                        format!("offsets must be integers, found {desc}"),
                    ));
                }
            };
            let Some(v) = self.coerce_to(e, &ValueType::Tile(d, shape.clone()), *sp) else {
                return Err(Ev::Poison);
            };
            offsets.push(v);
        }
        let mask = match mask {
            None => None,
            Some((e, sp)) => {
                let ok = matches!(e, Ev::Bool(_))
                    || self.ev_type(&e).is_some_and(|t| t.dtype() == DType::Bool);
                if !ok {
                    let desc = self.describe(&e);
                    return Err(self.push(
                        Diagnostic::error(
                            ErrorCode::TypeMismatch,
                            sp,
                            format!("the mask must be bool, found {desc}"),
                        )
                        .with_note("help: compare to get a mask, e.g. `offs < shape(t, 0)`"),
                    ));
                }
                let want = ValueType::Tile(DType::Bool, shape.clone());
                let Some(v) = self.coerce_to(&e, &want, sp) else {
                    return Err(Ev::Poison);
                };
                Some(v)
            }
        };
        Ok(IndexedParts {
            tensor: t,
            param: tp,
            offsets,
            mask,
            shape,
            value,
        })
    }

    /// Emits a checked `gather`, `scatter` or `atomic_add`.
    fn emit_indexed(&mut self, name: &str, a: &Args, span: Span, parts: IndexedParts) -> Ev {
        let IndexedParts {
            tensor: t,
            param: tp,
            offsets,
            mask,
            shape,
            value,
        } = parts;
        let tile = ValueType::Tile(tp.dtype, shape);
        let Some((e, sp)) = value else {
            let Some(other) = self.fill_value(a.kw("other"), tp.dtype, "other") else {
                return Ev::Poison;
            };
            return self.emit1(
                Op::Gather {
                    tensor: t,
                    offsets,
                    mask,
                    other,
                    eviction: a.eviction,
                },
                tile,
                span,
            );
        };
        if let Some(vt) = self.ev_type(&e) {
            if vt.dtype() != tp.dtype {
                return self.push(
                    Diagnostic::error(
                        ErrorCode::BadMemoryOp,
                        sp,
                        format!(
                            "cannot write `{}` values into a `{}` tensor",
                            vt.dtype(),
                            tp.dtype
                        ),
                    )
                    .with_note(format!("help: convert them: `(...) as {}`", tp.dtype)),
                );
            }
        }
        let Some(v) = self.coerce_to(&e, &tile, sp) else {
            return Ev::Poison;
        };
        if name == "scatter" {
            self.emit(
                Op::Scatter {
                    tensor: t,
                    offsets,
                    value: v,
                    mask,
                    eviction: a.eviction,
                },
                vec![],
                span,
            );
            return Ev::Unit;
        }
        self.emit1(
            Op::AtomicAdd {
                tensor: t,
                offsets,
                value: v,
                mask,
            },
            tile,
            span,
        )
    }

    /// `dot(a, b, acc, input_precision = p)`: `a: [M, K]`, `b: [K, N]`, `acc: [M, N]`;
    /// float inputs need an f32 accumulator, integer inputs an i32 one. The result has the
    /// accumulator's type. A TF32 precision (`tf32`, `tf32x3`) needs f32 operands.
    pub(crate) fn dot(&mut self, a: &Args, span: Span) -> Ev {
        let (pa, pb, pc) = (a.p(0), a.p(1), a.p(2));
        let (x, y, z) = (
            self.expect_tile(&pa),
            self.expect_tile(&pb),
            self.expect_tile(&pc),
        );
        let (Some((x, xd, xs)), Some((y, yd, ys)), Some((z, zd, zs))) = (x, y, z) else {
            return Ev::Poison;
        };
        let (m, k1, k2, n) = match (xs.dims(), ys.dims()) {
            ([m, k1], [k2, n]) => (*m, *k1, *k2, *n),
            _ => (0, 0, 1, 0),
        };
        if k1 != k2 || zs.dims() != [m, n] {
            return self.push(
                Diagnostic::error(
                    ErrorCode::ShapeMismatch,
                    span,
                    format!(
                        "`dot` needs a: [M, K], b: [K, N], acc: [M, N]; found {xs}, {ys}, {zs}"
                    ),
                )
                .with_secondary(pa.1, format!("a has shape {xs}"))
                .with_secondary(pb.1, format!("b has shape {ys}"))
                .with_secondary(pc.1, format!("acc has shape {zs}")),
            );
        }
        if xd != yd {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    span,
                    format!("`dot` operands must have one dtype, found `{xd}` and `{yd}`"),
                )
                .with_secondary(pa.1, format!("this is `{xd}`"))
                .with_secondary(pb.1, format!("this is `{yd}`"))
                .with_note(format!("help: convert one side, e.g. `(...) as {xd}`")),
            );
        }
        if !matches!(xd, DType::F16 | DType::BF16 | DType::F32 | DType::I32) {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    span,
                    format!("`dot` of `{xd}` tiles is not supported"),
                )
                .with_secondary(pa.1, format!("this is `tile<{xd}, {xs}>`"))
                .with_note(
                    "help: `dot` takes f16 or bf16 tiles (tensor cores, f32 accumulator), f32 \
                     tiles (exact FMA, f32 accumulator) or i32 tiles (i32 accumulator): cast \
                     the operands first",
                ),
            );
        }
        let want = if xd.is_float() {
            DType::F32
        } else {
            DType::I32
        };
        if zd != want {
            let kind = if xd.is_float() { "float" } else { "integer" };
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    pc.1,
                    format!(
                        "`dot` of {kind} tiles accumulates in {want}; the accumulator is `{zd}`"
                    ),
                )
                .with_label_message(format!("expected `tile<{want}, {zs}>`"))
                .with_note(format!(
                    "help: start from `zeros({zs}, {want})` and convert the result afterwards"
                )),
            );
        }
        let precision = match a.precision {
            Some((p, ps)) if p.is_tf32() && xd != DType::F32 => {
                let why = if matches!(xd, DType::F16 | DType::BF16) {
                    format!(
                        "help: `{xd}` operands already run on the tensor cores with exact \
                         products: drop `{PRECISION_KW} = {}`",
                        p.name()
                    )
                } else {
                    format!("help: TF32 is a float format; `{xd}` products stay exact")
                };
                return self.push(
                    Diagnostic::error(
                        ErrorCode::TypeMismatch,
                        ps,
                        format!(
                            "`{PRECISION_KW} = {}` applies to f32 operands only; these are `{xd}`",
                            p.name()
                        ),
                    )
                    .with_label_message("needs f32 operands")
                    .with_secondary(pa.1, format!("this is `tile<{xd}, {xs}>`"))
                    .with_note(why),
                );
            }
            Some((p, _)) => p,
            None => InputPrecision::Ieee,
        };
        self.emit1(
            Op::Dot {
                a: x,
                b: y,
                acc: z,
                precision,
            },
            ValueType::Tile(zd, zs),
            span,
        )
    }
}
