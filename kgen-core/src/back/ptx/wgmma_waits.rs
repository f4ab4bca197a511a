//! Placing `wgmma.wait_group`: a warpgroup product stays in flight until its result is
//! first needed, so independent work (the softmax of attention, another product's
//! operands) runs while the tensor cores do.
//!
//! Assumes: the lowered body, in program order, with complete `defs` / `uses` lists.
//! Each product is `wgmma.fence`, its `wgmma.mma_async` instructions, and
//! `wgmma.commit_group` (`lower/wgmma.rs`); the lowering emits no wait after a group
//! except where it keeps groups in flight on purpose: an explicit `wgmma.wait_group N`
//! completes every group but the newest N, and *releases* those N to the lowering,
//! which waits for them itself (the lag-1 accumulator waits one iteration later and at
//! the loop's exit, `lower_for`). Asynchronous copies into shared memory (`cp.async`,
//! TMA) only ever fill a pipeline slot whose last reader completed before a barrier
//! between the two (the pipeline's discipline, `passes/pipeline.rs`); every other write
//! of shared memory is a store, a barrier-protected conversion, or follows one.
//!
//! Guarantees: every group the lowering did not release has completed before the first
//! instruction that
//! - reads or writes one of its accumulator registers, or writes a register it reads
//!   (A's fragments, its descriptors): PTX leaves both undefined while it runs;
//! - is a barrier, an mbarrier operation, a shared-memory store or atomic, `setmaxnreg`,
//!   `ret`, `trap` or an opcode the ISA table does not know (after a barrier another
//!   thread may refill the slot the group reads);
//! - is a backward branch or a label a backward branch targets (a loop's head: no
//!   group crosses an iteration boundary);
//!
//! and before the end of the body. The wait placed is `wgmma.wait_group N` with N the
//! fewest commits that follow the groups it must complete on every path to it (groups
//! complete in order), so younger groups stay in flight. Forward branches carry the
//! groups in flight to their targets, where the paths merge (an `if` around a masked
//! block leaves a product running through it). Nothing else moves.

use super::isa::{Family, Inst, Operand, Reg, Space, Stmt};
use std::collections::{HashMap, HashSet};

/// A committed group the lowering left for this pass to wait for.
#[derive(Clone, Debug)]
struct Group {
    /// The statement index of its `wgmma.commit_group` (its identity across paths).
    id: usize,
    /// Commits after it on every path here (the fewest): `wait_group after` completes it.
    after: u32,
    /// Accumulator registers: neither read nor written while it runs.
    acc: HashSet<Reg>,
    /// Registers it reads (fragments, descriptors, the scale predicate): not written.
    reads: HashSet<Reg>,
}

/// Groups in flight at a point; `None` where no path reaches.
type State = Option<Vec<Group>>;

fn merge(a: State, b: State) -> State {
    match (a, b) {
        (None, s) | (s, None) => s,
        (Some(mut a), Some(b)) => {
            for g in b {
                match a.iter_mut().find(|x| x.id == g.id) {
                    Some(x) => x.after = x.after.min(g.after),
                    None => a.push(g),
                }
            }
            Some(a)
        }
    }
}

/// Instructions before which no group may still run, whatever registers they name.
fn completes_all(f: Family) -> bool {
    use Family::*;
    matches!(
        f,
        Bar | BarRed
            | BarrierCluster
            | Mbarrier
            | St(Space::Shared | Space::SharedCluster)
            | Atom(Space::Shared | Space::SharedCluster)
            | Red(Space::Shared | Space::SharedCluster)
            | Stmatrix
            | Setmaxnreg
            | Ret
            | Trap
            | Unknown
    )
}

fn wait(n: u32) -> Stmt {
    Stmt::Inst(Inst::new(
        None,
        "wgmma.wait_group.sync.aligned",
        vec![Operand::Imm(n as i64)],
    ))
}

/// Emits the wait that completes every group of `groups` for which `pick` holds, and
/// drops the groups it completes. No-op when none is picked.
fn complete(out: &mut Vec<Stmt>, groups: &mut Vec<Group>, pick: impl Fn(&Group) -> bool) {
    let Some(n) = groups.iter().filter(|g| pick(g)).map(|g| g.after).min() else {
        return;
    };
    out.push(wait(n));
    groups.retain(|g| g.after < n);
}

fn label_target(i: &Inst) -> Option<u32> {
    i.operands.iter().find_map(|o| match o {
        Operand::Label(l) => Some(*l),
        _ => None,
    })
}

/// Places the waits (module docs). Bodies without `wgmma` are returned unchanged.
pub fn place_waits(body: &mut Vec<Stmt>) {
    let has_wgmma = body
        .iter()
        .any(|s| matches!(s, Stmt::Inst(i) if i.opcode.family == Family::WgmmaCommit));
    if !has_wgmma {
        return;
    }
    // Labels that a later branch jumps back to: loop heads.
    let mut seen = HashSet::new();
    let mut loop_heads = HashSet::new();
    for s in body.iter() {
        match s {
            Stmt::Label(l) => {
                seen.insert(*l);
            }
            Stmt::Inst(i) if i.opcode.family == Family::Bra => {
                if let Some(l) = label_target(i).filter(|l| seen.contains(l)) {
                    loop_heads.insert(l);
                }
            }
            _ => {}
        }
    }
    // The registers of each product (fence .. commit), for the check at its fence.
    let mut batch_regs: HashMap<usize, (HashSet<Reg>, HashSet<Reg>)> = HashMap::new();
    let mut open: Option<usize> = None;
    for (k, s) in body.iter().enumerate() {
        let Stmt::Inst(i) = s else { continue };
        match i.opcode.family {
            Family::WgmmaFence => open = Some(k),
            Family::Wgmma => {
                let e = batch_regs.entry(open.unwrap_or(k)).or_default();
                e.0.extend(i.defs.iter().copied());
                e.1.extend(i.uses.iter().copied().filter(|r| !i.defs.contains(r)));
            }
            Family::WgmmaCommit => open = None,
            _ => {}
        }
    }

    let old = std::mem::take(body);
    let mut out: Vec<Stmt> = Vec::with_capacity(old.len() + 8);
    let mut saved: HashMap<u32, State> = HashMap::new();
    let mut cur: State = Some(Vec::new());
    // The group being built: its accumulator and read registers.
    let mut building: Option<(HashSet<Reg>, HashSet<Reg>)> = None;
    for (k, s) in old.into_iter().enumerate() {
        match &s {
            Stmt::Label(l) => {
                let incoming = saved.remove(l).unwrap_or(None);
                if loop_heads.contains(l) {
                    if let Some(g) = cur.as_mut() {
                        complete(&mut out, g, |_| true);
                    }
                    cur = Some(Vec::new());
                } else {
                    cur = merge(cur, incoming);
                }
                out.push(s);
                continue;
            }
            Stmt::Comment(_) => {
                out.push(s);
                continue;
            }
            Stmt::Inst(_) => {}
        }
        let Stmt::Inst(i) = &s else { continue };
        let Some(groups) = cur.as_mut() else {
            // Unreachable code (after an unconditional branch, before a label).
            out.push(s);
            continue;
        };
        let family = i.opcode.family;
        match family {
            Family::WgmmaFence => {
                // The product about to issue must not touch a running group's registers
                // (the same accumulator without the lowering's lag, say): wait before
                // its fence.
                if let Some((acc, reads)) = batch_regs.get(&k) {
                    complete(&mut out, groups, |g| {
                        g.acc.iter().any(|r| acc.contains(r) || reads.contains(r))
                            || g.reads.iter().any(|r| acc.contains(r))
                    });
                    building = Some((acc.clone(), reads.clone()));
                }
                out.push(s);
                continue;
            }
            Family::Wgmma => {
                // The group's registers: its fence gathered them already; a wgmma without
                // a fence (no lowering emits one) is tracked all the same.
                let (acc, reads) = building.get_or_insert_with(Default::default);
                acc.extend(i.defs.iter().copied());
                reads.extend(i.uses.iter().copied().filter(|r| !i.defs.contains(r)));
                out.push(s);
                continue;
            }
            Family::WgmmaCommit => {
                for g in groups.iter_mut() {
                    g.after += 1;
                }
                if let Some((acc, reads)) = building.take() {
                    groups.push(Group {
                        id: k,
                        after: 0,
                        acc,
                        reads,
                    });
                }
                out.push(s);
                continue;
            }
            Family::WgmmaWait => {
                // The lowering's own wait: it completes the older groups and releases
                // the newest N to the lowering (module docs).
                groups.clear();
                out.push(s);
                continue;
            }
            _ => {}
        }
        if completes_all(family) {
            complete(&mut out, groups, |_| true);
        } else {
            complete(&mut out, groups, |g| {
                i.uses.iter().chain(&i.defs).any(|r| g.acc.contains(r))
                    || i.defs.iter().any(|r| g.reads.contains(r))
            });
        }
        if family == Family::Bra {
            if let Some(l) = label_target(i) {
                if loop_heads.contains(&l) {
                    // Into a loop's head (its entry or back edge): nothing in flight.
                    complete(&mut out, groups, |_| true);
                } else {
                    let here = Some(groups.clone());
                    let prev = saved.remove(&l).unwrap_or(None);
                    saved.insert(l, merge(prev, here));
                }
            }
            let unconditional = i.guard.is_none();
            out.push(s);
            if unconditional {
                cur = None;
            }
            continue;
        }
        out.push(s);
    }
    if let Some(groups) = cur.as_mut() {
        complete(&mut out, groups, |_| true);
    }
    *body = out;
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
    fn b(n: u32) -> Reg {
        Reg {
            class: RegClass::B32,
            n,
        }
    }
    fn inst(op: &str, operands: Vec<Operand>) -> Stmt {
        Stmt::Inst(Inst::new(None, op, operands))
    }
    /// One product: fence, an `m64n8k16` with accumulator `acc` and A fragments `a`,
    /// commit.
    fn product(acc: [u32; 4], a: [u32; 4]) -> Vec<Stmt> {
        let desc = Reg {
            class: RegClass::B64,
            n: 1,
        };
        let p = Reg {
            class: RegClass::Pred,
            n: 1,
        };
        vec![
            inst("wgmma.fence.sync.aligned", vec![]),
            inst(
                "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16",
                vec![
                    Operand::Vec(acc.iter().map(|&n| r(n)).collect()),
                    Operand::Vec(a.iter().map(|&n| b(n)).collect()),
                    desc.into(),
                    p.into(),
                    Operand::Imm(1),
                    Operand::Imm(1),
                    Operand::Imm(1),
                ],
            ),
            inst("wgmma.commit_group.sync.aligned", vec![]),
        ]
    }
    fn text(body: &[Stmt]) -> Vec<String> {
        body.iter()
            .map(|s| match s {
                Stmt::Inst(i) => {
                    let head = i
                        .opcode
                        .text
                        .split('.')
                        .take(2)
                        .collect::<Vec<_>>()
                        .join(".");
                    match (i.opcode.family, i.operands.first()) {
                        (Family::WgmmaWait, Some(Operand::Imm(n))) => format!("wait {n}"),
                        (Family::Wgmma, _) => "mma".into(),
                        (Family::WgmmaCommit, _) => "commit".into(),
                        (Family::WgmmaFence, _) => "fence".into(),
                        _ => head,
                    }
                }
                Stmt::Label(l) => format!("L{l}:"),
                Stmt::Comment(_) => "//".into(),
            })
            .collect()
    }

    /// Two independent products: the first one's result is read after the second is
    /// issued, so its wait leaves the second in flight (`wait 1`), and the second is
    /// completed at its own first read.
    #[test]
    fn a_group_runs_until_its_first_read() {
        let mut body = product([1, 2, 3, 4], [10, 11, 12, 13]);
        body.push(inst(
            "add.s32",
            vec![b(20).into(), b(21).into(), b(21).into()],
        ));
        body.extend(product([5, 6, 7, 8], [14, 15, 16, 17]));
        body.push(inst("ex2.approx.f32", vec![r(30).into(), r(2).into()]));
        body.push(inst("ex2.approx.f32", vec![r(31).into(), r(6).into()]));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        assert_eq!(
            text(&body),
            [
                "fence",
                "mma",
                "commit",
                "add.s32",
                "fence",
                "mma",
                "commit",
                "wait 1",
                "ex2.approx",
                "wait 0",
                "ex2.approx",
                "ret"
            ]
        );
    }

    /// Writing a register a running group reads (its A fragments) waits first; so does a
    /// barrier, and the end of the body.
    #[test]
    fn fragments_barriers_and_the_end_complete_groups() {
        let mut body = product([1, 2, 3, 4], [10, 11, 12, 13]);
        body.push(inst("mov.b32", vec![b(11).into(), b(40).into()]));
        body.extend(product([5, 6, 7, 8], [14, 15, 16, 17]));
        body.push(inst("bar.sync", vec![Operand::Imm(0)]));
        body.extend(product([1, 2, 3, 4], [10, 11, 12, 13]));
        place_waits(&mut body);
        assert_eq!(
            text(&body),
            [
                "fence", "mma", "commit", "wait 0", "mov.b32", "fence", "mma", "commit", "wait 0",
                "bar.sync", "fence", "mma", "commit", "wait 0"
            ]
        );
    }

    /// A group in flight through an `if` (forward branches): the paths merge, and the
    /// first read after the join waits. A loop's back edge completes everything.
    #[test]
    fn groups_cross_forward_branches_but_not_back_edges() {
        let p = Reg {
            class: RegClass::Pred,
            n: 2,
        };
        let mut body = vec![Stmt::Label(1)];
        body.extend(product([1, 2, 3, 4], [10, 11, 12, 13]));
        body.push(Stmt::Inst(Inst::new(
            Some((p, true)),
            "bra.uni",
            vec![Operand::Label(2)],
        )));
        body.push(inst(
            "mul.f32",
            vec![r(50).into(), r(51).into(), r(51).into()],
        ));
        body.push(Stmt::Label(2));
        body.push(inst(
            "add.f32",
            vec![r(52).into(), r(3).into(), r(50).into()],
        ));
        body.extend(product([5, 6, 7, 8], [14, 15, 16, 17]));
        body.push(inst("bra.uni", vec![Operand::Label(1)]));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        assert_eq!(
            text(&body),
            [
                "L1:", "fence", "mma", "commit", "bra.uni", "mul.f32", "L2:", "wait 0", "add.f32",
                "fence", "mma", "commit", "wait 0", "bra.uni", "ret"
            ]
        );
    }

    /// The lowering's explicit `wait_group 1` (the lag-1 accumulator) stays, and the
    /// group it releases is not waited for again.
    #[test]
    fn an_explicit_wait_releases_its_newest_groups() {
        let mut body = product([1, 2, 3, 4], [10, 11, 12, 13]);
        body.push(inst("wgmma.wait_group.sync.aligned", vec![Operand::Imm(1)]));
        body.push(inst("bar.sync", vec![Operand::Imm(0)]));
        body.extend(product([1, 2, 3, 4], [10, 11, 12, 13]));
        body.push(inst("wgmma.wait_group.sync.aligned", vec![Operand::Imm(1)]));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        assert_eq!(
            text(&body),
            [
                "fence", "mma", "commit", "wait 1", "bar.sync", "fence", "mma", "commit", "wait 1",
                "ret"
            ]
        );
    }

    /// A group whose wgmma has no fence before it is still waited for at its first read.
    #[test]
    fn a_group_without_a_fence_is_tracked_too() {
        let mut body: Vec<Stmt> = product([1, 2, 3, 4], [10, 11, 12, 13])
            .into_iter()
            .skip(1)
            .collect();
        body.push(inst("ex2.approx.f32", vec![r(30).into(), r(2).into()]));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        assert_eq!(
            text(&body),
            ["mma", "commit", "wait 0", "ex2.approx", "ret"]
        );
    }
}
