//! Whether every block reaches each `grid_sync` alike.
//!
//! Assumes: `body` is the lowered kernel body (valid SSA; regions see their parents'
//! values). Guarantees: reports (E0701) every `grid_sync` inside an `if` whose condition,
//! or a `for` whose bounds, may differ between the blocks of the grid, since a block that
//! skips or repeats one leaves the others waiting forever. Which values may differ is
//! `ir::uniform`'s analysis over the grid: values from `bid`, `cluster_rank` and memory,
//! and whatever is computed from them (loop-carried values to a fixpoint); constants,
//! parameters, tensor extents and strides, and `num_bids` are the same in every block.

use crate::diag::{Diagnostic, ErrorCode};
use crate::ir::uniform::{analyze, Divergence, Scope};
use crate::ir::{Block, Function, Op};
use crate::span::Span;

/// The E0701 diagnostics for `grid_sync`s under block-dependent control flow.
pub(super) fn grid_sync_errors(func: &Function, body: &Block) -> Vec<Diagnostic> {
    // The body is not `func.body` yet while the checker runs: search it.
    let mut syncs = Vec::new();
    collect_syncs(func, body, &mut syncs);
    if syncs.is_empty() {
        return Vec::new();
    }
    let u = analyze(func, body, Scope::Grid);
    syncs
        .into_iter()
        .filter_map(|id| {
            let at = func.insts[id].span;
            match u.divergence(id)? {
                Divergence::If(around) => Some(diverging(at, around, "if")),
                Divergence::For(around) => Some(diverging(at, around, "for")),
            }
        })
        .collect()
}

/// The `grid_sync` instructions in `b` and its regions, in program order.
fn collect_syncs(func: &Function, b: &Block, out: &mut Vec<crate::ir::InstId>) {
    for &id in &b.insts {
        let op = &func.insts[id].op;
        if matches!(op, Op::GridSync { .. }) {
            out.push(id);
        }
        for r in crate::ir::regions(op) {
            collect_syncs(func, r, out);
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
