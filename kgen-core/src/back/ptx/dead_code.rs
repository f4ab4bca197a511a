//! Dead-instruction removal on the lowered PTX body, the last step before printing.
//!
//! Assumes: the body's registers are function-wide (a register is one PTX register in
//! every block that names it), and every instruction's `defs` / `uses` lists are
//! complete (`isa::Inst::new` fills them from the family's operand roles).
//! Guarantees: removes only instructions whose family has no effect besides its
//! definitions (`Family::effects().is_pure()`: arithmetic, conversions, moves, compares,
//! approximate math, `mma`) and none of whose `defs` any remaining instruction reads,
//! repeated until none is left. Loads, stores, atomics, barriers, shuffles, cluster and
//! async-copy instructions, branches and unknown opcodes are never removed; nothing is
//! reordered or renumbered. It never looks at opcode text.
//! Lowering leaves such code behind by design (a value rounded to bf16 and widened back
//! whose store packs the f32 source instead; conversions a later choice made unused),
//! and PTX that users snapshot should not carry it.

use super::isa::{Reg, Stmt};
use std::collections::HashMap;

/// Removes dead pure instructions from `body` (see the module header): one count of
/// reads, then a worklist, since removing an instruction can leave its operands unread.
pub fn remove_dead_instructions(body: &mut Vec<Stmt>) {
    let mut uses: HashMap<Reg, usize> = HashMap::new();
    for s in body.iter() {
        if let Stmt::Inst(i) = s {
            for &r in &i.uses {
                *uses.entry(r).or_insert(0) += 1;
            }
        }
    }
    // Pure instructions per defined register, so a register whose reads drop to 0 finds
    // them.
    let mut defs: HashMap<Reg, Vec<usize>> = HashMap::new();
    for (k, s) in body.iter().enumerate() {
        if let Stmt::Inst(i) = s {
            if i.effects().is_pure() {
                for &d in &i.defs {
                    defs.entry(d).or_default().push(k);
                }
            }
        }
    }
    let unread = |d: &Reg, uses: &HashMap<Reg, usize>| uses.get(d).copied().unwrap_or(0) == 0;
    let mut removed = vec![false; body.len()];
    let mut work: Vec<Reg> = defs.keys().copied().filter(|d| unread(d, &uses)).collect();
    while let Some(d) = work.pop() {
        for &k in defs.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
            if removed[k] {
                continue;
            }
            let Stmt::Inst(i) = &body[k] else { continue };
            // Every register it defines must be unread (an `mma` defines four).
            if !i.defs.iter().all(|r| unread(r, &uses)) {
                continue;
            }
            removed[k] = true;
            for r in &i.uses {
                if let Some(n) = uses.get_mut(r) {
                    *n -= 1;
                    if *n == 0 && defs.contains_key(r) {
                        work.push(*r);
                    }
                }
            }
        }
    }
    let mut k = 0;
    body.retain(|_| {
        k += 1;
        !removed[k - 1]
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::back::ptx::isa::{Inst, Operand, RegClass};

    fn r(n: u32) -> Reg {
        Reg {
            class: RegClass::F32,
            n,
        }
    }
    fn inst(op: &str, ops: Vec<Operand>) -> Stmt {
        Stmt::Inst(Inst::new(None, op, ops))
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
                Stmt::Inst(i) => Some(i.opcode.text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(ops, ["mul.rn.f32", "ld.global.b32", "st.global.v2.b32"]);
    }

    #[test]
    fn an_mma_stays_while_any_of_its_results_is_read_and_unknown_opcodes_always_stay() {
        let v = |ns: &[u32]| Operand::Vec(ns.iter().map(|&n| r(n)).collect());
        let mma = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
        let mut body = vec![
            // The accumulator registers are both read and written.
            inst(
                mma,
                vec![
                    v(&[1, 2, 3, 4]),
                    v(&[5, 6, 7, 8]),
                    v(&[9, 10]),
                    v(&[1, 2, 3, 4]),
                ],
            ),
            inst(
                "st.global.b32",
                vec![
                    Operand::Mem(crate::back::ptx::isa::Addr::Reg(r(20)), 0),
                    r(3).into(),
                ],
            ),
            inst("frobnicate.b32", vec![r(30).into(), r(31).into()]),
        ];
        remove_dead_instructions(&mut body);
        assert_eq!(
            body.len(),
            3,
            "c[2] is stored, so the mma stays; unknown stays"
        );
        let mut body = vec![inst(
            mma,
            vec![
                v(&[1, 2, 3, 4]),
                v(&[5, 6, 7, 8]),
                v(&[9, 10]),
                v(&[11, 12, 13, 14]),
            ],
        )];
        remove_dead_instructions(&mut body);
        assert!(body.is_empty(), "an mma nothing reads is pure and goes");
    }

    #[test]
    fn families_and_roles_come_from_the_table() {
        use crate::back::ptx::isa::{Family, Space};
        let i = Inst::new(
            None,
            "ld.global.v4.b32",
            vec![
                Operand::Vec(vec![r(1), r(2), r(3), r(4)]),
                Operand::Mem(crate::back::ptx::isa::Addr::Reg(r(9)), 16),
            ],
        );
        assert_eq!(i.opcode.family, Family::Ld(Space::Global));
        assert_eq!(i.defs, vec![r(1), r(2), r(3), r(4)]);
        assert_eq!(i.uses, vec![r(9)]);
        let st = Inst::new(
            Some((r(7), true)),
            "st.shared.b32",
            vec![
                Operand::Mem(crate::back::ptx::isa::Addr::Reg(r(9)), 0),
                r(5).into(),
            ],
        );
        assert!(st.defs.is_empty());
        assert_eq!(st.uses, vec![r(7), r(9), r(5)]);
        assert_eq!(Family::of("cp.async.cg.shared.global"), Family::CpAsync);
        assert_eq!(Family::of("cp.async.wait_group"), Family::CpAsyncWait);
        assert_eq!(Family::of("bar.red.or.pred"), Family::BarRed);
        assert_eq!(Family::of("barrier.cluster.arrive"), Family::BarrierCluster);
        // mbarrier: a wait, a plain arrival (a release) and the rest are told apart.
        assert_eq!(
            Family::of("mbarrier.try_wait.parity.shared::cta.b64"),
            Family::MbarrierWait
        );
        assert_eq!(
            Family::of("mbarrier.arrive.shared::cta.b64"),
            Family::MbarrierArrive
        );
        assert_eq!(
            Family::of("mbarrier.arrive.expect_tx.shared::cta.b64"),
            Family::Mbarrier
        );
        assert_eq!(
            Family::of("mbarrier.init.shared::cta.b64"),
            Family::Mbarrier
        );
        assert_eq!(
            Family::of("ld.shared::cluster.b32"),
            Family::Ld(Space::SharedCluster)
        );
        assert!(Family::of("frobnicate").effects() == crate::back::ptx::isa::Effects::ALL);
        // wgmma: the accumulator vector is read and written in place; the descriptors and
        // the scale predicate are read; it is never removed (it reads shared memory and
        // completes asynchronously).
        let p = Reg {
            class: RegClass::Pred,
            n: 3,
        };
        let w = Inst::new(
            None,
            "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16",
            vec![
                Operand::Vec(vec![r(1), r(2), r(3), r(4)]),
                r(20).into(),
                r(21).into(),
                p.into(),
                Operand::Imm(1),
                Operand::Imm(1),
                Operand::Imm(0),
                Operand::Imm(1),
            ],
        );
        assert_eq!(w.opcode.family, Family::Wgmma);
        assert_eq!(w.defs, vec![r(1), r(2), r(3), r(4)]);
        assert_eq!(w.uses, vec![r(1), r(2), r(3), r(4), r(20), r(21), p]);
        assert!(!w.opcode.family.effects().is_pure());
        for (sync, family) in [
            ("wgmma.fence.sync.aligned", Family::WgmmaFence),
            ("wgmma.commit_group.sync.aligned", Family::WgmmaCommit),
            ("wgmma.wait_group.sync.aligned", Family::WgmmaWait),
        ] {
            assert_eq!(Family::of(sync), family);
            assert!(Family::of(sync).effects().syncs);
        }
        assert_eq!(Family::of("wgmma.frobnicate"), Family::Unknown);
        assert_eq!(Family::of("fence.proxy.async.shared::cta"), Family::Fence);
    }

    #[test]
    fn a_value_read_only_by_a_guard_or_an_unpack_that_is_read_stays() {
        let p = Reg {
            class: RegClass::Pred,
            n: 1,
        };
        let mut body = vec![
            inst("setp.lt.f32", vec![p.into(), r(0).into(), r(1).into()]),
            inst("add.rn.f32", vec![r(2).into(), r(0).into(), r(1).into()]),
            inst("mov.b32", vec![Operand::Vec(vec![r(5), r(6)]), r(2).into()]),
            // Only the high half of the unpack is read: the unpack (and the add) stay.
            inst(
                "st.global.b32",
                vec![
                    Operand::Mem(crate::back::ptx::isa::Addr::Reg(r(9)), 0),
                    r(6).into(),
                ],
            ),
            Stmt::Inst(Inst::new(
                Some((p, false)),
                "bra.uni",
                vec![Operand::Label(1)],
            )),
            // An unpack nothing reads goes, with the value only it read.
            inst("add.rn.f32", vec![r(7).into(), r(0).into(), r(0).into()]),
            inst(
                "mov.b32",
                vec![Operand::Vec(vec![r(10), r(11)]), r(7).into()],
            ),
        ];
        remove_dead_instructions(&mut body);
        assert_eq!(body.len(), 5);
    }
}
