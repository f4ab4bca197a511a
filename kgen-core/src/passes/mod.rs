//! IR-to-IR passes, run in a fixed order by [`optimize`].

use crate::ir::Function;

/// Runs the optimization passes in order.
pub fn optimize(func: &mut Function) {
    let _ = func;
}
