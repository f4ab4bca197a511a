//! Chained products: which `dot`s produce another `dot`'s left operand through
//! element-wise work only (attention's `S = Q·Kᵀ` → `P = exp(S - m)` → `P·V`).
//!
//! Assumes: valid IR. Guarantees: [`producing_dots`] follows same-shape element-wise
//! ops (casts, unary and binary ops, selects, FMAs) and the results of `if`s (into what
//! each branch yields) and loop-carried values (into their initial value and what the
//! body yields for them: scores computed one iteration ahead) back from a value, and
//! lists the `dot`s it reaches; it never crosses a shape change, a reduction or a
//! memory op.

use super::{Function, InstId, Op, ValueId};
use std::collections::{HashMap, HashSet};

/// The instruction defining each value of `func`.
pub fn definitions(func: &Function) -> HashMap<ValueId, InstId> {
    definitions_in(func, &func.body)
}

/// The instruction defining each value of `block` and its regions.
pub fn definitions_in(func: &Function, block: &super::Block) -> HashMap<ValueId, InstId> {
    fn walk(func: &Function, block: &super::Block, defs: &mut HashMap<ValueId, InstId>) {
        for &i in &block.insts {
            for &r in &func.insts[i].results {
                defs.insert(r, i);
            }
            for r in super::regions(&func.insts[i].op) {
                walk(func, r, defs);
            }
        }
    }
    let mut defs = HashMap::new();
    walk(func, block, &mut defs);
    defs
}

/// The `dot`s whose results reach `v` (module docs).
pub fn producing_dots(func: &Function, defs: &HashMap<ValueId, InstId>, v: ValueId) -> Vec<InstId> {
    let shape = super::shape_of(func.value_type(v)).to_vec();
    // Loop-carried arguments: (initial value, yielded value).
    let mut carried: HashMap<ValueId, (ValueId, Option<ValueId>)> = HashMap::new();
    for inst in defs.values().map(|&i| &func.insts[i]) {
        if let Op::For { inits, body, .. } = &inst.op {
            let yields = body.insts.last().and_then(|&y| match &func.insts[y].op {
                Op::Yield(vs) => Some(vs.clone()),
                _ => None,
            });
            for (k, (&arg, &init)) in body.args.iter().skip(1).zip(inits).enumerate() {
                let y = yields.as_ref().and_then(|vs| vs.get(k).copied());
                carried.insert(arg, (init, y));
            }
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) || super::shape_of(func.value_type(x)) != shape.as_slice() {
            continue;
        }
        if let Some(&(init, y)) = carried.get(&x) {
            stack.push(init);
            stack.extend(y);
            continue;
        }
        let Some(&d) = defs.get(&x) else {
            continue;
        };
        match &func.insts[d].op {
            Op::Dot { .. } => out.push(d),
            Op::Cast(a) | Op::Unary(_, a) => stack.push(*a),
            Op::Binary(_, a, b) | Op::Select(_, a, b) => stack.extend([*a, *b]),
            Op::Fma(a, b, c) => stack.extend([*a, *b, *c]),
            // A value chosen by a branch: what either branch yields for it (a mask
            // applied only to the blocks that need one).
            Op::If {
                then_body,
                else_body,
                ..
            } => {
                let k = func.insts[d].results.iter().position(|&r| r == x);
                for b in [then_body, else_body] {
                    let yielded = b.insts.last().and_then(|&y| match &func.insts[y].op {
                        Op::Yield(vs) => k.and_then(|k| vs.get(k).copied()),
                        _ => None,
                    });
                    stack.extend(yielded);
                }
            }
            _ => {}
        }
    }
    out
}
