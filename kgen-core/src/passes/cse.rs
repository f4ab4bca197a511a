//! Common-subexpression elimination.
//!
//! Assumes: valid IR. Guarantees: a pure instruction (`ir::props(..).is_pure()`: no effect)
//! identical to an earlier one whose result is visible at its position is removed and its
//! uses point at the earlier result. Loads are not merged (a store may come between).

use super::rewrite::{regions, replace_uses};
use crate::ir::{Block, Function, Op, ValueId};
use std::collections::HashMap;

pub(super) fn run(func: &mut Function) {
    let mut replace = HashMap::new();
    let body = std::mem::take(&mut func.body);
    let mut scopes: Vec<HashMap<String, ValueId>> = vec![HashMap::new()];
    let body = visit(func, body, &mut scopes, &mut replace);
    func.body = body;
    replace_uses(func, &replace);
}

fn visit(
    func: &mut Function,
    mut block: Block,
    scopes: &mut Vec<HashMap<String, ValueId>>,
    replace: &mut HashMap<ValueId, ValueId>,
) -> Block {
    let mut kept = Vec::with_capacity(block.insts.len());
    for id in std::mem::take(&mut block.insts) {
        // Apply replacements found so far, so keys see canonical operands.
        let mut op = func.insts[id].op.clone();
        crate::ir::for_each_operand_mut(&mut op, |slot| {
            if let Some(&n) = replace.get(slot) {
                *slot = n;
            }
        });
        func.insts[id].op = op;
        let inst = &func.insts[id];
        if crate::ir::props(&inst.op).is_pure() && inst.results.len() == 1 {
            let result = inst.results[0];
            let key = format!("{:?}|{}", inst.op, func.values[result].ty);
            if let Some(&prev) = scopes.iter().rev().find_map(|s| s.get(&key)) {
                replace.insert(result, prev);
                continue;
            }
            if let Some(s) = scopes.last_mut() {
                s.insert(key, result);
            }
        }
        if !regions(&func.insts[id].op).is_empty() {
            let mut op = func.insts[id].op.clone();
            match &mut op {
                Op::For { body, .. } => {
                    scopes.push(HashMap::new());
                    *body = visit(func, std::mem::take(body), scopes, replace);
                    scopes.pop();
                }
                Op::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    for b in [then_body, else_body] {
                        scopes.push(HashMap::new());
                        *b = visit(func, std::mem::take(b), scopes, replace);
                        scopes.pop();
                    }
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
