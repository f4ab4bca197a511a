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
//! - is a barrier, an mbarrier operation other than a wait (`try_wait`, which only reads
//!   the barrier), a shared-memory store or atomic, `setmaxnreg`, `ret`, `trap` or an
//!   opcode the ISA table does not know (after a barrier another thread may refill the
//!   slot the group reads);
//! - is a backward branch or a label a backward branch targets (a loop's head: no
//!   group crosses an iteration boundary), except a *spin loop*: straight-line code
//!   with no product, barrier, store or arrive between its head and its back edge (an
//!   mbarrier wait), through which groups run on;
//!
//! and before the end of the body. The wait placed is `wgmma.wait_group N` with N the
//! fewest commits that follow the groups it must complete on every path to it (groups
//! complete in order), so younger groups stay in flight. Forward branches carry the
//! groups in flight to their targets, where the paths merge (an `if` around a masked
//! block leaves a product running through it).
//!
//! A *deferred* wait is pinned: ptxas schedules `wgmma.wait_group` by its own latency
//! model and hoists it to a few dozen instructions after the commit, which would put
//! attention's P·V wait in front of the softmax it is meant to run beside. A group that
//! ran beside work on an earlier group's result (an instruction reading the accumulator
//! of a group completed since the last loop head), on every path, and whose wait stands
//! [`DEFERRED`] or more instructions after its commit gets a `pmevent` right before the
//! wait: ptxas moves no instruction across one (measured in SASS), and it does nothing
//! else. Work that reads no product's result (index arithmetic) leaves a wait unpinned.
//!
//! A plain `mbarrier.arrive` (a warp-specialized consumer's release of a slot,
//! `lower/ws.rs`) is the one instruction that moves: it is *held* until every group in
//! flight where it stood has completed, then emitted right after the wait that
//! completes them, so releasing a slot no longer waits for the product that read it.
//! A release is held only outside every `if` (a forward branch whose paths merge) and
//! spin loop, where its registers are defined once (still valid later), and it is
//! emitted only there too, so every path runs it exactly once; a loop's head or back
//! edge, a jump out of the loop and the end of the body emit what is held. Where that
//! would put one inside an `if` (a loop nested in it), that release is placed where it
//! stands instead, waiting for its groups there. Nothing else moves.

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
    /// Instructions since its commit on every path here (the fewest).
    since: usize,
    /// Whether, on every path here, it has run beside work on an earlier product's
    /// result (an instruction reading a completed group's accumulator): its wait is then
    /// *deferred* on purpose (module docs).
    overlapped: bool,
}

/// Groups in flight at a point; `None` where no path reaches.
type State = Option<Vec<Group>>;

fn merge(a: State, b: State) -> State {
    match (a, b) {
        (None, s) | (s, None) => s,
        (Some(mut a), Some(b)) => {
            for g in b {
                match a.iter_mut().find(|x| x.id == g.id) {
                    Some(x) => {
                        x.after = x.after.min(g.after);
                        x.since = x.since.min(g.since);
                        x.overlapped &= g.overlapped;
                    }
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
            | MbarrierArrive
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

/// How many instructions after a group's commit its wait must stand, the group having
/// run beside work on another product's result, to be *deferred*: pinned there with a
/// scheduling fence (module docs).
const DEFERRED: usize = 64;

/// Emits the wait that completes every group of `groups` for which `pick` holds, and
/// drops the groups it completes. No-op when none is picked. The wait of a deferred
/// group ([`DEFERRED`], [`Group::overlapped`]: the youngest it completes) comes after a
/// `pmevent`, which ptxas schedules nothing across.
fn complete(out: &mut Vec<Stmt>, groups: &mut Vec<Group>, pick: impl Fn(&Group) -> bool) {
    let Some(n) = groups.iter().filter(|g| pick(g)).map(|g| g.after).min() else {
        return;
    };
    let youngest = groups
        .iter()
        .filter(|g| g.after >= n)
        .min_by_key(|g| g.since);
    if youngest.is_some_and(|g| g.overlapped && g.since >= DEFERRED) {
        out.push(Stmt::Inst(Inst::new(
            None,
            "pmevent",
            vec![Operand::Imm(PMEVENT)],
        )));
    }
    out.push(wait(n));
    groups.retain(|g| g.after < n);
}

/// The `pmevent` index of the fence (0-15; events 0-7 are counted by profilers as
/// `prof_trigger_0x`, nothing else reads them).
const PMEVENT: i64 = 7;

fn label_target(i: &Inst) -> Option<u32> {
    i.operands.iter().find_map(|o| match o {
        Operand::Label(l) => Some(*l),
        _ => None,
    })
}

/// A release (`mbarrier.arrive`) held back until the groups that were in flight where
/// it stood have completed.
#[derive(Clone, Debug)]
struct Held {
    /// Its statement index in the input (its identity).
    id: usize,
    stmt: Stmt,
    /// The groups in flight at it (their ids): all of them complete before it is emitted.
    groups: Vec<usize>,
}

/// What the pre-scan of a body finds about its control flow and registers.
struct Shape {
    /// Labels a later branch jumps back to: loop heads.
    loop_heads: HashSet<u32>,
    /// Spin loops (a label, straight-line code with no product, barrier or store, and a
    /// branch back to the label: an mbarrier wait): the index of each one's back edge.
    spin_heads: HashMap<u32, usize>,
    spin_backs: HashSet<usize>,
    /// Forward branches (by index) that jump over no back edge but a spin loop's: the
    /// `if`s whose paths merge at their target.
    region_branches: HashSet<usize>,
    /// How many instructions define each register.
    defs: HashMap<Reg, u32>,
}

fn shape(body: &[Stmt]) -> Shape {
    let mut label_at = HashMap::new();
    for (k, s) in body.iter().enumerate() {
        if let Stmt::Label(l) = s {
            label_at.insert(*l, k);
        }
    }
    let mut loop_heads = HashSet::new();
    let mut backs = Vec::new();
    let mut forwards = Vec::new();
    let mut defs: HashMap<Reg, u32> = HashMap::new();
    for (k, s) in body.iter().enumerate() {
        let Stmt::Inst(i) = s else { continue };
        for r in &i.defs {
            *defs.entry(*r).or_default() += 1;
        }
        if i.opcode.family != Family::Bra {
            continue;
        }
        match label_target(i).and_then(|l| label_at.get(&l).map(|&at| (l, at))) {
            Some((l, at)) if at < k => {
                loop_heads.insert(l);
                backs.push((at, k, l));
            }
            Some((_, at)) => forwards.push((k, at)),
            None => {}
        }
    }
    let mut spin_heads = HashMap::new();
    let mut spin_backs = HashSet::new();
    for &(at, k, l) in &backs {
        let only_back_edge = backs.iter().filter(|b| b.2 == l).count() == 1
            && !forwards.iter().any(|&(_, t)| t == at);
        let plain = body[at + 1..k].iter().all(|s| match s {
            Stmt::Label(_) => false,
            Stmt::Comment(_) => true,
            Stmt::Inst(i) => {
                let f = i.opcode.family;
                !matches!(
                    f,
                    Family::Wgmma
                        | Family::WgmmaFence
                        | Family::WgmmaCommit
                        | Family::WgmmaWait
                        | Family::Bra
                        | Family::MbarrierArrive
                ) && !completes_all(f)
            }
        });
        if only_back_edge && plain {
            spin_heads.insert(l, k);
            spin_backs.insert(k);
        }
    }
    let region_branches = forwards
        .iter()
        .filter(|&&(k, at)| {
            !backs
                .iter()
                .any(|&(_, b, _)| b > k && b < at && !spin_backs.contains(&b))
        })
        .map(|&(k, _)| k)
        .collect();
    Shape {
        loop_heads,
        spin_heads,
        spin_backs,
        region_branches,
        defs,
    }
}

/// Places the waits (module docs). Bodies without `wgmma` are returned unchanged.
pub fn place_waits(body: &mut Vec<Stmt>) {
    let has_wgmma = body
        .iter()
        .any(|s| matches!(s, Stmt::Inst(i) if i.opcode.family == Family::WgmmaCommit));
    if !has_wgmma {
        return;
    }
    let shape = shape(body);
    // A release that would have to be emitted inside an `if` (where the other path does
    // not pass) is placed where it stands instead; try again without holding it.
    let mut in_place = HashSet::new();
    loop {
        match place(body, &shape, &in_place) {
            Ok(out) => {
                *body = out;
                return;
            }
            Err(id) => {
                in_place.insert(id);
            }
        }
    }
}

/// Emits every held release whose groups have all completed, where the code is not
/// inside an `if` or a spin loop.
fn emit_held(out: &mut Vec<Stmt>, held: &mut Vec<Held>, groups: &[Group], free: bool) {
    if !free {
        return;
    }
    held.retain(|h| {
        let ready = !h.groups.iter().any(|id| groups.iter().any(|g| g.id == *id));
        if ready {
            out.push(h.stmt.clone());
        }
        !ready
    });
}

/// Completes what the held releases wait for and emits them (a loop's head or back
/// edge, a jump out of a loop, the end of the body). `Err`: a release held into an `if`
/// would be emitted on one path only.
fn flush_held(
    out: &mut Vec<Stmt>,
    held: &mut Vec<Held>,
    groups: &mut Vec<Group>,
    in_region: bool,
) -> Result<(), usize> {
    if let Some(h) = held.first() {
        if in_region {
            return Err(h.id);
        }
    }
    let ids: HashSet<usize> = held.iter().flat_map(|h| h.groups.iter().copied()).collect();
    complete(out, groups, |g| ids.contains(&g.id));
    emit_held(out, held, groups, true);
    Ok(())
}

fn place(old: &[Stmt], shape: &Shape, in_place: &HashSet<usize>) -> Result<Vec<Stmt>, usize> {
    // The registers of each product (fence .. commit), for the check at its fence.
    let mut batch_regs: HashMap<usize, (HashSet<Reg>, HashSet<Reg>)> = HashMap::new();
    let mut open: Option<usize> = None;
    for (k, s) in old.iter().enumerate() {
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

    let mut out: Vec<Stmt> = Vec::with_capacity(old.len() + 8);
    let mut saved: HashMap<u32, State> = HashMap::new();
    let mut cur: State = Some(Vec::new());
    // The group being built: its accumulator and read registers.
    let mut building: Option<(HashSet<Reg>, HashSet<Reg>)> = None;
    // Releases held back, the `if` targets not reached yet, and whether this is inside
    // a spin loop.
    let mut held: Vec<Held> = Vec::new();
    let mut regions: Vec<u32> = Vec::new();
    let mut in_spin = false;
    // The accumulators of the groups committed since the last loop head.
    let mut acc_of: HashMap<usize, HashSet<Reg>> = HashMap::new();
    for (k, s) in old.iter().enumerate() {
        match s {
            Stmt::Label(l) => {
                if shape.spin_heads.contains_key(l) {
                    // Nothing in a spin loop starts or needs a product: groups run on.
                    in_spin = true;
                    out.push(s.clone());
                    continue;
                }
                regions.retain(|r| r != l);
                let incoming = saved.remove(l).unwrap_or(None);
                if shape.loop_heads.contains(l) {
                    acc_of.clear();
                    if let Some(g) = cur.as_mut() {
                        flush_held(&mut out, &mut held, g, !regions.is_empty())?;
                        complete(&mut out, g, |_| true);
                    }
                    cur = Some(Vec::new());
                } else {
                    cur = merge(cur, incoming);
                }
                out.push(s.clone());
                if let Some(g) = cur.as_ref() {
                    emit_held(&mut out, &mut held, g, regions.is_empty() && !in_spin);
                }
                continue;
            }
            Stmt::Comment(_) => {
                out.push(s.clone());
                continue;
            }
            Stmt::Inst(_) => {}
        }
        let Stmt::Inst(i) = s else { continue };
        let Some(groups) = cur.as_mut() else {
            // Unreachable code (after an unconditional branch, before a label).
            out.push(s.clone());
            continue;
        };
        // Reading a completed group's accumulator: work on an earlier product's result.
        let on_result = i.uses.iter().any(|r| {
            acc_of
                .iter()
                .any(|(id, acc)| acc.contains(r) && !groups.iter().any(|g| g.id == *id))
        });
        for g in groups.iter_mut() {
            g.since += 1;
            g.overlapped |= on_result;
        }
        let free = regions.is_empty() && !in_spin;
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
                    emit_held(&mut out, &mut held, groups, free);
                    building = Some((acc.clone(), reads.clone()));
                }
                out.push(s.clone());
                continue;
            }
            Family::Wgmma => {
                // The group's registers: its fence gathered them already; a wgmma without
                // a fence (no lowering emits one) is tracked all the same.
                let (acc, reads) = building.get_or_insert_with(Default::default);
                acc.extend(i.defs.iter().copied());
                reads.extend(i.uses.iter().copied().filter(|r| !i.defs.contains(r)));
                out.push(s.clone());
                continue;
            }
            Family::WgmmaCommit => {
                for g in groups.iter_mut() {
                    g.after += 1;
                }
                if let Some((acc, reads)) = building.take() {
                    acc_of.insert(k, acc.clone());
                    groups.push(Group {
                        id: k,
                        after: 0,
                        acc,
                        reads,
                        since: 0,
                        overlapped: false,
                    });
                }
                out.push(s.clone());
                continue;
            }
            Family::WgmmaWait => {
                // The lowering's own wait: it completes the older groups and releases
                // the newest N to the lowering (module docs).
                groups.clear();
                out.push(s.clone());
                emit_held(&mut out, &mut held, groups, free);
                continue;
            }
            Family::MbarrierArrive
                if free
                    && !in_place.contains(&k)
                    && i.uses
                        .iter()
                        .all(|r| shape.defs.get(r).copied().unwrap_or(0) <= 1) =>
            {
                // A release: held until the groups in flight here (the products that
                // read the slot among them) complete, so they run on meanwhile. Its
                // registers are defined once, so they still hold their values then.
                held.push(Held {
                    id: k,
                    stmt: s.clone(),
                    groups: groups.iter().map(|g| g.id).collect(),
                });
                emit_held(&mut out, &mut held, groups, free);
                continue;
            }
            _ => {}
        }
        if matches!(family, Family::Ret | Family::Trap) {
            flush_held(&mut out, &mut held, groups, !regions.is_empty())?;
        }
        if completes_all(family) {
            complete(&mut out, groups, |_| true);
        } else {
            complete(&mut out, groups, |g| {
                i.uses.iter().chain(&i.defs).any(|r| g.acc.contains(r))
                    || i.defs.iter().any(|r| g.reads.contains(r))
            });
        }
        emit_held(&mut out, &mut held, groups, free);
        if family == Family::Bra {
            if shape.spin_backs.contains(&k) {
                // A spin loop's back edge: its groups and holds carry on.
                out.push(s.clone());
                in_spin = false;
                emit_held(&mut out, &mut held, groups, regions.is_empty());
                continue;
            }
            if let Some(l) = label_target(i) {
                if shape.loop_heads.contains(&l) {
                    // Into a loop's head (its entry or back edge): nothing in flight.
                    flush_held(&mut out, &mut held, groups, !regions.is_empty())?;
                    complete(&mut out, groups, |_| true);
                } else {
                    if shape.region_branches.contains(&k) {
                        regions.push(l);
                    } else {
                        // Out of a loop: what the loop holds is released first.
                        flush_held(&mut out, &mut held, groups, !regions.is_empty())?;
                    }
                    let here = Some(groups.clone());
                    let prev = saved.remove(&l).unwrap_or(None);
                    saved.insert(l, merge(prev, here));
                }
            }
            let unconditional = i.guard.is_none();
            out.push(s.clone());
            if unconditional {
                cur = None;
            }
            continue;
        }
        out.push(s.clone());
    }
    match cur.as_mut() {
        Some(groups) => {
            flush_held(&mut out, &mut held, groups, false)?;
            complete(&mut out, groups, |_| true);
        }
        None => {
            if let Some(h) = held.first() {
                return Err(h.id);
            }
        }
    }
    Ok(out)
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

    /// A group that runs beside work on an earlier product's result (attention's
    /// softmax beside P·V) and is first needed [`DEFERRED`] instructions later is pinned
    /// there: `pmevent` before its wait. As much work that reads no product's result
    /// (index arithmetic before a masked read) leaves the wait unpinned.
    #[test]
    fn a_deferred_wait_is_pinned_with_a_fence() {
        let n = DEFERRED as u32;
        let mut body = product([1, 2, 3, 4], [10, 11, 12, 13]);
        body.extend(product([5, 6, 7, 8], [14, 15, 16, 17]));
        for k in 0..n {
            body.push(inst(
                "ex2.approx.f32",
                vec![r(100 + k).into(), r(1 + k % 4).into()],
            ));
        }
        body.push(inst(
            "mul.rn.f32",
            vec![r(90).into(), r(5).into(), r(100).into()],
        ));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        let t = text(&body);
        let at = |s: &str| t.iter().position(|x| x == s).unwrap();
        assert_eq!(t.iter().filter(|x| *x == "pmevent").count(), 1, "{t:?}");
        assert_eq!(at("wait 1"), 6, "{t:?}");
        assert_eq!(at("pmevent") + 1, at("wait 0"), "{t:?}");
        assert_eq!(at("wait 0") + 1, at("mul.rn"), "{t:?}");

        let mut body = product([1, 2, 3, 4], [10, 11, 12, 13]);
        for k in 0..2 * n {
            body.push(inst(
                "add.s32",
                vec![b(100 + k).into(), b(99 + k).into(), b(20).into()],
            ));
        }
        body.push(inst("ex2.approx.f32", vec![r(30).into(), r(2).into()]));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        let t = text(&body);
        assert!(!t.iter().any(|x| x == "pmevent"), "{t:?}");
        assert_eq!(t[t.len() - 3], "wait 0", "{t:?}");
    }

    /// A ping-pong turn (`Inst::turn`: the same `bar.sync` / `bar.arrive` text, of
    /// [`Family::WarpTurn`]) orders no memory: products run on across it, where a block
    /// barrier completes them.
    #[test]
    fn a_turn_does_not_complete_groups() {
        let mut body = product([1, 2, 3, 4], [10, 11, 12, 13]);
        body.push(Stmt::Inst(Inst::turn(
            None,
            "bar.arrive",
            vec![Operand::Imm(3), Operand::Imm(256)],
        )));
        body.push(inst("ex2.approx.f32", vec![r(30).into(), r(2).into()]));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        assert_eq!(
            text(&body),
            [
                "fence",
                "mma",
                "commit",
                "bar.arrive",
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

    fn arrive(addr: u32) -> Stmt {
        let p = Reg {
            class: RegClass::Pred,
            n: 9,
        };
        Stmt::Inst(Inst::new(
            Some((p, false)),
            "mbarrier.arrive.shared::cta.b64",
            vec![
                Operand::Sym("_".into()),
                Operand::Mem(crate::back::ptx::isa::Addr::Reg(b(addr)), 0),
            ],
        ))
    }
    /// `L: mbarrier.try_wait p, [addr], phase; @!p bra L;`
    fn spin(l: u32, addr: u32) -> Vec<Stmt> {
        let p = Reg {
            class: RegClass::Pred,
            n: 10 + l,
        };
        vec![
            Stmt::Label(l),
            Stmt::Inst(Inst::new(
                None,
                "mbarrier.try_wait.parity.shared::cta.b64",
                vec![
                    p.into(),
                    Operand::Mem(crate::back::ptx::isa::Addr::Reg(b(addr)), 0),
                    b(addr + 1).into(),
                ],
            )),
            Stmt::Inst(Inst::new(Some((p, false)), "bra", vec![Operand::Label(l)])),
        ]
    }

    /// A warp-specialized consumer's release of the slot a product read is held until
    /// that product completes (its result's first read), so the product runs on through
    /// the independent work between; before, the arrive waited for it at once.
    #[test]
    fn a_release_waits_for_the_products_first_read() {
        let mut body = product([1, 2, 3, 4], [10, 11, 12, 13]);
        body.extend(product([5, 6, 7, 8], [14, 15, 16, 17]));
        body.push(arrive(40));
        body.push(inst("ex2.approx.f32", vec![r(30).into(), r(2).into()]));
        body.push(inst("ex2.approx.f32", vec![r(31).into(), r(32).into()]));
        body.push(inst(
            "add.f32",
            vec![r(33).into(), r(6).into(), r(31).into()],
        ));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        assert_eq!(
            text(&body),
            [
                "fence",
                "mma",
                "commit",
                "fence",
                "mma",
                "commit",
                "wait 1",
                "ex2.approx",
                "ex2.approx",
                "wait 0",
                "mbarrier.arrive",
                "add.f32",
                "ret"
            ]
        );
    }

    /// An mbarrier wait's spin loop neither completes a group nor releases what is held;
    /// a release is held through an `if` (the taken path still runs the group after the
    /// merge), and a loop's back edge releases what is still held.
    #[test]
    fn spin_loops_and_ifs_keep_a_release_held() {
        let p = Reg {
            class: RegClass::Pred,
            n: 2,
        };
        let mut body = vec![Stmt::Label(1)];
        body.extend(product([1, 2, 3, 4], [10, 11, 12, 13]));
        body.push(arrive(40));
        body.extend(spin(3, 42));
        body.push(Stmt::Inst(Inst::new(
            Some((p, true)),
            "bra.uni",
            vec![Operand::Label(2)],
        )));
        body.push(inst(
            "mul.f32",
            vec![r(50).into(), r(3).into(), r(51).into()],
        ));
        body.push(Stmt::Label(2));
        body.extend(product([5, 6, 7, 8], [14, 15, 16, 17]));
        body.push(arrive(44));
        body.push(inst("bra.uni", vec![Operand::Label(1)]));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        assert_eq!(
            text(&body),
            [
                "L1:",
                "fence",
                "mma",
                "commit",
                "L3:",
                "mbarrier.try_wait",
                "bra",
                "bra.uni",
                "wait 0",
                "mul.f32",
                "L2:",
                "fence",
                "mma",
                "commit",
                "wait 0",
                "mbarrier.arrive",
                "mbarrier.arrive",
                "bra.uni",
                "ret"
            ]
        );
    }

    /// A release that a loop inside an `if` would have to emit on one path only is
    /// placed where it stands, waiting for its products there.
    #[test]
    fn a_release_that_cannot_be_held_stays_in_place() {
        let p = Reg {
            class: RegClass::Pred,
            n: 2,
        };
        let mut body = product([1, 2, 3, 4], [10, 11, 12, 13]);
        body.push(arrive(40));
        body.push(Stmt::Inst(Inst::new(
            Some((p, true)),
            "bra.uni",
            vec![Operand::Label(2)],
        )));
        body.push(Stmt::Label(5));
        body.push(inst(
            "add.s32",
            vec![b(60).into(), b(60).into(), b(61).into()],
        ));
        body.push(inst("bar.sync", vec![Operand::Imm(1)]));
        body.push(Stmt::Inst(Inst::new(
            Some((p, true)),
            "bra.uni",
            vec![Operand::Label(5)],
        )));
        body.push(Stmt::Label(2));
        body.push(inst("ret", vec![]));
        place_waits(&mut body);
        assert_eq!(
            text(&body),
            [
                "fence",
                "mma",
                "commit",
                "wait 0",
                "mbarrier.arrive",
                "bra.uni",
                "L5:",
                "add.s32",
                "bar.sync",
                "bra.uni",
                "L2:",
                "ret"
            ]
        );
    }
}
