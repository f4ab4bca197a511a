//! Division by constants, strength-reduced on the lowered PTX body (before dead-code
//! removal).
//!
//! Assumes: the body's registers are function-wide (a register is one PTX register in
//! every block that names it). An instruction's first operand, when it is a plain
//! register or a vector of registers, is what it defines. `reg_counts` are the body's
//! per-class register counts (new registers are numbered after them).
//! Guarantees: an unguarded integer `div` / `rem` whose divisor (third operand) is a
//! register with exactly one definition in the body, an unguarded `mov` of a positive
//! immediate `c`, computes the same value without a division instruction when `c` is a
//! power of two: unsigned `div` / `rem` become `shr` / `and`; signed ones (which
//! truncate toward zero, as C and PTX do) add the bias `c - 1` to negative dividends
//! first (`shr.s` / `shr.u` / `add`, then `shr.s`, or `and` and `sub` for the
//! remainder). Other constant divisors become an immediate operand (the same
//! instruction, easier to read). Nothing else changes: the `mov` stays, and
//! `dead_code` removes it when nothing else reads it.
//!
//! Why: lowering keeps constants in registers (a compile-time `BLOCK` is
//! `mov.b32 %r, 1024`), and ptxas expands every integer `div` / `rem`, by a register
//! or by an immediate, power of two or not, into its generic reciprocal sequence
//! (`I2F.RP`, `MUFU.RCP`, fix-ups: 32-40 SASS instructions for 32 bits; measured with
//! ptxas 13.0). NVVM strength-reduces before PTX; a compiler that emits PTX itself must
//! too. `cdiv(n, BLOCK)` and `i % ROWS` sit on the path to a block's first loads, where
//! those instructions delay every load.

use super::isa::{Inst, Operand, Reg, RegClass, Stmt};
use std::collections::HashMap;

/// Rewrites integer `div` / `rem` by a known positive constant (see the module header).
pub fn reduce_constant_divisions(body: &mut Vec<Stmt>, reg_counts: &mut [u32; 6]) {
    let mut defs: HashMap<Reg, usize> = HashMap::new();
    let mut values: HashMap<Reg, i64> = HashMap::new();
    for s in body.iter() {
        let Stmt::Inst(i) = s else { continue };
        match i.operands.first() {
            Some(Operand::Reg(d)) => {
                *defs.entry(*d).or_insert(0) += 1;
                if let Some(v) = immediate_move(i) {
                    values.insert(*d, v);
                }
            }
            Some(Operand::Vec(ds)) => {
                for d in ds {
                    *defs.entry(*d).or_insert(0) += 1;
                }
            }
            _ => {}
        }
    }
    values.retain(|r, v| *v > 0 && defs.get(r) == Some(&1));
    if values.is_empty() {
        return;
    }
    let old = std::mem::take(body);
    body.reserve(old.len());
    for s in old {
        let Stmt::Inst(i) = &s else {
            body.push(s);
            continue;
        };
        let division = integer_division(i);
        let constant = match i.operands.get(2) {
            Some(Operand::Reg(r)) => values.get(r).copied(),
            _ => None,
        };
        let (Some((kind, signed, bits)), Some(c), None) = (division, constant, i.guard) else {
            body.push(s);
            continue;
        };
        let (Operand::Reg(dst), Operand::Reg(a)) = (i.operands[0].clone(), i.operands[1].clone())
        else {
            body.push(s);
            continue;
        };
        if c.count_ones() != 1 {
            let mut i = i.clone();
            i.operands[2] = Operand::Imm(c);
            body.push(Stmt::Inst(i));
            continue;
        }
        let k = c.trailing_zeros() as i64;
        let mut e = Emitter {
            body,
            reg_counts,
            class: dst.class,
            bits,
        };
        match (kind, signed) {
            (Division::Quotient, _) if k == 0 => e.inst("mov.b", dst, vec![a.into()]),
            (Division::Remainder, _) if k == 0 => e.inst("mov.b", dst, vec![Operand::Imm(0)]),
            (Division::Quotient, false) => e.inst("shr.u", dst, vec![a.into(), Operand::Imm(k)]),
            (Division::Remainder, false) => {
                e.inst("and.b", dst, vec![a.into(), Operand::Imm(c - 1)])
            }
            (_, true) => {
                // bias = c - 1 for a negative dividend, else 0: (a >> (w-1)) >>> (w-k).
                let sign = e.fresh();
                e.inst("shr.s", sign, vec![a.into(), Operand::Imm(bits - 1)]);
                let bias = e.fresh();
                e.inst("shr.u", bias, vec![sign.into(), Operand::Imm(bits - k)]);
                let biased = e.fresh();
                e.inst("add.s", biased, vec![a.into(), bias.into()]);
                if kind == Division::Quotient {
                    e.inst("shr.s", dst, vec![biased.into(), Operand::Imm(k)]);
                } else {
                    // a - ((a + bias) & -c)
                    let rounded = e.fresh();
                    e.inst("and.b", rounded, vec![biased.into(), Operand::Imm(-c)]);
                    e.inst("sub.s", dst, vec![a.into(), rounded.into()]);
                }
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Division {
    Quotient,
    Remainder,
}

/// Appends instructions of one width to the body, with fresh registers of one class.
struct Emitter<'a> {
    body: &'a mut Vec<Stmt>,
    reg_counts: &'a mut [u32; 6],
    class: RegClass,
    bits: i64,
}

impl Emitter<'_> {
    fn fresh(&mut self) -> Reg {
        let c = &mut self.reg_counts[self.class.index()];
        *c += 1;
        Reg {
            class: self.class,
            n: *c,
        }
    }

    /// `<op><bits> d, sources...`.
    fn inst(&mut self, op: &str, d: Reg, sources: Vec<Operand>) {
        let mut operands = vec![d.into()];
        operands.extend(sources);
        self.body.push(Stmt::Inst(Inst {
            guard: None,
            opcode: format!("{op}{}", self.bits),
            operands,
        }));
    }
}

/// The immediate of an unguarded integer `mov %r, imm`.
fn immediate_move(i: &Inst) -> Option<i64> {
    if i.guard.is_some() {
        return None;
    }
    let (family, ty) = i.opcode.split_once('.')?;
    if family != "mov" || !matches!(ty, "b32" | "b64" | "s32" | "u32" | "s64" | "u64") {
        return None;
    }
    match i.operands.as_slice() {
        [Operand::Reg(_), Operand::Imm(v)] => Some(*v),
        _ => None,
    }
}

/// `div.s32`, `rem.u64`, ...: (quotient or remainder, signed, bits) of an integer
/// division (None for `div.rn.f32` and everything else).
fn integer_division(i: &Inst) -> Option<(Division, bool, i64)> {
    let mut parts = i.opcode.split('.');
    let kind = match parts.next()? {
        "div" => Division::Quotient,
        "rem" => Division::Remainder,
        _ => return None,
    };
    let (signed, bits) = match parts.next()? {
        "s32" => (true, 32),
        "u32" => (false, 32),
        "s64" => (true, 64),
        "u64" => (false, 64),
        _ => return None,
    };
    parts.next().is_none().then_some((kind, signed, bits))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(class: RegClass, n: u32) -> Reg {
        Reg { class, n }
    }
    fn inst(op: &str, ops: Vec<Operand>) -> Stmt {
        Stmt::Inst(Inst {
            guard: None,
            opcode: op.into(),
            operands: ops,
        })
    }

    /// Runs a straight-line body of the opcodes this pass emits (plus the division it
    /// replaces) on 64-bit register values, with `%r0` = `a`; returns register `out`.
    fn run(body: &[Stmt], a: i64, out: Reg) -> i64 {
        let mut regs: HashMap<Reg, i64> = HashMap::new();
        let class = out.class;
        regs.insert(r(class, 0), a);
        let bits = if class == RegClass::B64 { 64 } else { 32 };
        let wrap = |v: i64| if bits == 32 { v as i32 as i64 } else { v };
        for s in body {
            let Stmt::Inst(i) = s else { continue };
            let val = |o: &Operand| match o {
                Operand::Reg(x) => regs[x],
                Operand::Imm(v) => *v,
                other => panic!("unexpected operand {other:?}"),
            };
            let src: Vec<i64> = i.operands[1..].iter().map(val).collect();
            let (x, y) = (src[0], src.get(1).copied().unwrap_or(0));
            let u = |v: i64| {
                if bits == 32 {
                    v as u32 as u64
                } else {
                    v as u64
                }
            };
            let v = match i.opcode.as_str() {
                "mov.b32" | "mov.b64" => x,
                "add.s32" | "add.s64" => x.wrapping_add(y),
                "sub.s32" | "sub.s64" => x.wrapping_sub(y),
                "and.b32" | "and.b64" => x & y,
                "shr.s32" | "shr.s64" => x >> y,
                "shr.u32" | "shr.u64" => (u(x) >> y) as i64,
                "div.s32" | "div.s64" => x / y,
                "rem.s32" | "rem.s64" => x % y,
                "div.u32" | "div.u64" => (u(x) / u(y)) as i64,
                "rem.u32" | "rem.u64" => (u(x) % u(y)) as i64,
                op => panic!("unexpected opcode {op}"),
            };
            let Operand::Reg(d) = i.operands[0] else {
                panic!("no destination")
            };
            regs.insert(d, wrap(v));
        }
        regs[&out]
    }

    /// `mov %r1, c; <op> %r2, %r0, %r1` before and after the pass agree on every test
    /// value, and no division is left when `c` is a power of two.
    fn check(op: &str, class: RegClass, c: i64, values: &[i64]) {
        let w = if class == RegClass::B64 { "b64" } else { "b32" };
        let original = vec![
            inst(
                &format!("mov.{w}"),
                vec![r(class, 1).into(), Operand::Imm(c)],
            ),
            inst(
                op,
                vec![r(class, 2).into(), r(class, 0).into(), r(class, 1).into()],
            ),
        ];
        let mut reduced = original.clone();
        let mut counts = [0u32; 6];
        counts[class.index()] = 2;
        reduce_constant_divisions(&mut reduced, &mut counts);
        let divisions = reduced
            .iter()
            .filter(|s| matches!(s, Stmt::Inst(i) if integer_division(i).is_some()))
            .count();
        assert_eq!(
            divisions,
            usize::from(c.count_ones() != 1),
            "{op} by {c}: {reduced:?}"
        );
        for &a in values {
            let a = if class == RegClass::B64 {
                a
            } else {
                a as i32 as i64
            };
            assert_eq!(
                run(&reduced, a, r(class, 2)),
                run(&original, a, r(class, 2)),
                "{op} {a} by {c}"
            );
        }
    }

    #[test]
    fn power_of_two_divisions_match_the_division_on_every_sign_and_edge() {
        let mut values: Vec<i64> = (-70..70).collect();
        for v in [
            i32::MIN as i64,
            i32::MIN as i64 + 1,
            i32::MAX as i64,
            -1024,
            -1023,
            -1025,
            1 << 30,
            -(1 << 30),
            123_456_789,
            -123_456_789,
            i64::MIN,
            i64::MIN + 1,
            i64::MAX,
            -(1 << 40) - 3,
        ] {
            values.push(v);
        }
        for (class, ops, shifts) in [
            (
                RegClass::B32,
                ["div.s32", "rem.s32", "div.u32", "rem.u32"],
                0..31,
            ),
            (
                RegClass::B64,
                ["div.s64", "rem.s64", "div.u64", "rem.u64"],
                0..63,
            ),
        ] {
            for op in ops {
                for k in shifts.clone() {
                    check(op, class, 1 << k, &values);
                }
                check(op, class, 1000, &values);
                check(op, class, 7, &values);
            }
        }
    }

    #[test]
    fn other_constants_become_immediates_and_the_move_stays() {
        let b = RegClass::B32;
        let mut body = vec![
            inst("mov.b32", vec![r(b, 1).into(), Operand::Imm(768)]),
            inst(
                "div.s32",
                vec![r(b, 2).into(), r(b, 0).into(), r(b, 1).into()],
            ),
        ];
        let mut counts = [0, 0, 2, 0, 0, 0];
        reduce_constant_divisions(&mut body, &mut counts);
        assert_eq!(body.len(), 2);
        let Stmt::Inst(i) = &body[1] else { panic!() };
        assert_eq!(i.operands[2], Operand::Imm(768));
        assert_eq!(counts, [0, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn registers_that_are_not_one_positive_constant_stay() {
        let b = RegClass::B32;
        let p = r(RegClass::Pred, 9);
        let mut body = vec![
            // r1: two definitions (a loop-carried value).
            inst("mov.b32", vec![r(b, 1).into(), Operand::Imm(8)]),
            inst(
                "add.s32",
                vec![r(b, 1).into(), r(b, 1).into(), Operand::Imm(1)],
            ),
            // r4: a guarded move.
            Stmt::Inst(Inst {
                guard: Some((p, false)),
                opcode: "mov.b32".into(),
                operands: vec![r(b, 4).into(), Operand::Imm(4)],
            }),
            // r5: zero; r8: negative.
            inst("mov.b32", vec![r(b, 5).into(), Operand::Imm(0)]),
            inst("mov.b32", vec![r(b, 8).into(), Operand::Imm(-4)]),
            // r6: also defined by a vector unpack.
            inst("mov.b32", vec![r(b, 6).into(), Operand::Imm(2)]),
            inst(
                "mov.b32",
                vec![Operand::Vec(vec![r(b, 6), r(b, 7)]), r(b, 0).into()],
            ),
            inst(
                "div.s32",
                vec![r(b, 10).into(), r(b, 0).into(), r(b, 1).into()],
            ),
            inst(
                "div.s32",
                vec![r(b, 11).into(), r(b, 0).into(), r(b, 4).into()],
            ),
            inst(
                "rem.s32",
                vec![r(b, 12).into(), r(b, 0).into(), r(b, 5).into()],
            ),
            inst(
                "rem.s32",
                vec![r(b, 13).into(), r(b, 0).into(), r(b, 6).into()],
            ),
            inst(
                "div.s32",
                vec![r(b, 14).into(), r(b, 0).into(), r(b, 8).into()],
            ),
            // A guarded division by a constant.
            inst("mov.b32", vec![r(b, 15).into(), Operand::Imm(16)]),
            Stmt::Inst(Inst {
                guard: Some((p, true)),
                opcode: "div.u32".into(),
                operands: vec![r(b, 16).into(), r(b, 0).into(), r(b, 15).into()],
            }),
            // Float division is not integer division.
            inst("mov.b32", vec![r(b, 17).into(), Operand::Imm(4)]),
            inst(
                "div.rn.f32",
                vec![r(b, 18).into(), r(b, 0).into(), r(b, 17).into()],
            ),
        ];
        let before = body.clone();
        let mut counts = [0, 0, 18, 0, 0, 0];
        reduce_constant_divisions(&mut body, &mut counts);
        assert_eq!(body, before);
    }
}
