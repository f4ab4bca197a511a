//! Keeping a pipelined loop's ring alive across the rounds of a persistent loop: the
//! prologue of a pipelined loop nested in another `for` (a persistent kernel's loop over
//! its tiles) is issued for round 0 before the outer loop and for round `r + 1` at the end
//! of round `r`, so the ring's buffers live across the whole outer loop. On sm_90a its TMA
//! mbarriers are then initialized once and their parities run on through the rounds,
//! instead of being initialized, fenced and invalidated around every tile behind block
//! barriers; the previous round's unread fills (fetches past the inner loop's end) are
//! consumed by the refill (`lower/tma.rs`).
//!
//! ```text
//! for r in lo..hi step st {                 prologue(r = lo)
//!     pre(r)                                for r in lo..hi step st {
//!     prologue(r)               becomes         pre(r)
//!     for k ... (pipelined)                     for k ... (pipelined)
//!     scratch_wait(0)                           scratch_wait(0)
//!     epilogue(r)                               epilogue(r)
//! }                                             prologue(r + st), past hi: tile index -1
//!                                           }
//!                                           scratch_wait(0)
//! ```
//!
//! Issuing round `r + 1`'s prologue earlier, before round `r`'s epilogue (so its copies
//! overlap the epilogue), measured slower on the H100 where the epilogue's stores are a
//! large stream (an LM head, 16384 x 50304 x 768: +15%), though faster on a short
//! batched product (Newton-Schulz's update, 24 x 768 x 3072: -2.5% against this form);
//! docs/PERFORMANCE.md has the numbers.
//!
//! Assumes: `passes::pipeline` has just rewritten the inner loop, and reports its
//! prologue (the instructions it put before the loop, in order) and its drain; the outer
//! loop is not itself pipelined. The prologue's fetches read only tensors the kernel
//! never writes (the pipeline's condition), so issuing them earlier cannot change what
//! they read.
//! Guarantees: the rewrite happens only when the outer body holds exactly one pipelined
//! loop at its top level and every value the prologue reads from the outer body is
//! computable from the outer induction variable by pure constant / element-wise / shape
//! / query ops (so it can be recomputed for the next round at the end of the round, and
//! for the first round before the loop); otherwise nothing changes. The next round's
//! fetches, when there is none, get a tile index of -1 in their first dimension: out of
//! bounds, so they copy zeros and read no memory, and the `scratch_wait(0)` after the
//! outer loop drains them. The slots the prologue fills are those the inner loop's own
//! prologue filled, so the inner loop is unchanged, and nothing between the prologue and
//! the inner loop fetches (the inner loop's first wait counts the same copies). The
//! ring's buffers live across the outer loop (`lower/staged.rs` lifetimes), so the
//! epilogue's shared memory no longer shares their bytes (a conversion short of room goes
//! through half its buffer, `lower/shape.rs`); a kernel that no longer fits is compiled
//! again in the plain form (`pipeline::compile`). The back end's tracker places the
//! barrier between the round's reads of the ring and the refill (`back/ptx/sync.rs`).

use super::pipeline::{clone_chain, computable};
use crate::ir::{Block, Builder, CmpOp, Function, InstId, Op, ValueId};
use crate::types::{DType, Scalar, ValueType};
use std::collections::{HashMap, HashSet};

/// A loop `passes::pipeline` rewrote, as it left it in its block.
pub(super) struct Pipelined {
    /// The prologue: the instructions put right before the loop, in order.
    pub before: Vec<InstId>,
    pub for_id: InstId,
    /// The drain put right after the loop.
    pub after: Vec<InstId>,
}

/// Moves the prologue of the one pipelined loop in the body of `outer` (a `for`) a round
/// ahead (module docs). Returns the instructions to put before and after `outer` in its
/// block, or `None` (and changes nothing) when the loop does not qualify.
pub(super) fn run(
    func: &mut Function,
    outer: InstId,
    inner: &[Pipelined],
) -> Option<(Vec<InstId>, Vec<InstId>)> {
    let [p] = inner else { return None };
    if p.before.is_empty() {
        return None;
    }
    let Op::For {
        lower,
        upper,
        step,
        body,
        ..
    } = func.insts[outer].op.clone()
    else {
        return None;
    };
    let &iv = body.args.first()?;
    // The prologue must sit at the outer body's top level, before its loop and drain.
    let pos = |i: InstId| body.insts.iter().position(|&x| x == i);
    let loop_at = pos(p.for_id)?;
    if p.after.iter().any(|&i| pos(i).is_none_or(|k| k < loop_at)) {
        return None;
    }
    // The next round's prologue goes last, before the body's `yield`.
    let at = match body.insts.last() {
        Some(&y) if matches!(func.insts[y].op, Op::Yield(_)) => body.insts.len() - 1,
        _ => body.insts.len(),
    };
    if p.before.iter().any(|&i| pos(i).is_none_or(|k| k > loop_at)) {
        return None;
    }
    let in_prologue: HashSet<InstId> = p.before.iter().copied().collect();
    let mut def: HashMap<ValueId, InstId> = HashMap::new();
    for &i in &body.insts {
        for &r in &func.insts[i].results {
            def.insert(r, i);
        }
    }
    let prologue_defs: HashSet<ValueId> = p
        .before
        .iter()
        .flat_map(|&i| func.insts[i].results.iter().copied())
        .collect();
    let body_values: HashSet<ValueId> = {
        let mut s: HashSet<ValueId> = body.args.iter().copied().collect();
        s.extend(def.keys().copied());
        for &i in &body.insts {
            for r in crate::ir::regions(&func.insts[i].op) {
                s.extend(r.args.iter().copied());
                let mut all = Vec::new();
                super::pipeline::collect_defs(func, r, &mut all);
                s.extend(all);
            }
        }
        s
    };
    // Every value the prologue reads from outside itself can be recomputed for another
    // round.
    for &i in &p.before {
        for v in crate::ir::operands(&func.insts[i].op) {
            if !prologue_defs.contains(&v) && !computable(func, v, iv, &def, &body_values) {
                return None;
            }
        }
    }
    let span = func.insts[outer].span;
    let i32t = ValueType::Scalar(DType::I32);
    let boolt = ValueType::Scalar(DType::Bool);
    let fetches: Vec<InstId> = p
        .before
        .iter()
        .copied()
        .filter(|&i| matches!(func.insts[i].op, Op::ScratchFetch { .. }))
        .collect();
    if fetches.is_empty() {
        return None;
    }
    let mut b = Builder { func };
    // The prologue cloned into `blk` for round `it`; with `in_range`, each fetch's first
    // tile index becomes -1 where it is false.
    let clone_prologue = |b: &mut Builder,
                          blk: &mut Block,
                          it: ValueId,
                          in_range: Option<ValueId>| {
        let mut memo: HashMap<ValueId, ValueId> = HashMap::new();
        let mut mapped: HashMap<ValueId, ValueId> = HashMap::new();
        let minus1 = in_range.map(|_| {
            b.inst(
                blk,
                Op::Const(Scalar::Int(-1, DType::I32)),
                vec![i32t.clone()],
                span,
            )[0]
        });
        for &i in &p.before {
            let mut op = b.func.insts[i].op.clone();
            let ispan = b.func.insts[i].span;
            let mut ops = Vec::new();
            crate::ir::for_each_operand(&op, |&o| ops.push(o));
            let new_ops: Vec<ValueId> = ops
                .into_iter()
                .map(|o| match mapped.get(&o) {
                    Some(&m) => m,
                    None => clone_chain(b, blk, o, iv, it, &def, &mut memo),
                })
                .collect();
            let mut k = 0;
            crate::ir::for_each_operand_mut(&mut op, |slot| {
                *slot = new_ops[k];
                k += 1;
            });
            if let (Op::ScratchFetch { index, .. }, Some(ok), Some(m1)) =
                (&mut op, in_range, minus1)
            {
                if let Some(first) = index.first_mut() {
                    *first = b.inst(blk, Op::Select(ok, *first, m1), vec![i32t.clone()], ispan)[0];
                }
            }
            let old = b.func.insts[i].results.clone();
            let tys: Vec<ValueType> = old.iter().map(|&r| b.func.value_type(r).clone()).collect();
            let new = b.inst(blk, op, tys, ispan);
            for (o, n) in old.into_iter().zip(new) {
                mapped.insert(o, n);
            }
        }
    };
    // The first round's prologue, before the outer loop.
    let mut before = Block::default();
    clone_prologue(&mut b, &mut before, lower, None);
    // The next round's, at the end of the round.
    let mut next = Block::default();
    let nxt = b.inst(
        &mut next,
        Op::Binary(crate::ir::BinaryOp::Add, iv, step),
        vec![i32t.clone()],
        span,
    )[0];
    let ok = b.inst(
        &mut next,
        Op::Compare(CmpOp::Lt, nxt, upper),
        vec![boolt],
        span,
    )[0];
    clone_prologue(&mut b, &mut next, nxt, Some(ok));
    let mut after = Block::default();
    b.inst(&mut after, Op::ScratchWait { pending: 0 }, vec![], span);
    // The original prologue's fetches go (its index arithmetic is left to DCE; its
    // other values, the loop's initial slot among them, stay).
    let func = b.func;
    if let Op::For { body, .. } = &mut func.insts[outer].op {
        let mut insts: Vec<InstId> = Vec::with_capacity(body.insts.len() + next.insts.len());
        for (k, &i) in body.insts.iter().enumerate() {
            if k == at {
                insts.extend(next.insts.iter().copied());
            }
            if !(in_prologue.contains(&i) && fetches.contains(&i)) {
                insts.push(i);
            }
        }
        if at == body.insts.len() {
            insts.extend(next.insts.iter().copied());
        }
        body.insts = insts;
    }
    Some((before.insts, after.insts))
}
