//! Whether every block reaches each `grid_sync` alike.
//!
//! Assumes: `body` is the lowered kernel body (valid SSA; regions see their parents'
//! values). Guarantees: reports (E0701) every `grid_sync` inside an `if` whose condition,
//! or a `for` whose bounds, may differ between the blocks of the grid, since a block that
//! skips or repeats one leaves the others waiting forever. A value may differ between
//! blocks when it comes from `bid`, `cluster_rank`, memory (a load, gather, atomic or
//! scratch read) or from any such value, through operations and the regions' yields
//! (loop-carried values to a fixpoint). Constants, parameters, tensor extents and
//! strides, and `num_bids` are the same in every block.

use crate::diag::{Diagnostic, ErrorCode};
use crate::ir::{Block, Function, Op, ValueId};
use crate::span::Span;
use std::collections::HashSet;

/// The E0701 diagnostics for `grid_sync`s under block-dependent control flow.
pub(super) fn grid_sync_errors(func: &Function, body: &Block) -> Vec<Diagnostic> {
    // The body is not `func.body` yet while the checker runs: search it.
    let mut any = false;
    crate::ir::visit_insts(func, vec![body], |op| {
        any |= matches!(op, Op::GridSync { .. });
    });
    if !any {
        return Vec::new();
    }
    let mut u = Uniformity {
        func,
        varying: HashSet::new(),
        enclosing: Vec::new(),
        errors: Vec::new(),
    };
    u.block(body, true);
    u.errors
}

struct Uniformity<'f> {
    func: &'f Function,
    /// Values that may differ between blocks.
    varying: HashSet<ValueId>,
    /// The innermost block-dependent `if` / `for` around the instruction being visited:
    /// its span and what it is.
    enclosing: Vec<(Span, &'static str)>,
    errors: Vec<Diagnostic>,
}

impl Uniformity<'_> {
    fn varies(&self, v: &ValueId) -> bool {
        self.varying.contains(v)
    }

    fn mark(&mut self, v: ValueId, varies: bool) {
        if varies {
            self.varying.insert(v);
        }
    }

    /// The operands of `b`'s closing `yield`.
    fn yields(&self, b: &Block) -> Vec<ValueId> {
        match b.insts.last().map(|&i| &self.func.insts[i].op) {
            Some(Op::Yield(vals)) => vals.clone(),
            _ => Vec::new(),
        }
    }

    /// Visits `b`; `report`: record errors (off while a loop's fixpoint is sought).
    fn block(&mut self, b: &Block, report: bool) {
        for &id in &b.insts {
            let inst = &self.func.insts[id];
            match &inst.op {
                Op::For {
                    lower,
                    upper,
                    step,
                    inits,
                    body,
                } => {
                    let trip_varies = self.varies(lower) || self.varies(upper) || self.varies(step);
                    if let Some(&iv) = body.args.first() {
                        self.mark(iv, self.varies(lower) || self.varies(step));
                    }
                    for (k, init) in inits.iter().enumerate() {
                        if let Some(&arg) = body.args.get(k + 1) {
                            self.mark(arg, self.varies(init));
                        }
                    }
                    // Loop-carried values: grow the varying set until it stops changing.
                    loop {
                        let before = self.varying.len();
                        self.block(body, false);
                        for (k, y) in self.yields(body).iter().enumerate() {
                            if let Some(&arg) = body.args.get(k + 1) {
                                self.mark(arg, self.varies(y));
                            }
                        }
                        if self.varying.len() == before {
                            break;
                        }
                    }
                    if trip_varies {
                        self.enclosing.push((inst.span, "for"));
                    }
                    self.block(body, report);
                    if trip_varies {
                        self.enclosing.pop();
                    }
                    let ys = self.yields(body);
                    for (k, &r) in inst.results.iter().enumerate() {
                        let v = trip_varies
                            || body.args.get(k + 1).is_some_and(|a| self.varies(a))
                            || ys.get(k).is_some_and(|y| self.varies(y));
                        self.mark(r, v);
                    }
                }
                Op::If {
                    cond,
                    then_body,
                    else_body,
                } => {
                    let cond_varies = self.varies(cond);
                    if cond_varies {
                        self.enclosing.push((inst.span, "if"));
                    }
                    self.block(then_body, report);
                    self.block(else_body, report);
                    if cond_varies {
                        self.enclosing.pop();
                    }
                    let (ty, ey) = (self.yields(then_body), self.yields(else_body));
                    for (k, &r) in inst.results.iter().enumerate() {
                        let v = cond_varies
                            || ty.get(k).is_some_and(|y| self.varies(y))
                            || ey.get(k).is_some_and(|y| self.varies(y));
                        self.mark(r, v);
                    }
                }
                Op::GridSync { .. } => {
                    if let (true, Some(&(at, what))) = (report, self.enclosing.last()) {
                        self.errors.push(diverging(inst.span, at, what));
                    }
                }
                op => {
                    let source = matches!(
                        op,
                        Op::ProgramId(_)
                            | Op::ClusterRank(_)
                            | Op::ClusterGather { .. }
                            | Op::Load { .. }
                            | Op::Gather { .. }
                            | Op::AtomicAdd { .. }
                            | Op::ScratchLoad { .. }
                    );
                    let v = source || crate::ir::operands(op).iter().any(|o| self.varies(o));
                    for &r in &inst.results {
                        self.mark(r, v);
                    }
                }
            }
        }
    }
}

fn diverging(at: Span, around: Span, what: &str) -> Diagnostic {
    let (label, help) = if what == "if" {
        (
            "this condition may differ between blocks",
            "help: call `grid_sync` outside the `if`, in every block; keep only the work inside it",
        )
    } else {
        (
            "this loop's bounds may differ between blocks",
            "help: give the loop bounds every block computes alike (constants, parameters, `shape`, `num_bids`), and skip the work of the extra rounds inside it instead",
        )
    };
    Diagnostic::error(
        ErrorCode::BadControlFlow,
        at,
        if what == "if" {
            "`grid_sync` inside an `if` that may run differently in each block".to_string()
        } else {
            "`grid_sync` inside a `for` loop that may run differently in each block".to_string()
        },
    )
    .with_secondary(around, label)
    .with_note("every block must reach each `grid_sync` the same number of times, or the grid waits forever; values from `bid`, `cluster_rank` and memory may differ between blocks")
    .with_note(help)
}
