//! Block-local scratch buffers: `scratch(slots, shape, dtype)`, `scratch_store(buf,
//! slot, x)`, `scratch_load(buf, slot)`, and the asynchronous `scratch_fetch(buf, slot,
//! tensor, index)` / `scratch_wait(pending)`.
//!
//! Assumes: called from the builtin dispatch with arity-checked arguments.
//! Guarantees: a buffer is a constant number (>= 1) of tiles of one constant shape and a
//! numeric dtype, registered in `Function::scratch`; a store's value is a tile of exactly
//! that dtype and shape (no implicit conversion or broadcast); slots are `i32` scalars,
//! and a constant slot is one of the buffer's (0..N, else a located `BadAccess`);
//! a fetch reads a tensor of the buffer's dtype and the slots' rank (its tile has the
//! slot shape); a wait leaves a constant 0..=7 fetches in flight.
//! Each `scratch(...)` call in the source is one buffer that lives for the whole kernel
//! (a call inside a loop body is checked once: one buffer, shared by the iterations).

use super::builtins::Args;
use super::{Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::ir::{Op, ScratchBuf};
use crate::span::Span;
use crate::types::{DType, Shape, ValueType};

/// Most slots of one scratch buffer (the shared-memory limit is checked by the back end).
const MAX_SLOTS: i64 = 1 << 16;
/// Most fetches `scratch_wait` may leave in flight (`cp.async.wait_group` takes 0..=7).
const MAX_PENDING: i64 = 7;

impl Checker<'_> {
    /// `scratch(slots, shape, dtype)`.
    pub(crate) fn scratch(&mut self, a: &Args, span: Span) -> Ev {
        let slots = self.const_int(&a.p(0), 1, MAX_SLOTS, "scratch slot count");
        let shape = self.const_shape(&a.p(1));
        let dtype = self.expect_dtype(&a.p(2));
        let (Some(slots), Some(shape), Some(dtype)) = (slots, shape, dtype) else {
            return Ev::Poison;
        };
        if dtype == DType::Bool {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    a.p(2).1,
                    "a scratch buffer cannot hold `bool` tiles",
                )
                .with_note("help: store `where(m, 1, 0)` as an integer tile instead"),
            );
        }
        let id = self.func.scratch.len() as u32;
        self.func.scratch.push(ScratchBuf {
            name: "scratch".into(),
            dtype,
            slots: slots as u32,
            slot_shape: shape.dims().to_vec(),
            span,
            shared: false,
            lag: 0,
        });
        Ev::Scratch(id)
    }

    /// `scratch_store(buf, slot, x)`.
    pub(crate) fn scratch_store(&mut self, a: &Args, span: Span) -> Ev {
        let Some(buf) = self.expect_scratch(&a.p(0)) else {
            return Ev::Poison;
        };
        let slot = self.scratch_slot(buf, &a.p(1));
        let (v, vs) = a.p(2);
        let tile = self.expect_tile(&(v, vs));
        let (Some(slot), Some((v, d, s))) = (slot, tile) else {
            return Ev::Poison;
        };
        let b = &self.func.scratch[buf as usize];
        let want = ValueType::Tile(b.dtype, Shape(b.slot_shape.clone()));
        let got = ValueType::Tile(d, s);
        if got != want {
            let (name, decl) = (b.name.clone(), b.span);
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    vs,
                    format!("cannot store a `{got}` into `{name}`, whose slots are `{want}`"),
                )
                .with_secondary(decl, format!("`{name}` is declared here"))
                .with_note(
                    "help: convert with `as` or `reshape` first; slots take exactly their type",
                ),
            );
        }
        self.emit(
            Op::ScratchStore {
                buf,
                slot,
                value: v,
            },
            vec![],
            span,
        );
        Ev::Unit
    }

    /// `scratch_load(buf, slot)`.
    pub(crate) fn scratch_load(&mut self, a: &Args, span: Span) -> Ev {
        let Some(buf) = self.expect_scratch(&a.p(0)) else {
            return Ev::Poison;
        };
        let Some(slot) = self.scratch_slot(buf, &a.p(1)) else {
            return Ev::Poison;
        };
        let b = &self.func.scratch[buf as usize];
        let ty = ValueType::Tile(b.dtype, Shape(b.slot_shape.clone()));
        self.emit1(Op::ScratchLoad { buf, slot }, ty, span)
    }

    /// `scratch_fetch(buf, slot, tensor, index, pad = .., eviction_policy = ..)`: an
    /// asynchronous `scratch_store(buf, slot, load(tensor, index, <slot shape>, pad))`.
    pub(crate) fn scratch_fetch(&mut self, a: &Args, span: Span) -> Ev {
        let Some(buf) = self.expect_scratch(&a.p(0)) else {
            return Ev::Poison;
        };
        let slot = self.scratch_slot(buf, &a.p(1));
        let Some((t, tp)) = self.tensor_arg(&a.p(2)) else {
            return Ev::Poison;
        };
        let index = self.tile_index(&tp, &a.p(3));
        let (Some(slot), Some(index)) = (slot, index) else {
            return Ev::Poison;
        };
        let b = &self.func.scratch[buf as usize];
        let (name, decl, dtype, shape) = (b.name.clone(), b.span, b.dtype, b.slot_shape.clone());
        if tp.dtype != dtype || shape.len() != tp.rank() {
            let want = ValueType::Tile(dtype, Shape(shape.clone()));
            let what = if tp.dtype != dtype {
                format!("a `{}` tensor", tp.dtype)
            } else {
                format!("a rank-{} tensor", tp.rank())
            };
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    a.p(2).1,
                    format!("cannot fetch from {what} into `{name}`, whose slots are `{want}`"),
                )
                .with_secondary(decl, format!("`{name}` is declared here"))
                .with_note(
                    "help: the tensor must have the slots' dtype and rank (use 1 for a \
                     dimension you index one at a time)",
                ),
            );
        }
        let Some(padding) = self.fill_value(a.kw("pad"), dtype, "pad") else {
            return Ev::Poison;
        };
        self.emit(
            Op::ScratchFetch {
                buf,
                slot,
                tensor: t,
                index,
                padding,
                eviction: a.eviction,
            },
            vec![],
            span,
        );
        Ev::Unit
    }

    /// `scratch_gather(buf, slot, tensor, offsets, mask = .., other = ..,
    /// eviction_policy = ..)`: an asynchronous `scratch_store(buf, slot, gather(tensor,
    /// offsets, mask, other))`, the offsets and mask broadcast to the slots' shape.
    pub(crate) fn scratch_gather(&mut self, a: &Args, span: Span) -> Ev {
        let Some(buf) = self.expect_scratch(&a.p(0)) else {
            return Ev::Poison;
        };
        let Some(slot) = self.scratch_slot(buf, &a.p(1)) else {
            return Ev::Poison;
        };
        let b = &self.func.scratch[buf as usize];
        let (name, decl, dtype, shape) = (b.name.clone(), b.span, b.dtype, b.slot_shape.clone());
        // The gather's own arguments: (tensor, offsets) and the keywords.
        let gather_args = Args {
            pos: a.pos.get(2..).map(<[_]>::to_vec).unwrap_or_default(),
            kw: a.kw.clone(),
            eviction: a.eviction,
            combine: None,
            precision: None,
            span,
        };
        let Some((_, tp)) = self.tensor_arg(&gather_args.p(0)) else {
            return Ev::Poison;
        };
        if tp.dtype != dtype {
            let want = ValueType::Tile(dtype, Shape(shape.clone()));
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    a.p(2).1,
                    format!(
                        "cannot gather from a `{}` tensor into `{name}`, whose slots are `{want}`",
                        tp.dtype
                    ),
                )
                .with_secondary(decl, format!("`{name}` is declared here"))
                .with_note("help: the tensor must have the slots' dtype"),
            );
        }
        let parts =
            match self.indexed_parts("scratch_gather", &gather_args, span, Some(&Shape(shape))) {
                Ok(p) => p,
                Err(e) => return e,
            };
        let Some(other) = self.fill_value(a.kw("other"), dtype, "other") else {
            return Ev::Poison;
        };
        self.emit(
            Op::ScratchGather {
                buf,
                slot,
                tensor: parts.tensor,
                offsets: parts.offsets,
                mask: parts.mask,
                other,
                eviction: a.eviction,
            },
            vec![],
            span,
        );
        Ev::Unit
    }

    /// `scratch_wait(pending)`: a constant count of fetches left in flight.
    pub(crate) fn scratch_wait(&mut self, a: &Args, span: Span) -> Ev {
        let Some(pending) = self.const_int(&a.p(0), 0, MAX_PENDING, "`scratch_wait` count") else {
            return Ev::Poison;
        };
        self.emit(
            Op::ScratchWait {
                pending: pending as u32,
            },
            vec![],
            span,
        );
        Ev::Unit
    }

    /// A scratch buffer argument, else `WrongKind`.
    fn expect_scratch(&mut self, (e, sp): &(Ev, Span)) -> Option<u32> {
        match e {
            Ev::Scratch(b) => Some(*b),
            Ev::Poison => None,
            other => {
                let desc = self.describe(other);
                self.push(
                    Diagnostic::error(
                        ErrorCode::WrongKind,
                        *sp,
                        format!("expected a scratch buffer, found {desc}"),
                    )
                    .with_note(
                        "help: make one with `let buf = scratch(slots, [shape...], dtype);`",
                    ),
                );
                None
            }
        }
    }

    /// A slot index of buffer `buf`: an `i32` scalar value or an integer constant, which
    /// must be one of the buffer's slots (a runtime slot is checked when it runs: an
    /// error in the interpreter, a trap on the GPU).
    fn scratch_slot(&mut self, buf: u32, (e, sp): &(Ev, Span)) -> Option<crate::ir::ValueId> {
        match e {
            Ev::Value(v) if self.ty(*v) == ValueType::Scalar(DType::I32) => Some(*v),
            Ev::Int(k) => {
                let b = &self.func.scratch[buf as usize];
                if *k < 0 || *k >= b.slots as i128 {
                    let (name, n, decl) = (b.name.clone(), b.slots, b.span);
                    self.push(
                        Diagnostic::error(
                            ErrorCode::BadAccess,
                            *sp,
                            format!("slot {k} is out of range: `{name}` has slots 0..{n}"),
                        )
                        .with_secondary(decl, format!("`{name}` is declared here with {n} slots"))
                        .with_note(format!(
                            "help: use a slot from 0 to {}, or declare more slots",
                            n - 1
                        )),
                    );
                    return None;
                }
                self.materialize(e, DType::I32, *sp)
            }
            Ev::Poison => None,
            other => {
                let desc = self.describe(other);
                self.push(Diagnostic::error(
                    ErrorCode::BadAccess,
                    *sp,
                    format!("a scratch slot must be an i32 scalar, found {desc}"),
                ));
                None
            }
        }
    }
}
