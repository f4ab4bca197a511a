//! Gradient statistics over a flat gradient buffer, on the device, without host
//! synchronization: the global L2 norm, the number of non-finite elements, and torch's
//! `clip_grad_norm_` (norm_type 2, error_if_nonfinite=False).
//!
//! Three kernels of `kernels-src/optim.kg`: `grad_stats` reads the gradient once with a
//! grid-stride loop over a few blocks per SM and writes `[G, 2]` partials (sum of squares,
//! non-finite count); `grad_stats_finalize` (one block) writes the stats tensor
//! `[sumsq, norm, nonfinite_count, clip_coef]` with `clip_coef = min(1, max_norm /
//! (norm + 1e-6))`; `scale_by` multiplies the gradient by `stats[3]` read on the device
//! (blocks skip the pass when the coefficient is exactly 1). Deterministic: the partials
//! and their sum have a fixed order for a given length, block and grid.
//!
//! Matches torch: the norm is computed from f32 squares (torch accumulates in f32 too); a
//! non-finite element makes the norm inf or NaN and the coefficient 0 or NaN, which the
//! scaling then spreads, as in torch with `error_if_nonfinite=False`. The count is an f32,
//! exact up to 2^24 non-finite elements.

use crate::ops::{dtype_err, float_dtype, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{grid_x, Tensor};

/// How the gradient-statistics kernels are launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GradStatsLaunch {
    /// Elements per chunk (a power of two from 32 to 4096).
    pub block: usize,
    /// `grad_stats` runs `blocks_per_sm * SMs` blocks (fewer when there are fewer chunks).
    pub blocks_per_sm: usize,
    /// `scale_by`'s grid: None = one chunk per block, Some(g) = at most g blocks.
    pub scale_grid: Option<usize>,
    pub num_warps: Option<u32>,
}

impl Default for GradStatsLaunch {
    fn default() -> Self {
        // H100, fp32 GPT-2 grads (124.4M), `grad_stats` alone (`kgen run --bench`),
        // the driver's whole-program JIT (cuModuleLoadData): 2048 x 8 warps x 8/SM 173.9
        // us, x 4/SM 186.0; 4096 x 16 warps x 4/SM 174.0; 1024 or 2048 x 4 warps x 8/SM
        // 186.8-187.4 (the relocatable code of the linker path ran 2048 x 8 x 4/SM in
        // 174.4). Scaling 334 us for any block (the 3.0 TB/s copy rate).
        GradStatsLaunch {
            block: 2048,
            blocks_per_sm: 8,
            scale_grid: None,
            num_warps: None,
        }
    }
}

/// Elements per chunk of the one-block finalize kernel (partials rows per iteration).
const FINALIZE_BLOCK: usize = 1024;

/// Reusable workspace for the gradient statistics: the `[G, 2]` partials and the `[4]`
/// stats tensor, allocated once (so repeated calls allocate nothing).
#[derive(Debug)]
pub struct GradStats {
    partials: Tensor,
    out: Tensor,
    launch: GradStatsLaunch,
}

impl GradStats {
    pub fn new(ops: &Ops, launch: GradStatsLaunch) -> Result<GradStats, OpError> {
        super::check_block(launch.block)?;
        if launch.blocks_per_sm == 0 {
            return Err(OpError::Runtime(kgen_runtime::RuntimeError::LaunchConfig(
                "blocks_per_sm must be at least 1".into(),
            )));
        }
        let rows = (launch.blocks_per_sm * ops.sm_count()).max(1);
        Ok(GradStats {
            partials: ops.empty(DType::F32, &[rows, 2])?,
            out: ops.empty(DType::F32, &[4])?,
            launch,
        })
    }

    /// The stats tensor `[sumsq, norm, nonfinite_count, clip_coef]` the last call wrote.
    pub fn stats(&self) -> &Tensor {
        &self.out
    }

    /// Writes the statistics of `grads` (any contiguous f32/f16/bf16 tensor) into
    /// [`GradStats::stats`]; `clip_coef` is for `max_norm` (pass `f32::INFINITY` for
    /// 1). Two launches.
    pub fn compute(&self, ops: &Ops, grads: &Tensor, max_norm: f32) -> Result<(), OpError> {
        const OP: &str = "grad_stats";
        let (g, t) = flat_grads(OP, grads)?;
        let block = self.launch.block;
        let nchunks = g.numel().div_ceil(block);
        let rows = nchunks.clamp(1, self.partials.shape()[0]);
        let partials = self.partials.narrow(0, 0, rows)?;
        let args = KernelArgs::new()
            .tensor("g", &g)
            .tensor("partials", &partials);
        let k = ops.kernel(
            "optim",
            "grad_stats",
            &[("T", t.to_string()), ("BLOCK", block.to_string())],
            self.launch.num_warps,
            &args,
        )?;
        ops.launch_args(&k, grid_x(rows)?, &args)?;
        let args = KernelArgs::new()
            .tensor("partials", &partials)
            .tensor("out", &self.out)
            .scalar("max_norm", max_norm);
        let k = ops.kernel(
            "optim",
            "grad_stats_finalize",
            &[("BLOCK", FINALIZE_BLOCK.to_string())],
            None,
            &args,
        )?;
        ops.launch_args(&k, [1, 1, 1], &args)
    }

    /// [`GradStats::compute`] then `grads *= clip_coef` on the device: torch's
    /// `clip_grad_norm_(max_norm)`. Three launches (two when `grads` is empty).
    pub fn clip_(&self, ops: &Ops, grads: &Tensor, max_norm: f32) -> Result<(), OpError> {
        self.compute(ops, grads, max_norm)?;
        scale_by_stats(ops, grads, &self.out, self.launch)
    }
}

/// `grads *= stats[3]` (the clip coefficient), read on the device.
pub fn scale_by_stats(
    ops: &Ops,
    grads: &Tensor,
    stats: &Tensor,
    launch: GradStatsLaunch,
) -> Result<(), OpError> {
    const OP: &str = "scale_by";
    let (g, t) = flat_grads(OP, grads)?;
    if stats.dtype() != DType::F32 {
        return Err(dtype_err(
            OP,
            format!("stats must be f32, got {}", stats.dtype()),
        ));
    }
    if stats.shape() != [4] || !stats.is_contiguous() {
        return Err(shape_err(
            OP,
            format!(
                "stats must be a contiguous [4] tensor, got {:?}",
                stats.shape()
            ),
        ));
    }
    super::check_block(launch.block)?;
    let nchunks = g.numel().div_ceil(launch.block);
    if nchunks == 0 {
        return Ok(());
    }
    let args = KernelArgs::new().tensor("g", &g).tensor("stats", stats);
    let k = ops.kernel(
        "optim",
        "scale_by",
        &[("T", t.to_string()), ("BLOCK", launch.block.to_string())],
        launch.num_warps,
        &args,
    )?;
    let grid = launch.scale_grid.map_or(nchunks, |s| s.clamp(1, nchunks));
    ops.launch_args(&k, grid_x(grid)?, &args)
}

/// The global gradient norm as a device tensor `[sumsq, norm, nonfinite_count, 1.0]`
/// (the last entry is NaN when the norm is inf or NaN); a fresh workspace per call, keep
/// a [`GradStats`] to avoid the allocations.
pub fn grad_norm(ops: &Ops, grads: &Tensor) -> Result<Tensor, OpError> {
    let s = GradStats::new(ops, GradStatsLaunch::default())?;
    s.compute(ops, grads, f32::INFINITY)?;
    Ok(s.out)
}

/// torch's `clip_grad_norm_(max_norm)` over a flat gradient tensor, on the device.
/// Returns the stats tensor `[sumsq, norm, nonfinite_count, clip_coef]`.
pub fn clip_grad_norm_(ops: &Ops, grads: &Tensor, max_norm: f32) -> Result<Tensor, OpError> {
    let s = GradStats::new(ops, GradStatsLaunch::default())?;
    s.clip_(ops, grads, max_norm)?;
    Ok(s.out)
}

/// The stats tensor, read on the host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradNorm {
    pub sumsq: f64,
    pub norm: f64,
    pub nonfinite: u64,
    pub clip_coef: f64,
}

impl GradNorm {
    pub fn all_finite(&self) -> bool {
        self.nonfinite == 0
    }
}

/// Reads a stats tensor to the host. This SYNCHRONIZES (it waits for the device).
pub fn read_grad_stats(stats: &Tensor) -> Result<GradNorm, OpError> {
    if stats.dtype() != DType::F32 || stats.shape() != [4] {
        return Err(shape_err(
            "read_grad_stats",
            format!(
                "expected an f32 [4] stats tensor, got {} {:?}",
                stats.dtype(),
                stats.shape()
            ),
        ));
    }
    let v = stats.to_vec::<f32>()?;
    Ok(GradNorm {
        sumsq: v[0] as f64,
        norm: v[1] as f64,
        nonfinite: v[2] as u64,
        clip_coef: v[3] as f64,
    })
}

/// A contiguous float tensor as a 1-D view, and its dtype.
fn flat_grads(op: &'static str, grads: &Tensor) -> Result<(Tensor, DType), OpError> {
    let t = float_dtype(op, grads)?;
    if !grads.is_contiguous() {
        return Err(shape_err(
            op,
            format!(
                "gradients must be contiguous (shape {:?}, strides {:?})",
                grads.shape(),
                grads.strides()
            ),
        ));
    }
    Ok((grads.flatten()?, t))
}
