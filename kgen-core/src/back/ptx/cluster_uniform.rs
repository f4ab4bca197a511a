//! Which values, and which instructions' control, are the same in every block of a
//! thread-block cluster: the fact that lets a tile fetch be multicast (each block of a
//! cluster copies a share of the tile into every block's shared memory).
//!
//! Assumes: `func` is valid IR whose kernel runs in clusters of `cluster` consecutive
//! blocks along grid axis 0 (`cluster_rank(cluster)`), so the blocks of one cluster have
//! `bid(0)` in `c * cluster .. (c + 1) * cluster` and equal `bid(1)`, `bid(2)`.
//!
//! Guarantees: a value marked uniform has the same value in every block of a cluster on
//! every execution that reaches it, and an instruction marked as under uniform control
//! is reached the same number of times, in the same order, by every block of a cluster.
//! The rules are conservative:
//! - constants, scalar parameters, tensor extents and strides, `num_bids`, `bid(1)` and
//!   `bid(2)` are uniform; so is `bid(0) / d` for a constant `d` that `cluster` divides
//!   (the cluster's index scaled down), and anything computed from uniform values by
//!   element-wise, shape, reduction or scan ops;
//! - `bid(0)`, `cluster_rank`, every memory read (another block may write the memory) and
//!   cluster exchanges are not;
//! - a loop's induction variable is uniform when its bounds and step are, under uniform
//!   control; a loop-carried value (the pipeline's slot counter) when its initial value
//!   is and the value the body yields for it is, assuming the carried values uniform
//!   until the body shows otherwise (a fixpoint from above: each round only removes);
//!   the loop's results are its carried values; an `if`'s results are uniform when its
//!   condition and both yields are;
//! - control is uniform at the kernel's top level, and inside a region whose loop
//!   bounds (or `if` condition) are uniform, under uniform control.

use crate::ir::{BinaryOp, Block, Function, InstId, Op, ValueId};
use crate::types::Scalar;
use std::collections::HashMap;

/// The analysis result: per value and per instruction.
#[derive(Clone, Debug, Default)]
pub struct ClusterUniform {
    value: Vec<bool>,
    control: HashMap<InstId, bool>,
}

impl ClusterUniform {
    /// Whether `v` is the same in every block of a cluster.
    pub fn value(&self, v: ValueId) -> bool {
        self.value.get(v.index()).copied().unwrap_or(false)
    }

    /// Whether every block of a cluster executes `inst` alike (same count and order).
    pub fn control(&self, inst: InstId) -> bool {
        self.control.get(&inst).copied().unwrap_or(false)
    }
}

/// Runs the analysis (module docs).
pub fn analyze(func: &Function, cluster: u32) -> ClusterUniform {
    let mut a = Analysis {
        func,
        cluster,
        out: ClusterUniform {
            value: vec![false; func.values.len()],
            control: HashMap::new(),
        },
        bid0: Vec::new(),
        consts: func
            .insts
            .iter()
            .filter_map(|(_, inst)| match (&inst.op, inst.results.first()) {
                (Op::Const(Scalar::Int(c, _)), Some(&r)) => Some((r, *c)),
                _ => None,
            })
            .collect(),
    };
    a.block(&func.body, true);
    a.out
}

struct Analysis<'a> {
    func: &'a Function,
    cluster: u32,
    out: ClusterUniform,
    /// Results of `bid(0)`.
    bid0: Vec<ValueId>,
    /// Integer constants.
    consts: HashMap<ValueId, i64>,
}

impl Analysis<'_> {
    fn uni(&self, v: ValueId) -> bool {
        self.out.value(v)
    }

    fn set(&mut self, v: ValueId, u: bool) {
        if let Some(x) = self.out.value.get_mut(v.index()) {
            *x = u;
        }
    }

    /// The constant integer `v` holds, if it is one.
    fn const_int(&self, v: ValueId) -> Option<i64> {
        self.consts.get(&v).copied()
    }

    fn block(&mut self, b: &Block, control: bool) {
        for &id in &b.insts {
            self.inst(id, control);
        }
    }

    fn inst(&mut self, id: InstId, control: bool) {
        let func = self.func;
        let inst = &func.insts[id];
        self.out.control.insert(id, control);
        let all = |s: &Self| crate::ir::operands(&inst.op).iter().all(|&v| s.uni(v));
        let u = match &inst.op {
            Op::Const(_) | Op::Arange { .. } => true,
            Op::ScalarParam(_)
            | Op::TensorDim { .. }
            | Op::TensorStride { .. }
            | Op::NumPrograms(_) => true,
            Op::ProgramId(0) => {
                self.bid0.extend(inst.results.iter().copied());
                false
            }
            Op::ProgramId(_) => true,
            Op::ClusterRank(_) => false,
            Op::Binary(BinaryOp::Div, x, d) if self.bid0.contains(x) => self
                .const_int(*d)
                .is_some_and(|d| d > 0 && d % self.cluster as i64 == 0),
            Op::Splat(_)
            | Op::Unary(..)
            | Op::Binary(..)
            | Op::Compare(..)
            | Op::Select(..)
            | Op::Fma(..)
            | Op::Cast(_)
            | Op::Broadcast(_)
            | Op::Reshape(_)
            | Op::ExpandDims(..)
            | Op::Permute(..)
            | Op::Reduce { .. }
            | Op::Scan { .. } => all(self),
            Op::For {
                lower,
                upper,
                step,
                inits,
                body,
            } => {
                let inner = control && self.uni(*lower) && self.uni(*upper) && self.uni(*step);
                if let Some(&iv) = body.args.first() {
                    self.set(iv, inner);
                }
                let mut carried: Vec<bool> = inits.iter().map(|&v| inner && self.uni(v)).collect();
                loop {
                    for (&c, &u) in body.args.iter().skip(1).zip(&carried) {
                        self.set(c, u);
                    }
                    self.block(body, inner);
                    let yields = yielded(func, body);
                    let next: Vec<bool> = carried
                        .iter()
                        .enumerate()
                        .map(|(i, &u)| u && yields.get(i).is_some_and(|&v| self.uni(v)))
                        .collect();
                    if next == carried {
                        break;
                    }
                    carried = next;
                }
                for (&r, &u) in inst.results.iter().zip(&carried) {
                    self.set(r, u);
                }
                return;
            }
            Op::If {
                cond,
                then_body,
                else_body,
            } => {
                let inner = control && self.uni(*cond);
                self.block(then_body, inner);
                self.block(else_body, inner);
                let (ty, ey) = (yielded(func, then_body), yielded(func, else_body));
                for (i, &r) in inst.results.iter().enumerate() {
                    let both = ty.get(i).is_some_and(|&v| self.uni(v))
                        && ey.get(i).is_some_and(|&v| self.uni(v));
                    self.set(r, inner && both);
                }
                return;
            }
            _ => false,
        };
        for &r in &inst.results {
            self.set(r, u);
        }
    }
}

/// The values block `b` yields (its final `Yield`), if any.
fn yielded(func: &Function, b: &Block) -> Vec<ValueId> {
    b.insts
        .last()
        .map(|&y| match &func.insts[y].op {
            Op::Yield(vs) => vs.clone(),
            _ => Vec::new(),
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compile_to_ir, Arch, CompileOptions, SourceFile};

    fn ir(src: &str) -> Function {
        let f = SourceFile::new("u.kg", src);
        compile_to_ir(&f, &CompileOptions::new(Arch::Sm90a))
            .unwrap_or_else(|d| panic!("{}", d.render(&f)))
            .0
    }

    /// The tile indices of the kernel's loads, with whether each is uniform.
    fn load_indices(f: &Function, u: &ClusterUniform) -> Vec<Vec<bool>> {
        let mut out = Vec::new();
        crate::ir::visit_insts(f, vec![&f.body], |op| {
            if let Op::Load { index, .. } = op {
                out.push(index.iter().map(|&v| u.value(v)).collect());
            }
        });
        out
    }

    #[test]
    fn the_cluster_index_and_what_it_computes_are_uniform() {
        let f = ir(
            "kernel k(a: tensor<f32, 2, contiguous>, c: tensor<f32, 2, contiguous>) {
            let r = cluster_rank(2);
            let pair = bid(0) / 2;
            let quad = bid(0) / 4;
            let odd = bid(0) / 3;
            let pm = 2 * pair + r;
            for kt in 0..cdiv(shape(a, 1), 16) {
                let t = load(a, [pair + bid(1), kt], [16, 16]);
                let v = load(a, [pm, kt], [16, 16]);
                let w = load(a, [quad, odd], [16, 16]);
                store(c, [pair, kt], t + v + w);
            }
        }",
        );
        let u = analyze(&f, 2);
        assert_eq!(
            load_indices(&f, &u),
            vec![vec![true, true], vec![false, true], vec![true, false]]
        );
    }

    #[test]
    fn non_uniform_bounds_and_conditions_make_control_non_uniform() {
        let f = ir(
            "kernel k(a: tensor<f32, 2, contiguous>, c: tensor<f32, 2, contiguous>) {
            let r = cluster_rank(2);
            let pair = bid(0) / 2;
            for kt in 0..(bid(0) + 1) {
                store(c, [pair, kt], load(a, [pair, kt], [16, 16]));
            }
            if r == 0 {
                store(c, [pair, 0], load(a, [pair, 1], [16, 16]));
            }
            if pair > 3 {
                store(c, [pair, 2], load(a, [pair, 2], [16, 16]));
            }
        }",
        );
        let u = analyze(&f, 2);
        let mut loads = Vec::new();
        for (id, inst) in f.insts.iter() {
            if let Op::Load { index, .. } = &inst.op {
                loads.push((u.control(id), u.value(index[1])));
            }
        }
        // Inside the loop with a per-block trip count: neither the control nor the
        // induction variable; under `r == 0`: not the control; under `pair > 3`: both.
        loads.sort();
        assert_eq!(loads, vec![(false, false), (false, true), (true, true)]);
    }
}
