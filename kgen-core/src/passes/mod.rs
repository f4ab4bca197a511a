//! IR-to-IR passes, run in a fixed order by [`optimize`]:
//!
//! 1. `cse`: pure instructions computed twice with the same operands are computed once.
//! 2. `dce`: pure instructions whose results are unused are removed.
//!
//! Each pass keeps every invariant of `ir/mod.rs` (the pipeline validates after them).

mod cse;
mod dce;
mod rewrite;

use crate::ir::Function;

/// Runs the optimization passes in order.
pub fn optimize(func: &mut Function) {
    cse::run(func);
    dce::run(func);
}

#[cfg(test)]
mod tests;
