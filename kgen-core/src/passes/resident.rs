//! Loop-invariant operands of tensor-core products live in shared memory.
//!
//! A tile loaded once before a loop and multiplied in every iteration (attention's `Q`
//! block against each K/V block; the `K`/`V` block of attention's backward against each
//! query block) would otherwise stay in registers for the whole loop: a 16-bit
//! `[128, 128]` tile is 64 registers per thread on 8 warps, which with the loop's
//! accumulators does not fit. FlashAttention keeps such a tile in shared memory and reads
//! it with `ldmatrix` in each iteration, as it reads the tiles that stream through the
//! loop; this pass does the same:
//!
//! ```text
//! x = load(T, idx)                       (before the loop)
//! for ... { ... dot(x, ...) ... }
//! ```
//!
//! becomes
//!
//! ```text
//! scratch_fetch(buf, 0, T, idx); scratch_wait(0); x = scratch_load(buf, 0)
//! for ... { ... dot(x, ...) ... }
//! ```
//!
//! with `buf` a one-slot shared buffer (`ScratchBuf::shared`): the back end lays it out
//! swizzled for `ldmatrix` and the product reads it as a staged operand.
//!
//! Assumes: valid IR; `num_warps` is the block's warp count. A load is moved only when
//! its tensor is never written by the kernel; it is a 16-bit tile of rank 2, or of
//! higher rank with leading extents of 1 whose only use is a reshape to its last two
//! dimensions; every use of the tile is an operand of a tensor-core `dot` (directly or
//! through `transpose`) inside a loop that does not contain the load; and all such tiles
//! together take at most half the target's shared memory (the rest is left to the
//! pipeline's rings).
//! Guarantees: ordinary IR with the scratch ops' documented semantics (the interpreter
//! runs it); the fetch is waited for before the tile is read. Returns the bytes of
//! shared memory the buffers hold for their whole lives, which the pipeline must leave
//! free.

use super::pipeline::{mma_dot, PipelineOptions};
use crate::ir::{Block, Builder, Function, InstId, Op, ScratchBuf, ValueId};
use crate::types::{DType, Scalar, ValueType};
use std::collections::{HashMap, HashSet};

/// One tile to keep in shared memory.
struct Plan {
    /// The instruction whose result is the tile (the load, or the squeezing reshape).
    def: InstId,
    /// The load (equal to `def` when nothing is squeezed).
    load: InstId,
    shape: Vec<u32>,
    dtype: DType,
}

/// Runs the pass; returns the bytes of shared memory its buffers keep.
pub fn run(func: &mut Function, o: &PipelineOptions) -> u64 {
    let plans = find(func, o);
    if plans.is_empty() {
        return 0;
    }
    let mut bytes = 0;
    let mut by_load: HashMap<InstId, (Plan, u32)> = HashMap::new();
    for p in plans {
        let name = match &func.insts[p.load].op {
            Op::Load { tensor, .. } => func
                .params
                .get(*tensor as usize)
                .map(|x| x.name.clone())
                .unwrap_or_default(),
            _ => String::new(),
        };
        bytes += tile_bytes(&p.shape, p.dtype);
        func.scratch.push(ScratchBuf {
            name: format!("resident_{name}"),
            dtype: p.dtype,
            slots: 1,
            slot_shape: p.shape.clone(),
            span: func.insts[p.load].span,
            shared: true,
            lag: 0,
        });
        let buf = (func.scratch.len() - 1) as u32;
        by_load.insert(p.load, (p, buf));
    }
    let body = std::mem::take(&mut func.body);
    func.body = rewrite_block(func, body, &by_load);
    bytes
}

fn tile_bytes(shape: &[u32], dt: DType) -> u64 {
    shape
        .iter()
        .map(|&d| d.max(1).next_power_of_two() as u64)
        .product::<u64>()
        * dt.size_bytes() as u64
}

/// The tiles to move (module docs).
fn find(func: &Function, o: &PipelineOptions) -> Vec<Plan> {
    // Each instruction's enclosing loops, outermost first.
    let mut nest: HashMap<InstId, Vec<InstId>> = HashMap::new();
    fn walk(
        func: &Function,
        b: &Block,
        loops: &mut Vec<InstId>,
        nest: &mut HashMap<InstId, Vec<InstId>>,
    ) {
        for &i in &b.insts {
            nest.insert(i, loops.clone());
            match &func.insts[i].op {
                Op::For { body, .. } => {
                    loops.push(i);
                    walk(func, body, loops, nest);
                    loops.pop();
                }
                Op::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    walk(func, then_body, loops, nest);
                    walk(func, else_body, loops, nest);
                }
                _ => {}
            }
        }
    }
    walk(func, &func.body, &mut Vec::new(), &mut nest);
    let mut defs: HashMap<ValueId, InstId> = HashMap::new();
    let mut uses: HashMap<ValueId, Vec<InstId>> = HashMap::new();
    let mut written = HashSet::new();
    for (&i, _) in nest.iter() {
        let op = &func.insts[i].op;
        for &r in &func.insts[i].results {
            defs.insert(r, i);
        }
        for v in crate::ir::operands(op) {
            uses.entry(v).or_default().push(i);
        }
        if let Op::Store { tensor, .. }
        | Op::Scatter { tensor, .. }
        | Op::AtomicAdd { tensor, .. } = op
        {
            written.insert(*tensor);
        }
    }
    let tc_dot = |i: InstId| match func.insts[i].op {
        Op::Dot {
            a,
            b,
            acc,
            precision,
        } => mma_dot(func, a, b, acc, precision, o.num_warps),
        _ => false,
    };
    let is_transpose =
        |i: InstId| matches!(&func.insts[i].op, Op::Permute(_, p) if p.as_slice() == [1, 0]);
    // Every use of `v` is a tensor-core operand (through at most a transpose) in a loop
    // that does not hold `at`.
    let only_looped_operands = |v: ValueId, at: InstId| -> bool {
        let outer = nest.get(&at).cloned().unwrap_or_default();
        let looped = |u: InstId| {
            nest.get(&u)
                .is_some_and(|n| n.len() > outer.len() && n[..outer.len()] == outer[..])
        };
        let us = uses.get(&v).map(Vec::as_slice).unwrap_or(&[]);
        !us.is_empty()
            && us.iter().all(|&u| {
                if tc_dot(u) {
                    return looped(u);
                }
                if is_transpose(u) {
                    let t = func.insts[u].results[0];
                    let tus = uses.get(&t).map(Vec::as_slice).unwrap_or(&[]);
                    return !tus.is_empty() && tus.iter().all(|&w| tc_dot(w) && looped(w));
                }
                false
            })
    };
    let mut out = Vec::new();
    let mut total = 0u64;
    let mut order: Vec<InstId> = nest.keys().copied().collect();
    order.sort();
    for i in order {
        let Op::Load { tensor, .. } = &func.insts[i].op else {
            continue;
        };
        if written.contains(tensor) {
            continue;
        }
        let r = func.insts[i].results[0];
        let ty = func.value_type(r);
        if !matches!(ty.dtype(), DType::F16 | DType::BF16) {
            continue;
        }
        let shape = crate::ir::shape_of(ty).to_vec();
        let (def, v, shape2) = if shape.len() == 2 {
            (i, r, shape)
        } else {
            // A squeezing reshape as the one use.
            let us = uses.get(&r).map(Vec::as_slice).unwrap_or(&[]);
            let [u] = us else { continue };
            let Op::Reshape(_) = func.insts[*u].op else {
                continue;
            };
            let rr = func.insts[*u].results[0];
            let s2 = crate::ir::shape_of(func.value_type(rr)).to_vec();
            let n = shape.len();
            if n < 3
                || s2.len() != 2
                || shape[n - 2..] != s2[..]
                || shape[..n - 2].iter().any(|&d| d != 1)
            {
                continue;
            }
            (*u, rr, s2)
        };
        if !only_looped_operands(v, i) {
            continue;
        }
        let bytes = tile_bytes(&shape2, ty.dtype());
        if total + bytes > o.max_shared_bytes as u64 / 2 {
            continue;
        }
        total += bytes;
        out.push(Plan {
            def,
            load: i,
            shape: shape2,
            dtype: ty.dtype(),
        });
    }
    out
}

fn rewrite_block(func: &mut Function, block: Block, plans: &HashMap<InstId, (Plan, u32)>) -> Block {
    let mut out = Block {
        args: block.args.clone(),
        insts: Vec::with_capacity(block.insts.len()),
    };
    for &i in &block.insts {
        // Regions first.
        let mut op = func.insts[i].op.clone();
        match &mut op {
            Op::For { body, .. } => *body = rewrite_block(func, std::mem::take(body), plans),
            Op::If {
                then_body,
                else_body,
                ..
            } => {
                *then_body = rewrite_block(func, std::mem::take(then_body), plans);
                *else_body = rewrite_block(func, std::mem::take(else_body), plans);
            }
            _ => {}
        }
        func.insts[i].op = op;
        let Some((plan, buf)) = plans.get(&i) else {
            out.insts.push(i);
            continue;
        };
        let Op::Load {
            tensor,
            index,
            padding,
            eviction,
        } = func.insts[i].op.clone()
        else {
            out.insts.push(i);
            continue;
        };
        let span = func.insts[i].span;
        let mut b = Builder { func };
        let slot = b.inst(
            &mut out,
            Op::Const(Scalar::Int(0, DType::I32)),
            vec![ValueType::Scalar(DType::I32)],
            span,
        )[0];
        b.inst(
            &mut out,
            Op::ScratchFetch {
                buf: *buf,
                slot,
                tensor,
                index,
                padding,
                eviction,
            },
            vec![],
            span,
        );
        b.inst(&mut out, Op::ScratchWait { pending: 0 }, vec![], span);
        let func = b.func;
        func.insts[plan.def].op = Op::ScratchLoad { buf: *buf, slot };
        if plan.def == i {
            out.insts.push(i);
        }
        // Else the load is gone: the reshape after it (later in this block) reads the slot.
    }
    out
}
