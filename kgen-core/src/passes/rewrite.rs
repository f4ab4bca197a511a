//! Shared helpers for passes: instruction walks and use replacement (operands and
//! regions come from the op table, `ir::props`).

pub(super) use crate::ir::regions;
use crate::ir::{Block, Function, InstId, ValueId};
use std::collections::HashMap;

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
        crate::ir::for_each_operand_mut(&mut func.insts[id].op, |slot| {
            let mut v = *slot;
            // Follow chains (a → b → c) so a replacement never points at a removed value.
            while let Some(&n) = map.get(&v) {
                if n == v {
                    break;
                }
                v = n;
            }
            *slot = v;
        });
    }
}
