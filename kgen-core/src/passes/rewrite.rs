//! Shared helpers for passes: mutable operand access and use replacement.

use crate::ir::{Block, Function, InstId, Op, ValueId};
use std::collections::HashMap;

/// Every operand slot of an op (not inside its regions), mutably.
pub(super) fn operands_mut(op: &mut Op) -> Vec<&mut ValueId> {
    match op {
        Op::Const(_)
        | Op::ProgramId(_)
        | Op::NumPrograms(_)
        | Op::ScalarParam(_)
        | Op::TensorDim { .. }
        | Op::TensorStride { .. }
        | Op::Arange { .. } => vec![],
        Op::Splat(v)
        | Op::Broadcast(v)
        | Op::Reshape(v)
        | Op::ExpandDims(v, _)
        | Op::Permute(v, _)
        | Op::Unary(_, v)
        | Op::Cast(v)
        | Op::Reduce { value: v, .. }
        | Op::Scan { value: v, .. }
        | Op::ClusterGather { value: v, .. }
        | Op::ScratchLoad { slot: v, .. } => vec![v],
        Op::ScratchStore { slot, value, .. } => vec![slot, value],
        Op::ScratchFetch { slot, index, .. } => {
            std::iter::once(slot).chain(index.iter_mut()).collect()
        }
        Op::ScratchGather {
            slot,
            offsets,
            mask,
            ..
        } => std::iter::once(slot)
            .chain(offsets.iter_mut())
            .chain(mask.iter_mut())
            .collect(),
        Op::ScratchWait { .. } | Op::GridDependency(_) | Op::Barrier => vec![],
        Op::Binary(_, a, b) | Op::Compare(_, a, b) => vec![a, b],
        Op::Select(a, b, c) | Op::Fma(a, b, c) => vec![a, b, c],
        Op::Dot { a, b, acc } => vec![a, b, acc],
        Op::Load { index, .. } => index.iter_mut().collect(),
        Op::Store { index, value, .. } => index.iter_mut().chain(std::iter::once(value)).collect(),
        Op::Gather { offsets, mask, .. } => offsets.iter_mut().chain(mask.iter_mut()).collect(),
        Op::Scatter {
            offsets,
            value,
            mask,
            ..
        }
        | Op::AtomicAdd {
            offsets,
            value,
            mask,
            ..
        } => offsets
            .iter_mut()
            .chain(std::iter::once(value))
            .chain(mask.iter_mut())
            .collect(),
        Op::For {
            lower,
            upper,
            step,
            inits,
            ..
        } => {
            let mut v = vec![lower, upper, step];
            v.extend(inits.iter_mut());
            v
        }
        Op::If { cond, .. } => vec![cond],
        Op::Yield(vs) => vs.iter_mut().collect(),
    }
}

/// The regions of an op.
pub(super) fn regions(op: &Op) -> Vec<&Block> {
    match op {
        Op::For { body, .. } => vec![body],
        Op::If {
            then_body,
            else_body,
            ..
        } => vec![then_body, else_body],
        _ => vec![],
    }
}

/// Every instruction id in a block, nested regions included, in program order.
pub(super) fn all_insts(func: &Function, block: &Block, out: &mut Vec<InstId>) {
    for &id in &block.insts {
        out.push(id);
        if let Some(inst) = func.insts.get(id) {
            for r in regions(&inst.op) {
                all_insts(func, r, out);
            }
        }
    }
}

/// Replaces every use of a key of `map` by its value, everywhere in the function.
pub(super) fn replace_uses(func: &mut Function, map: &HashMap<ValueId, ValueId>) {
    if map.is_empty() {
        return;
    }
    let mut ids = Vec::new();
    all_insts(func, &func.body, &mut ids);
    for id in ids {
        for slot in operands_mut(&mut func.insts[id].op) {
            let mut v = *slot;
            // Follow chains (a → b → c) so a replacement never points at a removed value.
            while let Some(&n) = map.get(&v) {
                if n == v {
                    break;
                }
                v = n;
            }
            *slot = v;
        }
    }
}
