//! Which values, and which instructions' control, are alike across a set of blocks: the
//! one block-uniformity analysis that the checker and the back end share. Over the whole
//! grid it says where a `grid_sync` may be reached differently by different blocks (a
//! hang: E0701, `check/uniform.rs`); over the blocks of a thread-block cluster, which
//! tile fetches are alike in both blocks of a pair and may be multicast
//! (`back/ptx/tma.rs`).
//!
//! Assumes: `body` is valid SSA whose regions see their parents' values (the checker runs
//! the analysis on a body not yet attached to `func`). `Scope::Cluster(c)`: the kernel
//! runs in clusters of `c` consecutive blocks along grid axis 0 (`cluster_rank(c)`), so
//! the blocks of one cluster have `bid(0)` in `k c .. (k + 1) c` and equal `bid(1)`,
//! `bid(2)`.
//!
//! Guarantees (conservative): a value marked uniform has the same value in every block
//! of the scope on every execution that reaches it; an instruction under uniform control
//! is reached the same number of times, in the same order, by every block of the scope,
//! and for one that is not, [`Uniformity::divergence`] names the innermost `if` or `for`
//! that may run differently. The rules:
//! - constants, scalar parameters, tensor extents and strides and `num_bids` are uniform;
//!   `cluster_rank` is not; `bid(0)` is not; `bid(1)` and `bid(2)` are in a cluster and
//!   not in the grid; in a cluster of `c` blocks `bid(0) / d` is, for a constant `d`
//!   that `c` divides (the cluster's index, scaled down);
//! - what an op reads from memory (global or scratch) or exchanges between blocks is not
//!   (another block may write the memory); any other op's results are uniform when all
//!   its operands are (`ir::props` says which ops read or exchange);
//! - inside a loop under uniform control, the induction variable is uniform when its
//!   start and step are, and a loop-carried value when its initial value and what the
//!   body yields for it are, found as a fixpoint from above (the carried values assumed
//!   uniform until the body shows otherwise: each round only removes); every block that
//!   runs an iteration agrees on them, whatever its trip count (the body is under
//!   divergent control when the bounds differ); the loop's results are uniform when its
//!   carried values are and so are its bounds; an `if`'s results are uniform when its
//!   condition and both yields are, under uniform control;
//! - control is uniform at the top level, and inside an `if` whose condition, or a `for`
//!   whose bounds and step, are uniform, under uniform control.

use super::{BinaryOp, Block, Function, InstId, Op, ValueId};
use crate::span::Span;
use crate::types::Scalar;
use std::collections::HashMap;

/// The blocks a value or a control path must be alike across.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every block of the grid.
    Grid,
    /// The blocks of one thread-block cluster of this many consecutive blocks along
    /// grid axis 0.
    Cluster(u32),
}

/// The region that makes an instruction's control differ between blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Divergence {
    /// An `if` whose condition may differ.
    If(Span),
    /// A `for` whose bounds or step may differ.
    For(Span),
}

/// The analysis result (module docs).
#[derive(Clone, Debug, Default)]
pub struct Uniformity {
    value: Vec<bool>,
    /// The innermost divergent region around each instruction (`None`: uniform control).
    control: HashMap<InstId, Option<Divergence>>,
}

impl Uniformity {
    /// Whether `v` is the same in every block of the scope.
    pub fn value(&self, v: ValueId) -> bool {
        self.value.get(v.index()).copied().unwrap_or(false)
    }

    /// Whether every block of the scope executes `inst` alike (same count and order).
    pub fn control(&self, inst: InstId) -> bool {
        matches!(self.control.get(&inst), Some(None))
    }

    /// The innermost `if` or `for` around `inst` that may run differently in different
    /// blocks (`None` under uniform control, or for an instruction never visited).
    pub fn divergence(&self, inst: InstId) -> Option<Divergence> {
        self.control.get(&inst).copied().flatten()
    }
}

/// Runs the analysis over `body` (usually `func.body`) for `scope` (module docs).
pub fn analyze(func: &Function, body: &Block, scope: Scope) -> Uniformity {
    let mut a = Analysis {
        func,
        scope,
        out: Uniformity {
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
    a.block(body, None);
    a.out
}

struct Analysis<'a> {
    func: &'a Function,
    scope: Scope,
    out: Uniformity,
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
        let i = v.index();
        if i >= self.out.value.len() {
            self.out.value.resize(i + 1, false);
        }
        self.out.value[i] = u;
    }

    fn block(&mut self, b: &Block, div: Option<Divergence>) {
        for &id in &b.insts {
            self.inst(id, div);
        }
    }

    /// `bid(0) / d` with `d` a constant multiple of the cluster size.
    fn cluster_index(&self, x: ValueId, d: ValueId) -> bool {
        let Scope::Cluster(c) = self.scope else {
            return false;
        };
        self.bid0.contains(&x)
            && self
                .consts
                .get(&d)
                .is_some_and(|&d| d > 0 && d % c as i64 == 0)
    }

    fn inst(&mut self, id: InstId, div: Option<Divergence>) {
        let func = self.func;
        let inst = &func.insts[id];
        self.out.control.insert(id, div);
        let u = match &inst.op {
            Op::ProgramId(axis) => {
                if *axis == 0 {
                    self.bid0.extend(inst.results.iter().copied());
                }
                *axis != 0 && matches!(self.scope, Scope::Cluster(_))
            }
            Op::ClusterRank(_) => false,
            Op::Binary(BinaryOp::Div, x, d) if self.cluster_index(*x, *d) => true,
            Op::For {
                lower,
                upper,
                step,
                inits,
                body,
            } => {
                let bounds = self.uni(*lower) && self.uni(*upper) && self.uni(*step);
                let inner = if bounds {
                    div
                } else {
                    Some(Divergence::For(inst.span))
                };
                // Inside the body, the blocks that run an iteration agree on the induction
                // variable and the carried values even when their trip counts differ (the
                // body is then under divergent control: the loop is where it diverges).
                let alike = div.is_none() && self.uni(*lower) && self.uni(*step);
                if let Some(&iv) = body.args.first() {
                    self.set(iv, alike);
                }
                let mut carried: Vec<bool> = inits
                    .iter()
                    .map(|&v| div.is_none() && self.uni(v))
                    .collect();
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
                    self.set(r, u && inner.is_none());
                }
                return;
            }
            Op::If {
                cond,
                then_body,
                else_body,
            } => {
                let inner = if self.uni(*cond) {
                    div
                } else {
                    Some(Divergence::If(inst.span))
                };
                self.block(then_body, inner);
                self.block(else_body, inner);
                let (ty, ey) = (yielded(func, then_body), yielded(func, else_body));
                for (i, &r) in inst.results.iter().enumerate() {
                    let both = ty.get(i).is_some_and(|&v| self.uni(v))
                        && ey.get(i).is_some_and(|&v| self.uni(v));
                    self.set(r, inner.is_none() && both);
                }
                return;
            }
            op => {
                let e = super::props::props(op).effects;
                !e.reads_memory && !e.exchanges && super::operands(op).iter().all(|&v| self.uni(v))
            }
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
    fn load_indices(f: &Function, u: &Uniformity) -> Vec<Vec<bool>> {
        let mut out = Vec::new();
        crate::ir::visit_insts(f, vec![&f.body], |op| {
            if let Op::Load { index, .. } = op {
                out.push(index.iter().map(|&v| u.value(v)).collect());
            }
        });
        out
    }

    const PAIRS: &str = "kernel k(a: tensor<f32, 2, contiguous>, c: tensor<f32, 2, contiguous>) {
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
        }";

    #[test]
    fn the_cluster_index_and_what_it_computes_are_uniform() {
        let f = ir(PAIRS);
        let u = analyze(&f, &f.body, Scope::Cluster(2));
        assert_eq!(
            load_indices(&f, &u),
            vec![vec![true, true], vec![false, true], vec![true, false]]
        );
    }

    /// Across the whole grid no block index is uniform, scaled or not.
    #[test]
    fn across_the_grid_no_block_index_is_uniform() {
        let f = ir(PAIRS);
        let u = analyze(&f, &f.body, Scope::Grid);
        assert_eq!(
            load_indices(&f, &u),
            vec![vec![false, true], vec![false, true], vec![false, false]]
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
        let u = analyze(&f, &f.body, Scope::Cluster(2));
        let mut loads = Vec::new();
        let mut kinds = Vec::new();
        for (id, inst) in f.insts.iter() {
            if let Op::Load { index, .. } = &inst.op {
                loads.push((u.control(id), u.value(index[1])));
                kinds.push(match u.divergence(id) {
                    None => "uniform",
                    Some(Divergence::For(_)) => "for",
                    Some(Divergence::If(_)) => "if",
                });
            }
        }
        // Inside the loop with a per-block trip count: not the control (the induction
        // variable is: the blocks that run an iteration agree on it); under `r == 0`: not
        // the control; under `pair > 3`: both.
        loads.sort();
        assert_eq!(loads, vec![(false, true), (false, true), (true, true)]);
        kinds.sort();
        assert_eq!(kinds, vec!["for", "if", "uniform"]);
    }

    /// A value carried around a loop is uniform until a block-dependent value reaches it,
    /// however many rounds that takes, and not after a loop of per-block trip counts.
    #[test]
    fn loop_carried_values_reach_a_fixpoint() {
        let f = ir(
            "kernel k(a: tensor<f32, 2, contiguous>, c: tensor<f32, 2, contiguous>) {
            let mut x = 0;
            let mut y = 0;
            let mut z = 0;
            for i in 0..4 {
                z = y;
                y = x;
                x = bid(0);
            }
            let mut s = 0;
            for i in 0..4 {
                s = s + i;
            }
            let mut t = 0;
            for i in 0..bid(0) {
                t = t + 1;
            }
            store(c, [z, s], load(a, [0, 0], [16, 16]));
            store(c, [t, 0], load(a, [0, 0], [16, 16]));
        }",
        );
        let u = analyze(&f, &f.body, Scope::Grid);
        let mut idx = Vec::new();
        crate::ir::visit_insts(&f, vec![&f.body], |op| {
            if let Op::Store { index, .. } = op {
                idx.extend(index.iter().map(|&v| u.value(v)));
            }
        });
        // `t` after a loop whose trip count differs between blocks differs too.
        assert_eq!(idx, vec![false, true, false, true]);
    }
}
