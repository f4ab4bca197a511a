//! Shapes: numpy broadcasting made explicit, the tile-shape rules, and the shape
//! builtins (`reshape`, `broadcast`, `expand_dims`, `transpose`, `permute`),
//! reductions (along an axis, or over every element) and `item`.
//!
//! Assumes: shapes of existing values already obey the tile rules.
//! Guarantees: `broadcast_to` emits exactly the IR the invariants ask for: `Splat` for a
//! scalar, `Reshape` to prepend size-1 dimensions (rank alignment), then `Broadcast` to
//! repeat size-1 dimensions, so element-wise operands end with identical types. Every
//! shape it creates has rank 1..=`MAX_TILE_RANK`, extents ≥ 1 and at most
//! `MAX_TILE_ELEMENTS` elements (else `BadTileShape`).

use super::{Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::ir::{Op, ReduceOp, ValueId};
use crate::span::Span;
use crate::types::{DType, Shape, ValueType, MAX_TILE_ELEMENTS, MAX_TILE_RANK};

impl Checker<'_> {
    /// numpy broadcasting of two shapes (None = scalar): aligned on the right, extents
    /// equal or 1.
    pub(crate) fn broadcast_shapes(
        a: Option<&Shape>,
        b: Option<&Shape>,
    ) -> Result<Option<Shape>, ()> {
        let (x, y) = match (a, b) {
            (None, None) => return Ok(None),
            (Some(s), None) | (None, Some(s)) => return Ok(Some(s.clone())),
            (Some(x), Some(y)) => (x, y),
        };
        let r = x.rank().max(y.rank());
        let pad = |s: &Shape| -> Vec<u32> {
            let mut v = vec![1u32; r - s.rank()];
            v.extend_from_slice(s.dims());
            v
        };
        let (px, py) = (pad(x), pad(y));
        let mut out = Vec::with_capacity(r);
        for (&dx, &dy) in px.iter().zip(&py) {
            out.push(match (dx, dy) {
                (p, q) if p == q => p,
                (1, q) => q,
                (p, 1) => p,
                _ => return Err(()),
            });
        }
        Ok(Some(Shape(out)))
    }

    /// Checks the tile rules for a shape the checker is about to create; reports
    /// `BadTileShape` at `span` and returns false if they fail.
    pub(crate) fn check_tile_shape(&mut self, s: &Shape, span: Span) -> bool {
        let msg = if s.rank() == 0 || s.rank() > MAX_TILE_RANK {
            format!(
                "a tile has 1 to {MAX_TILE_RANK} dimensions, {s} has {}",
                s.rank()
            )
        } else if s.dims().contains(&0) {
            format!("tile {s} has an empty dimension; every extent must be at least 1")
        } else if s.num_elements() > MAX_TILE_ELEMENTS {
            format!(
                "tile {s} has {} elements; the limit is {MAX_TILE_ELEMENTS}",
                s.num_elements()
            )
        } else {
            return true;
        };
        self.error(ErrorCode::BadTileShape, span, msg);
        false
    }

    /// Makes a value of exactly `want` from `ev` (a value of `want`'s dtype with a
    /// broadcastable shape, or a constant). Reports constants that cannot become the
    /// dtype; returns `None` silently for a value whose shape does not broadcast (the
    /// callers check shapes first).
    pub(crate) fn coerce_to(&mut self, ev: &Ev, want: &ValueType, span: Span) -> Option<ValueId> {
        let v = self.materialize(ev, want.dtype(), span)?;
        self.broadcast_to(v, want.shape(), span)
    }

    /// Broadcasts a value to a tile shape (or leaves a scalar when `shape` is None).
    /// `None` if the value's shape does not broadcast to it.
    pub(crate) fn broadcast_to(
        &mut self,
        v: ValueId,
        shape: Option<&Shape>,
        span: Span,
    ) -> Option<ValueId> {
        let ty = self.ty(v);
        let Some(target) = shape else {
            return ty.shape().is_none().then_some(v);
        };
        let d = ty.dtype();
        let Some(s) = ty.shape() else {
            return self.emit_v(Op::Splat(v), ValueType::Tile(d, target.clone()), span);
        };
        if s == target {
            return Some(v);
        }
        match Self::broadcast_shapes(Some(s), Some(target)) {
            Ok(Some(r)) if &r == target => {}
            _ => return None,
        }
        let mut cur = v;
        if s.rank() < target.rank() {
            let mut dims = vec![1u32; target.rank() - s.rank()];
            dims.extend_from_slice(s.dims());
            cur = self.emit_v(
                Op::Reshape(cur),
                ValueType::Tile(d, Shape(dims.clone())),
                span,
            )?;
            if dims == target.dims() {
                return Some(cur);
            }
        }
        self.emit_v(Op::Broadcast(cur), ValueType::Tile(d, target.clone()), span)
    }

    /// `reshape(x, shape)` and `broadcast(x, shape)`.
    pub(crate) fn reshape_or_broadcast(
        &mut self,
        name: &str,
        x: (Ev, Span),
        shape: (Ev, Span),
        span: Span,
    ) -> Ev {
        // `broadcast` also accepts a scalar value (splatted).
        if name == "broadcast" {
            if let Some(ValueType::Scalar(d)) = self.ev_type(&x.0) {
                let Some(shape) = self.const_shape(&shape) else {
                    return Ev::Poison;
                };
                let Ev::Value(v) = x.0 else { return Ev::Poison };
                return self.emit1(Op::Splat(v), ValueType::Tile(d, shape), span);
            }
        }
        let Some((v, t, s)) = self.expect_tile(&x) else {
            return Ev::Poison;
        };
        let Some(shape) = self.const_shape(&shape) else {
            return Ev::Poison;
        };
        if name == "reshape" {
            if shape.num_elements() != s.num_elements() {
                return self.push(
                    Diagnostic::error(
                        ErrorCode::ShapeMismatch,
                        span,
                        format!(
                            "cannot reshape {s} ({} elements) to {shape} ({} elements)",
                            s.num_elements(),
                            shape.num_elements()
                        ),
                    )
                    .with_note("reshape keeps the number of elements"),
                );
            }
            if shape == s {
                return Ev::Value(v);
            }
            return self.emit1(Op::Reshape(v), ValueType::Tile(t, shape), span);
        }
        match self.broadcast_to(v, Some(&shape), span) {
            Some(r) => Ev::Value(r),
            None => self.push(
                Diagnostic::error(
                    ErrorCode::ShapeMismatch,
                    span,
                    format!("cannot broadcast {s} to {shape}: extents must be equal or 1"),
                )
                .with_secondary(x.1, format!("this has shape {s}"))
                .with_note("broadcasting aligns shapes on the right and repeats size-1 dimensions"),
            ),
        }
    }

    /// `expand_dims(x, axis)`: axis in `0..=rank`.
    pub(crate) fn expand_dims(&mut self, x: (Ev, Span), axis: (Ev, Span), span: Span) -> Ev {
        let Some((v, t, s)) = self.expect_tile(&x) else {
            return Ev::Poison;
        };
        let Some(ax) = self.const_int(&axis, 0, s.rank() as i64, "axis") else {
            return Ev::Poison;
        };
        let mut dims = s.dims().to_vec();
        dims.insert((ax as usize).min(dims.len()), 1);
        if dims.len() > MAX_TILE_RANK {
            return self.error(
                ErrorCode::BadTileShape,
                span,
                format!(
                    "tiles have at most {MAX_TILE_RANK} dimensions; {s} already has {}",
                    s.rank()
                ),
            );
        }
        self.emit1(
            Op::ExpandDims(v, ax as u8),
            ValueType::Tile(t, Shape(dims)),
            span,
        )
    }

    /// `transpose(x)` (rank 2) and `permute(x, perm)`.
    pub(crate) fn permute(
        &mut self,
        name: &str,
        x: (Ev, Span),
        perm: Option<(Ev, Span)>,
        span: Span,
    ) -> Ev {
        let Some((v, t, s)) = self.expect_tile(&x) else {
            return Ev::Poison;
        };
        let perm: Vec<u8> = match perm {
            None => {
                if s.rank() != 2 {
                    return self.push(
                        Diagnostic::error(
                            ErrorCode::BadAxis,
                            span,
                            format!("`{name}` needs a 2-D tile, found {s}"),
                        )
                        .with_secondary(x.1, format!("this has shape {s}"))
                        .with_note("help: use `permute(x, [...])` to reorder the dimensions of other ranks"),
                    );
                }
                vec![1, 0]
            }
            Some(p) => {
                let Some(list) = self.const_list(&p, "axis") else {
                    return Ev::Poison;
                };
                let mut sorted = list.clone();
                sorted.sort_unstable();
                if sorted != (0..s.rank() as i64).collect::<Vec<_>>() {
                    return self.error(
                        ErrorCode::BadAxis,
                        p.1,
                        format!(
                            "{list:?} is not a permutation of the {} axes of {s}",
                            s.rank()
                        ),
                    );
                }
                list.iter().map(|v| *v as u8).collect()
            }
        };
        let dims: Vec<u32> = perm
            .iter()
            .filter_map(|i| s.dims().get(*i as usize).copied())
            .collect();
        if perm.iter().enumerate().all(|(i, p)| i == *p as usize) {
            return Ev::Value(v);
        }
        self.emit1(Op::Permute(v, perm), ValueType::Tile(t, Shape(dims)), span)
    }

    /// A reduction along a constant axis (a 1-D tile reduces to a scalar), or, with no
    /// axis, over every element (numpy's `axis=None`): a scalar; a tile of rank > 1 is
    /// reshaped to 1-D first, so `argmax` / `argmin` give the row-major flat index and
    /// an f16/bf16 sum still rounds once.
    pub(crate) fn reduce(
        &mut self,
        op: ReduceOp,
        x: (Ev, Span),
        axis: Option<(Ev, Span)>,
        span: Span,
    ) -> Ev {
        let Some((v, d, s)) = self.expect_tile(&x) else {
            return Ev::Poison;
        };
        let (v, s, ax) = match axis {
            Some(axis) => {
                let Some(ax) = self.const_int(&axis, 0, s.rank() as i64 - 1, "axis") else {
                    return Ev::Poison;
                };
                (v, s, ax)
            }
            None if s.rank() == 1 => (v, s, 0),
            None => {
                let flat = Shape(vec![s.num_elements() as u32]);
                let Some(r) = self.emit_v(Op::Reshape(v), ValueType::Tile(d, flat.clone()), span)
                else {
                    return Ev::Poison;
                };
                (r, flat, 0)
            }
        };
        if d == DType::Bool {
            return self.push(
                Diagnostic::error(ErrorCode::TypeMismatch, x.1, "cannot reduce a bool tile")
                    .with_label_message("this is a bool tile")
                    .with_note("help: convert it first, e.g. `sum(m as i32, 0)`"),
            );
        }
        let mut dims = s.dims().to_vec();
        if (ax as usize) < dims.len() {
            dims.remove(ax as usize);
        }
        let rd = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
            DType::I32
        } else {
            d
        };
        let ty = if dims.is_empty() {
            ValueType::Scalar(rd)
        } else {
            ValueType::Tile(rd, Shape(dims))
        };
        self.emit1(
            Op::Reduce {
                op,
                value: v,
                axis: ax as u8,
            },
            ty,
            span,
        )
    }

    /// `item(t)`: the one element of a tile of one element (`[1]`, `[1, 1]`, ...) as a
    /// scalar. In the IR it is a reduction over one element (`max`, which leaves any
    /// value as it is, -0.0 and NaN included; a `bool` goes through `i32`).
    pub(crate) fn item(&mut self, x: (Ev, Span), span: Span) -> Ev {
        let Some((v, d, s)) = self.expect_tile(&x) else {
            return Ev::Poison;
        };
        if s.num_elements() != 1 {
            return self.push(
                Diagnostic::error(
                    ErrorCode::ShapeMismatch,
                    x.1,
                    format!(
                        "`item` needs a tile of exactly one element, found {s} ({} elements)",
                        s.num_elements()
                    ),
                )
                .with_label_message(format!("this has shape {s}"))
                .with_note("help: reduce it to a scalar instead: `sum(t)`, `max(t)`, `min(t)`"),
            );
        }
        let one = Shape(vec![1]);
        let mut cur = v;
        if s.rank() > 1 {
            let Some(r) = self.emit_v(Op::Reshape(v), ValueType::Tile(d, one.clone()), span) else {
                return Ev::Poison;
            };
            cur = r;
        }
        let rd = if d == DType::Bool { DType::I32 } else { d };
        if d == DType::Bool {
            let Some(c) = self.emit_v(Op::Cast(cur), ValueType::Tile(rd, one), span) else {
                return Ev::Poison;
            };
            cur = c;
        }
        let r = self.emit1(
            Op::Reduce {
                op: ReduceOp::Max,
                value: cur,
                axis: 0,
            },
            ValueType::Scalar(rd),
            span,
        );
        match r {
            Ev::Value(x) if d == DType::Bool => {
                self.emit1(Op::Cast(x), ValueType::Scalar(DType::Bool), span)
            }
            other => other,
        }
    }
}
