//! IR-to-IR passes, run in a fixed order by [`optimize`]:
//!
//! 1. `cse`: pure instructions computed twice with the same operands are computed once.
//! 2. `dce`: pure instructions whose results are unused are removed.
//! 3. `resident` (when [`PassOptions::pipeline`] is given): tiles loaded once before a
//!    loop whose tensor-core `dot`s read them in every iteration are kept in shared
//!    memory instead of registers.
//! 4. `pipeline` (likewise): the loads that feed
//!    tensor-core `dot`s in loops become fetches into staged shared buffers, `num_stages`
//!    deep, in the shared memory `resident` left (with `cross_round`: a pipelined loop in
//!    a persistent loop keeps its ring across the rounds, each round's first tiles
//!    fetched at the end of the previous round); then `cse` and `dce` again (the loads' index arithmetic is left
//!    unused).
//!
//! Each pass keeps every invariant of `ir/mod.rs` (the pipeline validates after them).

mod cross_round;
mod cse;
mod dce;
pub mod pipeline;
mod resident;
mod rewrite;

use crate::diag::Diagnostics;
use crate::ir::Function;

/// What the passes need beyond the IR.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassOptions {
    /// Software pipelining of `dot` loops; `None` skips it.
    pub pipeline: Option<pipeline::PipelineOptions>,
}

impl PassOptions {
    /// Every pass, for a specialization on a target.
    pub fn for_target(
        spec: &crate::abi::Specialization,
        target: &crate::target::Target,
    ) -> PassOptions {
        PassOptions {
            pipeline: Some(pipeline::PipelineOptions {
                num_stages: spec.num_stages,
                num_warps: spec.num_warps,
                max_shared_bytes: target.max_shared_bytes_per_block,
                target_name: target.arch.name(),
                full_shared_bytes: target.max_shared_bytes_per_block,
                wgmma: target.caps.wgmma,
                // A warp-specialized kernel's producer already runs ahead across rounds.
                cross_round: !spec.ws,
            }),
        }
    }
}

/// Runs the optimization passes in order.
pub fn optimize(func: &mut Function, opts: &PassOptions) -> Result<(), Diagnostics> {
    cse::run(func);
    dce::run(func);
    if let Some(p) = &opts.pipeline {
        let reserved = resident::run(func, p);
        let p = pipeline::PipelineOptions {
            max_shared_bytes: (p.max_shared_bytes as u64).saturating_sub(reserved) as u32,
            ..*p
        };
        pipeline::run(func, &p)?;
        cse::run(func);
        dce::run(func);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
