//! Dead-code elimination.
//!
//! Assumes: valid IR. Guarantees: every remaining instruction is not removable
//! (`ir::props(..).is_removable()`: it writes, waits or holds a region) or has a used
//! result; iterates to a fixed point.

use super::rewrite::{all_insts, regions};
use crate::ir::{Block, Function, Op, ValueId};
use std::collections::HashSet;

pub(super) fn run(func: &mut Function) {
    loop {
        let mut used: HashSet<ValueId> = HashSet::new();
        let mut ids = Vec::new();
        all_insts(func, &func.body, &mut ids);
        for id in &ids {
            used.extend(crate::ir::operands(&func.insts[*id].op));
        }
        let before = ids.len();
        let body = std::mem::take(&mut func.body);
        func.body = prune(func, body, &used);
        let mut after = Vec::new();
        all_insts(func, &func.body, &mut after);
        if after.len() == before {
            break;
        }
    }
}

fn prune(func: &mut Function, mut block: Block, used: &HashSet<ValueId>) -> Block {
    let mut kept = Vec::with_capacity(block.insts.len());
    for id in std::mem::take(&mut block.insts) {
        let inst = &func.insts[id];
        let live = !crate::ir::props(&inst.op).is_removable()
            || inst.results.iter().any(|r| used.contains(r));
        if !live {
            continue;
        }
        if !regions(&inst.op).is_empty() {
            let mut op = func.insts[id].op.clone();
            match &mut op {
                Op::For { body, .. } => *body = prune(func, std::mem::take(body), used),
                Op::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    *then_body = prune(func, std::mem::take(then_body), used);
                    *else_body = prune(func, std::mem::take(else_body), used);
                }
                _ => {}
            }
            func.insts[id].op = op;
        }
        kept.push(id);
    }
    block.insts = kept;
    block
}
