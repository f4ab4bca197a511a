//! Block-local scratch buffers: `scratch(slots, shape, dtype)`, `scratch_store(buf,
//! slot, x)`, `scratch_load(buf, slot)`.
//!
//! Assumes: called from the builtin dispatch with arity-checked arguments.
//! Guarantees: a buffer is a constant number (>= 1) of tiles of one constant shape and a
//! numeric dtype, registered in `Function::scratch`; a store's value is a tile of exactly
//! that dtype and shape (no implicit conversion or broadcast); slots are `i32` scalars.
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
        });
        Ev::Scratch(id)
    }

    /// `scratch_store(buf, slot, x)`.
    pub(crate) fn scratch_store(&mut self, a: &Args, span: Span) -> Ev {
        let Some(buf) = self.expect_scratch(&a.p(0)) else {
            return Ev::Poison;
        };
        let slot = self.scratch_slot(&a.p(1));
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
        let Some(slot) = self.scratch_slot(&a.p(1)) else {
            return Ev::Poison;
        };
        let b = &self.func.scratch[buf as usize];
        let ty = ValueType::Tile(b.dtype, Shape(b.slot_shape.clone()));
        self.emit1(Op::ScratchLoad { buf, slot }, ty, span)
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

    /// A slot index: an `i32` scalar value or an integer constant.
    fn scratch_slot(&mut self, (e, sp): &(Ev, Span)) -> Option<crate::ir::ValueId> {
        match e {
            Ev::Value(v) if self.ty(*v) == ValueType::Scalar(DType::I32) => Some(*v),
            Ev::Int(_) => self.materialize(e, DType::I32, *sp),
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
