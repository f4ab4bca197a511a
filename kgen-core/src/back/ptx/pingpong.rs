//! Ping-pong: two consumer warpgroups take turns issuing a loop's products
//! (FlashAttention-3's inter-warpgroup schedule), so that one warpgroup's element-wise
//! work (attention's softmax) runs while the other's products keep the tensor cores busy.
//!
//! Without it both warpgroups of a warp-specialized block wait on the same staged tiles,
//! issue their products together, and then both run their softmax while the tensor cores
//! idle. With it, iteration j of warpgroup w is
//!
//! ```text
//! bar.sync   turn[w], 256      // wait for my turn
//! <the products of the window> // issued asynchronously (wgmma)
//! bar.arrive turn[1-w], 256    // the other warpgroup's turn
//! <the rest of the body>       // runs while the other one's products run
//! ```
//!
//! Warpgroup 1 arrives on `turn[0]` before the loop (if it runs at all: warpgroup 0
//! goes first) and skips its arrival in the last iteration, which warpgroup 0 would never
//! take. So `turn[0]` sees n arrivals and n syncs, `turn[1]` n and n, for any trip count
//! n, zero included, and no arrival is left pending when the block exits. (A first form
//! that let warpgroup 1 arrive every iteration and warpgroup 0 take the last one after
//! the loop was just as correct on the GPU, but compute-sanitizer racecheck then reported
//! hazards between the epilogue's shared-memory stores and loads on either side of the
//! consumers' block barrier; this form is clean.)
//!
//! This file decides *where* ([`plan`]); `lower/turns.rs` emits the barriers.
//!
//! Assumes: the kernel runs two consumer warpgroups after a warp-specialization split
//! (`lower/ws.rs`), both executing the loop the same number of times (scalars and so
//! loop bounds are block-uniform in the language).
//! Guarantees: a loop is planned only when the top level of its body holds at least two
//! `dot`s and nothing but `dot`s and pure, region-free instructions (index arithmetic,
//! reshapes, transposes) between its first and its last `dot`: the *window*. The
//! lowering checks the emitted window too: a block barrier inside it (which the other
//! warpgroup, waiting for its turn, could never reach) is an `Unsupported` error, never
//! a hang.

use crate::ir::{Block, Function, InstId, Op};
use std::collections::HashMap;

/// The products of one loop iteration that a warpgroup issues in its turn: the body's
/// first and last top-level `dot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub first: InstId,
    pub last: InstId,
}

/// The loops that take turns, by the `for` instruction's id.
pub fn plan(func: &Function) -> HashMap<InstId, Window> {
    let mut out = HashMap::new();
    walk(func, &func.body, &mut out);
    out
}

fn walk(func: &Function, block: &Block, out: &mut HashMap<InstId, Window>) {
    for &i in &block.insts {
        let op = &func.insts[i].op;
        if let Op::For { body, .. } = op {
            if let Some(w) = window(func, body) {
                out.insert(i, w);
            }
        }
        for r in crate::ir::regions(op) {
            walk(func, r, out);
        }
    }
}

/// The window of a loop body, if it has one (module docs).
fn window(func: &Function, body: &Block) -> Option<Window> {
    let is_dot = |i: InstId| matches!(func.insts[i].op, Op::Dot { .. });
    let first = body.insts.iter().position(|&i| is_dot(i))?;
    let last = body.insts.iter().rposition(|&i| is_dot(i))?;
    if first == last {
        return None;
    }
    let quiet = body.insts[first..=last].iter().all(|&i| {
        let op = &func.insts[i].op;
        is_dot(i) || (crate::ir::props(op).is_pure() && crate::ir::regions(op).is_empty())
    });
    quiet.then(|| Window {
        first: body.insts[first],
        last: body.insts[last],
    })
}
