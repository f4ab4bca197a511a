//! Dead-instruction removal on the lowered PTX body, the last step before printing.
//!
//! Assumes: the body's registers are function-wide (a register is one PTX register in
//! every block that names it). An instruction's first operand, when it is a plain
//! register, is the register it defines.
//! Guarantees: removes only instructions of an opcode family that has no effect besides
//! writing its destination (arithmetic, conversions, moves, compares, approximate
//! math) and whose destination no remaining instruction reads, repeated until none is
//! left. Loads, stores, atomics, barriers, shuffles, cluster and async-copy
//! instructions and branches are never removed; nothing is reordered or renumbered.
//! Lowering leaves such code behind by design (a value rounded to bf16 and widened back
//! whose store packs the f32 source instead; conversions a later choice made unused),
//! and PTX that users snapshot should not carry it.

use super::isa::{Inst, Operand, Reg, Stmt};
use std::collections::HashMap;

/// Opcode families (the text before the first `.`) whose only effect is the destination.
const PURE: &[&str] = &[
    "mov", "cvt", "add", "sub", "mul", "mad", "fma", "neg", "abs", "min", "max", "and", "or",
    "xor", "not", "shl", "shr", "selp", "setp", "ex2", "lg2", "rsqrt", "sqrt", "rcp", "tanh",
    "sin", "cos", "copysign",
];

/// Removes dead pure instructions from `body` (see the module header): one count of
/// reads, then a worklist, since removing an instruction can leave its operands unread.
pub fn remove_dead_instructions(body: &mut Vec<Stmt>) {
    let mut uses = HashMap::new();
    for s in body.iter() {
        if let Stmt::Inst(i) = s {
            for_each_read(i, |r| *uses.entry(r).or_insert(0usize) += 1);
        }
    }
    // Pure definitions per destination, so a register whose reads drop to 0 finds them.
    let mut defs: HashMap<Reg, Vec<usize>> = HashMap::new();
    for (k, s) in body.iter().enumerate() {
        if let Stmt::Inst(i) = s {
            if let Some(d) = dead_destination(i) {
                defs.entry(d).or_default().push(k);
            }
        }
    }
    let mut removed = vec![false; body.len()];
    let mut work: Vec<Reg> = defs
        .keys()
        .copied()
        .filter(|d| uses.get(d).copied().unwrap_or(0) == 0)
        .collect();
    while let Some(d) = work.pop() {
        for &k in defs.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
            if removed[k] {
                continue;
            }
            removed[k] = true;
            let Stmt::Inst(i) = &body[k] else { continue };
            for_each_read(i, |r| {
                if let Some(n) = uses.get_mut(&r) {
                    *n -= 1;
                    if *n == 0 && defs.contains_key(&r) {
                        work.push(r);
                    }
                }
            });
        }
    }
    let mut k = 0;
    body.retain(|_| {
        k += 1;
        !removed[k - 1]
    });
}

/// The destination of a pure instruction (None for everything that must stay).
fn dead_destination(i: &Inst) -> Option<Reg> {
    let family = i.opcode.split('.').next().unwrap_or("");
    if !PURE.contains(&family) {
        return None;
    }
    match i.operands.first() {
        Some(Operand::Reg(d)) => Some(*d),
        _ => None,
    }
}

/// Calls `read` for each register `i` reads: its guard, every operand after the first,
/// and the address register of a first operand that is a memory reference (a store's).
/// A vector first operand is defined (`ld.v4 {..}`, `mov.b32 {lo, hi}, w`), not read.
fn for_each_read(i: &Inst, mut read: impl FnMut(Reg)) {
    if let Some((g, _)) = i.guard {
        read(g);
    }
    for (k, op) in i.operands.iter().enumerate() {
        match op {
            Operand::Reg(r) if k > 0 => read(*r),
            Operand::Vec(rs) if k > 0 => rs.iter().copied().for_each(&mut read),
            Operand::Mem(super::isa::Addr::Reg(r), _) => read(*r),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::back::ptx::isa::RegClass;

    fn r(n: u32) -> Reg {
        Reg {
            class: RegClass::F32,
            n,
        }
    }
    fn inst(op: &str, ops: Vec<Operand>) -> Stmt {
        Stmt::Inst(Inst {
            guard: None,
            opcode: op.into(),
            operands: ops,
        })
    }

    #[test]
    fn chains_of_unused_pure_values_go_and_effects_stay() {
        let mut body = vec![
            inst(
                "mul.rn.f32",
                vec![r(1).into(), r(0).into(), Operand::F32(2.0)],
            ),
            // dead chain: 2 <- 1, 3 <- 2
            inst("cvt.rn.bf16.f32", vec![r(2).into(), r(1).into()]),
            inst("mov.b32", vec![r(3).into(), r(2).into()]),
            // a load whose value is unused stays (loads are never removed)
            inst(
                "ld.global.b32",
                vec![
                    r(4).into(),
                    Operand::Mem(crate::back::ptx::isa::Addr::Reg(r(9)), 0),
                ],
            ),
            // r1 is read by the store's vector
            inst(
                "st.global.v2.b32",
                vec![
                    Operand::Mem(crate::back::ptx::isa::Addr::Reg(r(9)), 0),
                    Operand::Vec(vec![r(1), r(1)]),
                ],
            ),
        ];
        remove_dead_instructions(&mut body);
        let ops: Vec<&str> = body
            .iter()
            .filter_map(|s| match s {
                Stmt::Inst(i) => Some(i.opcode.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(ops, ["mul.rn.f32", "ld.global.b32", "st.global.v2.b32"]);
    }

    #[test]
    fn a_value_read_only_by_a_guard_or_a_vector_unpack_source_stays() {
        let p = Reg {
            class: RegClass::Pred,
            n: 1,
        };
        let mut body = vec![
            inst("setp.lt.f32", vec![p.into(), r(0).into(), r(1).into()]),
            inst("add.rn.f32", vec![r(2).into(), r(0).into(), r(1).into()]),
            inst("mov.b32", vec![Operand::Vec(vec![r(5), r(6)]), r(2).into()]),
            Stmt::Inst(Inst {
                guard: Some((p, false)),
                opcode: "bra.uni".into(),
                operands: vec![Operand::Label(1)],
            }),
        ];
        remove_dead_instructions(&mut body);
        assert_eq!(body.len(), 4);
    }
}
