//! Integer `/` and `%` with every result defined: PTX leaves `div` and `rem` by zero
//! "unspecified, machine-specific" (the PTX ISA's notes on both), and the signed
//! overflow `MIN / -1` is not a representable quotient, so ptxas's division sequence may
//! give anything there. kgen defines them, as the interpreter computes them
//! (`interp/eval.rs`, `ir::BinaryOp::Div`):
//!
//! | | `x / 0` | `x % 0` | `MIN / -1` | `MIN % -1` |
//! |---|---|---|---|---|
//! | i32, u32, i64 | all ones (-1; u32: 4294967295) | `x` | `MIN` (wraps) | 0 |
//!
//! Assumes: both operands have the result's integer dtype (validated). Guarantees: a
//! divisor known to be a constant (`Lowerer::known_int`) outside {0, -1}, or known to be
//! positive (`num_bids`, the grid size), is a plain `div` / `rem`; a constant 0 or -1
//! needs no division at all; any other divisor gets
//! `setp.eq` + `selp` after the division (u32: 2 instructions; i32 / i64: 4 for `%`, 5
//! for `/`, which also negates the dividend for a divisor of -1).

use super::arith::int_ty;
use super::{class_of, Lowerer};
use crate::back::ptx::isa::{Operand, Reg, RegClass};
use crate::ir::{BinaryOp, Op, ValueId};
use crate::types::{DType, Scalar};

impl Lowerer<'_> {
    /// The integer value every element of `v` is known to hold: a constant, or a splat,
    /// broadcast, reshape or `expand_dims` of one; for a value only known to be positive
    /// (`num_bids`), 1. Only the division guards read it.
    pub(super) fn known_int(&self, v: ValueId) -> Option<i64> {
        self.known_ints.get(&v).copied()
    }

    /// Records the constant `op`'s result `r` holds, if it is one, or a stand-in for
    /// "positive" (1: for `/` and `%` only "not 0, not -1" matters) for the grid size,
    /// which is at least 1 (called for every instruction before it is lowered).
    pub(super) fn note_known_int(&mut self, op: &Op, r: ValueId) {
        let c = match op {
            Op::Const(Scalar::Int(c, _)) => Some(*c),
            Op::NumPrograms(_) => Some(1),
            Op::Splat(s) | Op::Broadcast(s) | Op::Reshape(s) | Op::ExpandDims(s, _) => {
                self.known_int(*s)
            }
            _ => None,
        };
        if let Some(c) = c {
            self.known_ints.insert(r, c);
        }
    }

    /// `a / b` or `a % b` (`op`) on integers of `dt`; `divisor` is `b`'s value when it
    /// is a known constant.
    pub(super) fn int_div_rem(
        &mut self,
        op: BinaryOp,
        dt: DType,
        a: Reg,
        b: Reg,
        divisor: Option<i64>,
    ) -> Reg {
        let class = class_of(dt);
        let t = int_ty(dt);
        let w = if dt == DType::I64 { 64 } else { 32 };
        let signed = dt.is_signed_int();
        let is_div = op == BinaryOp::Div;
        // The divisor as the dtype reads it (a u32 constant of all ones is not -1).
        let divisor = divisor.map(|c| match dt {
            DType::I32 => c as i32 as i64,
            DType::U32 => c as u32 as i64,
            _ => c,
        });
        let all_ones = Operand::Imm(-1);
        match divisor {
            Some(0) if is_div => return self.op1(class, &format!("mov.b{w}"), vec![all_ones]),
            Some(0) => return a,
            Some(-1) if signed && is_div => {
                return self.op1(class, &format!("neg.s{w}"), vec![a.into()])
            }
            Some(-1) if signed => {
                return self.op1(class, &format!("mov.b{w}"), vec![Operand::Imm(0)])
            }
            Some(_) => {
                let opc = if is_div { "div" } else { "rem" };
                return self.op1(class, &format!("{opc}.{t}"), vec![a.into(), b.into()]);
            }
            None => {}
        }
        let opc = if is_div { "div" } else { "rem" };
        let mut r = self.op1(class, &format!("{opc}.{t}"), vec![a.into(), b.into()]);
        let selp = format!("selp.b{w}");
        if signed {
            // MIN / -1 = MIN (wraps, as -MIN does), MIN % -1 = 0: for a divisor of -1 the
            // quotient is -a and the remainder 0, whatever the division gave.
            let minus_one = self.op1(
                RegClass::Pred,
                &format!("setp.eq.{t}"),
                vec![b.into(), Operand::Imm(-1)],
            );
            let special = if is_div {
                self.op1(class, &format!("neg.s{w}"), vec![a.into()]).into()
            } else {
                Operand::Imm(0)
            };
            r = self.op1(class, &selp, vec![special, r.into(), minus_one.into()]);
        }
        let zero = self.op1(
            RegClass::Pred,
            &format!("setp.eq.{t}"),
            vec![b.into(), Operand::Imm(0)],
        );
        let special = if is_div { all_ones } else { a.into() };
        self.op1(class, &selp, vec![special, r.into(), zero.into()])
    }
}
