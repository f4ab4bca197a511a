//! Softmax (forward and backward) and the fused cross-entropy loss with its gradient
//! (`kernels-src/softmax.kg`, `softmax_bwd.kg`, `cross_entropy.kg`).
//!
//! Assumes: softmax operands `[..., C]` share one float dtype T (f32, f16, bf16) and are
//! contiguous or 2-D views with a row stride (last stride 1). Cross-entropy takes logits
//! `[..., V]` of T and targets of i32 or i64 with the logits' leading shape (contiguous);
//! `ignore_index` must be representable in the targets' dtype. Outputs may not overlap
//! inputs (the launch rejects it), except in [`Ops::cross_entropy_in_place`].
//!
//! Guarantees (torch's `F.cross_entropy(logits, targets, ignore_index=..., reduction=
//! "mean")`): the loss is the mean over the rows whose target is not `ignore_index`, NaN
//! when every row is ignored; `dlogits` is the gradient of that mean, 0 on ignored rows.
//! A target outside `[0, V)` that is not `ignore_index` is never read out of bounds: its
//! row's loss and whole gradient row are NaN, so the mean is NaN (torch raises instead).
//! Three launches, no host synchronization: `ce_count` ([count, 1/count] on the device),
//! the fused per-row kernel, `ce_loss_mean` (deterministic order). f32 math, gradients
//! rounded to T once. On a GPU the first call per shape times a few (BLOCK, warps)
//! configurations through [`Ops::tuner`] (softmax and the out-of-place cross-entropy;
//! the in-place form cannot be re-run, so it uses the out-of-place form's stored choice
//! for the same shape, else the default).

use super::plan::PlanKey;
use super::{as_rows, expect, float_dtype, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::autotune::Autotuner;
use kgen_runtime::{grid_x, Arg, Tensor};

/// Largest softmax row kept in one tile (read once); longer rows take the online path.
const SOFTMAX_ONE_TILE: usize = 8192;
/// BLOCK of the multi-tile softmax paths.
const SOFTMAX_MULTI_BLOCK: usize = 4096;
/// (BLOCK, warps) candidates of the cross-entropy row kernel for long rows, the default
/// first.
const CE_CONFIGS: [(usize, u32); 4] = [(4096, 16), (4096, 8), (2048, 8), (2048, 4)];
/// (BLOCK, warps, DEPTH: fetches in flight) of the scratch-cached candidates
/// (`cross_entropy_cached`).
const CE_CACHED_CONFIGS: [(usize, u32, usize); 5] = [
    (4096, 16, 2),
    (4096, 8, 2),
    (4096, 8, 4),
    (4096, 8, 6),
    (2048, 8, 4),
];
/// Most scratch bytes a cached candidate uses per block (below the H100's 227 KB and
/// the A100's 163 KB per block; the conversion scratch comes on top).
const CE_SCRATCH_BYTES: usize = 150 * 1024;
/// BLOCK of the one-block `ce_count` and `ce_loss_mean` kernels for `rows` rows: the
/// rows in one tile up to 8192 (each tile is one dependent round trip to memory: at
/// 4096 rows, 1024-wide tiles took 4.3-5.0 us per kernel on an H100, most of it the
/// four trips), then 8192-wide tiles.
fn reduce_block(rows: usize) -> usize {
    rows.next_power_of_two().clamp(1024, 8192)
}

/// torch's default `ignore_index`.
pub const DEFAULT_IGNORE_INDEX: i64 = -100;

/// `t` as `[rows, last]` (rank 1 included).
fn rows_2d(op: &'static str, t: &Tensor) -> Result<Tensor, OpError> {
    match t.rank() {
        0 => Err(shape_err(
            op,
            "expected a tensor of rank >= 1, got a scalar",
        )),
        1 => Ok(t.reshape(&[1, t.shape()[0]])?),
        _ => as_rows(op, t),
    }
}

/// BLOCK of a softmax (forward or backward) row of `cols` elements.
fn softmax_block(cols: usize) -> usize {
    if cols <= SOFTMAX_ONE_TILE {
        cols.next_power_of_two().max(32)
    } else {
        SOFTMAX_MULTI_BLOCK
    }
}

/// Warp candidates for a tile of `elems` elements: about 8 per thread first, then half
/// and double (1 to 16 warps).
fn warp_candidates(elems: usize) -> Vec<u32> {
    let w = ((elems / 256).clamp(1, 16) as u32)
        .next_power_of_two()
        .min(16);
    let mut v = vec![w];
    for c in [w / 2, w * 2] {
        if (1..=16).contains(&c) && !v.contains(&c) {
            v.push(c);
        }
    }
    v
}

/// The cross-entropy kernels' VEC: the logits of one thread's 16-byte vector, the rows
/// of their per-vector online logsumexp (any divisor of BLOCK is correct; a thread's
/// whole vector makes the row's max and sum thread-local): the largest power of two
/// that divides BLOCK and is at most 16 / sizeof(T).
pub fn ce_vec(t: DType, block: usize) -> usize {
    let per_vector = 16 / t.size_bytes() as usize;
    1 << block.trailing_zeros().min(per_vector.trailing_zeros())
}

/// Rows longer than this take the cluster kernel where there are clusters.
const CE_CLUSTER_MIN_VOCAB: usize = 8192;
/// (BLOCK, warps, CLUSTER, DEPTH) candidates of the cluster kernel (each block fetches
/// its share of the row into a scratch buffer where it fits CE_CLUSTER_SCRATCH_BYTES,
/// DEPTH fetches in flight).
///
/// Clusters of 16 (non-portable, 16 KB shares at 128256 bf16, ten blocks per SM) measured
/// slower on an H100: 850.5 / 878.1 us (1024 x 4 warps, DEPTH 4 / 2) and 1201.5 (2048 x 8)
/// against 758.9 for the clusters of 8 in the same run.
const CE_CLUSTER_CONFIGS: [(usize, u32, usize, usize); 8] = [
    (4096, 16, 2, 2),
    (2048, 8, 2, 4),
    (4096, 16, 4, 2),
    (2048, 8, 4, 4),
    (1024, 4, 4, 4),
    (2048, 8, 8, 4),
    (1024, 4, 8, 4),
    (1024, 4, 8, 6),
];
/// Most scratch bytes per block of a cluster candidate: at most 64 KB, so that three
/// blocks share an SM (loads of one overlap the stores of another).
const CE_CLUSTER_SCRATCH_BYTES: usize = 64 * 1024;

/// Cross-entropy row-kernel candidates for `rows` rows of `vocab` logits, the default
/// first.
///
/// First the two-pass kernel, one block per row (G = rows for its grid-stride row loop).
/// Persistent grids that bound the rows in flight so that pass 2's re-reads stay in L2
/// were measured slower on an H100 (bf16 8192 x 50257: G = rows 832-887 us, G = 166
/// 1124 us, G = 132 1035 us; 4096 x 128256: G = rows 1087 us, G = 66 2185 us): fewer
/// rows in flight starve the memory system more than the L2 misses cost.
///
/// Then the scratch-cached kernel (`cross_entropy_cached`: the row kept in shared memory
/// between the passes, CE_CACHED_CONFIGS; ASYNC = rows `cp.async` can copy, so the tiles
/// stream in by `scratch_fetch`, DEPTH in flight): on an H100, tuner medians, 8192 x
/// 50304 bf16 (16-byte rows) 532-570 us against 687-738 for the two-pass kernel, 8192 x
/// 50257 (2-byte rows: register prefetch) 709-716 against 802-974; at 4096 x 128256 only
/// 18 of 32 tiles fit (1029-1377 us).
///
/// Rows that are not 4-byte aligned, in flat tensors that are 16-byte aligned (V = 50257
/// with rows * V a multiple of 8), take the window kernel instead of the register
/// prefetch (`cross_entropy_window`: each row's 16-byte aligned window streamed in by
/// `scratch_gather`, the same configurations): tuner medians at 8192 x 50257 bf16 on an
/// H100, 599-638 us against 715-717 for the register prefetch (537-561 us since the
/// kernels' per-vector logsumexp, sixth session).
///
/// Then, with thread-block clusters (sm_90a) and rows longer than CE_CLUSTER_MIN_VOCAB,
/// the `cross_entropy_cluster` kernel: a row split over a cluster, each block fetching
/// its share into a scratch buffer (CE_CLUSTER_CONFIGS), a cluster per row. It is the
/// one for rows too long for one block's shared memory: 4096 x 128256 measured 821-983
/// us (1024-wide tiles, 4 warps, clusters of 8 the fastest) against 1063-1100 for the
/// two-pass kernel; at 50257 / 50304 it measured 839-1651 / 579-1119 us. Since the
/// per-vector logsumexp (sixth session): 752-785 us at 128256 against 1034-1092. The tuner
/// decides per shape; `kgen bench` keeps such numbers in docs/PERFORMANCE.md.
///
/// The default, candidate 0 (what runs untuned: `KGEN_AUTOTUNE=0`, the interpreter, the
/// in-place form before any tuning of its shape, a graph captured before any tuning), is
/// moved to the front by [`ce_default`]: a kernel that reads each row from memory once
/// where there is one. (It was the two-pass kernel, 1.3-1.9x the tuned time on an H100.)
fn ce_configs(
    rows: usize,
    vocab: usize,
    elem_bytes: usize,
    clusters: bool,
    async_rows: bool,
    window_rows: bool,
) -> Vec<CeConfig> {
    let p = vocab.next_power_of_two().max(32);
    if p <= 2048 {
        return warp_candidates(p)
            .into_iter()
            .map(|w| CeConfig::two_pass(p, w, rows))
            .collect();
    }
    let mut out: Vec<CeConfig> = CE_CONFIGS
        .iter()
        .filter(|&&(b, _)| b <= p.max(4096))
        .map(|&(b, w)| CeConfig::two_pass(b, w, rows))
        .collect();
    // The row kept in a scratch buffer between the passes (`cross_entropy_cached`): all
    // of it where it fits CE_SCRATCH_BYTES, else as many tiles as fit (the rest re-read).
    // (Rows cp.async cannot copy but windows can: the window candidates below replace
    // the register-prefetch ones, 115 us slower at 8192 x 50257 on an H100.)
    let register_prefetch = !async_rows;
    for (block, warps, depth) in CE_CACHED_CONFIGS {
        if register_prefetch && window_rows {
            break;
        }
        let slots = vocab
            .div_ceil(block)
            .min(CE_SCRATCH_BYTES / (block * elem_bytes.max(1)));
        // Without fetches (rows cp.async cannot copy: ASYNC = false) DEPTH is unused:
        // one candidate per (BLOCK, warps).
        let depth = if async_rows { depth } else { 0 };
        let c = CeConfig {
            slots,
            depth,
            ..CeConfig::two_pass(block, warps, rows)
        };
        if slots >= 2 && block <= p.max(4096) && !out.contains(&c) {
            out.push(c);
        }
    }
    // Rows cp.async cannot copy, in flat tensors 16-byte vectors can read: the cached
    // row walked in aligned windows (`cross_entropy_window`); a window is at most
    // 14 elements longer than the row.
    if window_rows {
        for (block, warps, depth) in CE_CACHED_CONFIGS {
            let slots = (vocab + 14)
                .div_ceil(block)
                .min(CE_SCRATCH_BYTES / (block * elem_bytes.max(1)));
            if slots >= 2 && block <= p.max(4096) {
                out.push(CeConfig {
                    slots,
                    depth,
                    window: true,
                    ..CeConfig::two_pass(block, warps, rows)
                });
            }
        }
    }
    if clusters && vocab > CE_CLUSTER_MIN_VOCAB {
        for (block, warps, cluster, depth) in CE_CLUSTER_CONFIGS {
            let parts = vocab.div_ceil(block).div_ceil(cluster);
            let slots = parts.min(CE_CLUSTER_SCRATCH_BYTES / (block * elem_bytes.max(1)));
            // Only where the scratch buffer holds most of the block's share: a cluster
            // block that re-reads its tiles measured slower than the one-block kernels.
            if 2 * slots < parts {
                continue;
            }
            out.push(CeConfig {
                block,
                warps,
                blocks: rows.saturating_mul(cluster).max(1),
                cluster,
                parts,
                slots,
                depth,
                window: false,
            });
        }
    }
    if let Some(i) = ce_default(&out, vocab) {
        let c = out.remove(i);
        out.insert(0, c);
    }
    out
}

/// The index of the default cross-entropy candidate in `configs`: a one-block kernel
/// that keeps the whole row in its scratch buffer, 4096-wide at 8 warps and DEPTH 4 (or
/// no fetches) where there is one (else the first such); else a cluster kernel,
/// 1024-wide at 4 warps in clusters of 8 where there is one (each block keeps most of
/// its share); else the first one-block kernel caching part of the row; else None (the
/// two-pass kernel stays first). On an H100, bf16 (tuner medians of one run, against the two-pass
/// kernel's 1068.7 / 652.1 / 1025.0 us): 8192 x 50257 (window kernel) 556.7 us, 8192 x
/// 50304 (cached) 529.7, 4096 x 128256 (clusters of 8) 785.2.
fn ce_default(configs: &[CeConfig], vocab: usize) -> Option<usize> {
    let whole_row = |c: &CeConfig| {
        c.cluster == 1 && c.slots > 0 && c.slots * c.block >= vocab + if c.window { 14 } else { 0 }
    };
    let first = |pred: &dyn Fn(&CeConfig) -> bool, best: &dyn Fn(&CeConfig) -> bool| {
        configs
            .iter()
            .position(|c| pred(c) && best(c))
            .or_else(|| configs.iter().position(pred))
    };
    // (DEPTH 0: rows cp.async cannot copy, read by a register prefetch.)
    first(&whole_row, &|c| {
        (c.block, c.warps) == (4096, 8) && matches!(c.depth, 0 | 4)
    })
    .or_else(|| {
        first(&|c| c.cluster > 1, &|c| {
            (c.block, c.warps, c.cluster, c.depth) == (1024, 4, 8, 4)
        })
    })
    .or_else(|| configs.iter().position(|c| c.cluster == 1 && c.slots > 0))
}

/// One cross-entropy row-kernel launch: tile, warps, grid (blocks along x), cluster
/// size (1: the two-pass kernel) and tiles per block of the cluster kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CeConfig {
    block: usize,
    warps: u32,
    blocks: usize,
    cluster: usize,
    parts: usize,
    /// Tiles kept in the scratch buffer (`cross_entropy_cached`); 0: not cached.
    slots: usize,
    /// Fetches in flight (cached and cluster kernels).
    depth: usize,
    /// The cached row walked in aligned windows of the flat logits
    /// (`cross_entropy_window`).
    window: bool,
}

impl CeConfig {
    fn two_pass(block: usize, warps: u32, rows: usize) -> CeConfig {
        CeConfig {
            block,
            warps,
            blocks: rows.max(1),
            cluster: 1,
            parts: 1,
            slots: 0,
            depth: 0,
            window: false,
        }
    }
}

fn config_labels(configs: &[CeConfig]) -> Vec<String> {
    configs
        .iter()
        .map(|c| {
            if c.cluster > 1 {
                format!(
                    "BLOCK={},PARTS={},SLOTS={},DEPTH={},warps={},CLUSTER={}",
                    c.block, c.parts, c.slots, c.depth, c.warps, c.cluster
                )
            } else if c.window {
                format!(
                    "window,BLOCK={},SLOTS={},DEPTH={},warps={},G={}",
                    c.block, c.slots, c.depth, c.warps, c.blocks
                )
            } else if c.slots > 0 {
                format!(
                    "BLOCK={},SLOTS={},DEPTH={},warps={},G={}",
                    c.block, c.slots, c.depth, c.warps, c.blocks
                )
            } else {
                format!("BLOCK={},warps={},G={}", c.block, c.warps, c.blocks)
            }
        })
        .collect()
}

/// Checks the targets against `[rows]` logits rows and `ignore_index`; returns the index
/// dtype, the targets as a 1-D view and `ignore_index` as a kernel argument.
fn check_targets(
    op: &'static str,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: i64,
) -> Result<(DType, Tensor, Arg<'static>), OpError> {
    let lead = &logits.shape()[..logits.rank().saturating_sub(1)];
    let want: Vec<usize> = if lead.is_empty() {
        vec![1]
    } else {
        lead.to_vec()
    };
    let tshape: &[usize] = if targets.rank() == 0 {
        &[1]
    } else {
        targets.shape()
    };
    if tshape != want.as_slice() {
        return Err(shape_err(
            op,
            format!(
                "`targets` must have the logits' leading shape {want:?}, got {:?}",
                targets.shape()
            ),
        ));
    }
    if !targets.is_contiguous() {
        return Err(shape_err(op, "`targets` must be contiguous"));
    }
    let rows: usize = want.iter().product();
    let flat = targets.reshape(&[rows])?;
    match targets.dtype() {
        DType::I64 => Ok((DType::I64, flat, Arg::from(ignore_index))),
        DType::I32 => {
            let ii = i32::try_from(ignore_index).map_err(|_| {
                super::dtype_err(
                    op,
                    format!("ignore_index {ignore_index} does not fit the i32 targets"),
                )
            })?;
            Ok((DType::I32, flat, Arg::from(ii)))
        }
        d => Err(super::dtype_err(
            op,
            format!("`targets` must be i32 or i64, got {d}"),
        )),
    }
}

impl Ops {
    // ---------------------------------------------------------------- softmax

    /// Row-wise softmax over the last dimension: `y [like x]`.
    pub fn softmax(&self, x: &Tensor) -> Result<Tensor, OpError> {
        let t = float_dtype("softmax", x)?;
        let y = self.empty(t, x.shape())?;
        self.softmax_into(x, &y)?;
        Ok(y)
    }

    /// [`Ops::softmax`] into an existing `y` (x's shape and dtype).
    pub fn softmax_into(&self, x: &Tensor, y: &Tensor) -> Result<(), OpError> {
        const OP: &str = "softmax";
        let t = float_dtype(OP, x)?;
        expect(OP, "y", y, t, x.shape())?;
        let (x2, y2) = (rows_2d(OP, x)?, rows_2d(OP, y)?);
        self.rowwise(
            OP,
            "softmax",
            t,
            &KernelArgs::new().tensor("x", &x2).tensor("y", &y2),
        )
    }

    /// Gradient of [`Ops::softmax`] from its output: `dx = y * (dy - sum(dy * y))` per row.
    pub fn softmax_backward(&self, y: &Tensor, dy: &Tensor) -> Result<Tensor, OpError> {
        let t = float_dtype("softmax_backward", y)?;
        let dx = self.empty(t, y.shape())?;
        self.softmax_backward_into(y, dy, &dx)?;
        Ok(dx)
    }

    /// [`Ops::softmax_backward`] into an existing `dx` (y's shape and dtype).
    pub fn softmax_backward_into(
        &self,
        y: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "softmax_backward";
        let t = float_dtype(OP, y)?;
        expect(OP, "dy", dy, t, y.shape())?;
        expect(OP, "dx", dx, t, y.shape())?;
        let (y2, dy2, dx2) = (rows_2d(OP, y)?, rows_2d(OP, dy)?, rows_2d(OP, dx)?);
        let args = KernelArgs::new()
            .tensor("y", &y2)
            .tensor("dy", &dy2)
            .tensor("dx", &dx2);
        self.rowwise(OP, "softmax_bwd", t, &args)
    }

    /// One block per row of a `[rows, cols]` kernel whose arguments are `args` (all
    /// tensors of that shape).
    fn rowwise(
        &self,
        op: &'static str,
        stem: &str,
        t: DType,
        args: &KernelArgs,
    ) -> Result<(), OpError> {
        let Some((_, first)) = args.tensors().next() else {
            return Err(shape_err(op, "no tensors"));
        };
        let (rows, cols) = (first.shape()[0], first.shape()[1]);
        if rows == 0 {
            return Ok(());
        }
        if cols == 0 {
            return Err(shape_err(op, "the softmax (last) dimension is empty"));
        }
        let block = softmax_block(cols);
        let warps = warp_candidates(block);
        let grid = grid_x(rows)?;
        self.launch_planned(
            PlanKey::new(op),
            args,
            || format!("T={t},rows={rows},cols={cols}"),
            || {
                warps
                    .iter()
                    .map(|w| format!("BLOCK={block},warps={w}"))
                    .collect()
            },
            |i| {
                let k = self.kernel(
                    stem,
                    stem,
                    &[
                        ("T", t.to_string()),
                        ("BLOCK", block.to_string()),
                        super::norm::one_tile(cols, block),
                    ],
                    Some(warps[i]),
                    args,
                )?;
                Ok((k, grid))
            },
        )
    }

    // ---------------------------------------------------------------- cross-entropy

    /// Mean cross-entropy of `logits [..., V]` against `targets [...]` (i32 or i64),
    /// skipping rows whose target is `ignore_index` (torch's default: -100), and its
    /// gradient: `(loss f32 [1], dlogits [like logits])`. See the module header for
    /// all-ignored and out-of-range targets.
    pub fn cross_entropy(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        ignore_index: i64,
    ) -> Result<(Tensor, Tensor), OpError> {
        let t = float_dtype("cross_entropy", logits)?;
        let rows = logits.numel() / logits.shape().last().copied().unwrap_or(1).max(1);
        let loss = self.empty(DType::F32, &[1])?;
        let dlogits = self.empty(t, logits.shape())?;
        let row_loss = self.empty(DType::F32, &[rows])?;
        let stats = self.empty(DType::F32, &[2])?;
        self.cross_entropy_into(
            logits,
            targets,
            ignore_index,
            &loss,
            &dlogits,
            &row_loss,
            &stats,
        )?;
        Ok((loss, dlogits))
    }

    /// [`Ops::cross_entropy`] into existing tensors: `loss` f32 `[1]`, `dlogits` (logits'
    /// shape and dtype), and two more outputs the caller may use: `row_loss` f32 `[rows]`
    /// (each row's loss, 0 for ignored rows) and `stats` f32 `[2]` = `[count, 1/count]` of
    /// the rows not ignored (`1/count` = 0 when count is 0).
    #[allow(clippy::too_many_arguments)]
    pub fn cross_entropy_into(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        ignore_index: i64,
        loss: &Tensor,
        dlogits: &Tensor,
        row_loss: &Tensor,
        stats: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "cross_entropy";
        let t = float_dtype(OP, logits)?;
        expect(OP, "dlogits", dlogits, t, logits.shape())?;
        self.cross_entropy_impl(
            OP,
            logits,
            Some(dlogits),
            targets,
            ignore_index,
            loss,
            row_loss,
            stats,
        )
    }

    /// [`Ops::cross_entropy`] writing the gradient over `logits` (which is read first, per
    /// row): returns the mean loss f32 `[1]`. Saves the `dlogits` allocation (a
    /// `[tokens, vocab]` tensor is often the largest of a training step).
    pub fn cross_entropy_in_place(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        ignore_index: i64,
    ) -> Result<Tensor, OpError> {
        float_dtype("cross_entropy_in_place", logits)?;
        let rows = logits.numel() / logits.shape().last().copied().unwrap_or(1).max(1);
        let loss = self.empty(DType::F32, &[1])?;
        let row_loss = self.empty(DType::F32, &[rows])?;
        let stats = self.empty(DType::F32, &[2])?;
        self.cross_entropy_in_place_into(logits, targets, ignore_index, &loss, &row_loss, &stats)?;
        Ok(loss)
    }

    /// [`Ops::cross_entropy_in_place`] into existing `loss`, `row_loss`, `stats` (as in
    /// [`Ops::cross_entropy_into`]).
    pub fn cross_entropy_in_place_into(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        ignore_index: i64,
        loss: &Tensor,
        row_loss: &Tensor,
        stats: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "cross_entropy_in_place";
        self.cross_entropy_impl(
            OP,
            logits,
            None,
            targets,
            ignore_index,
            loss,
            row_loss,
            stats,
        )
    }

    /// The three launches; `dlogits: None` is the in-place form.
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_impl(
        &self,
        op: &'static str,
        logits: &Tensor,
        dlogits: Option<&Tensor>,
        targets: &Tensor,
        ignore_index: i64,
        loss: &Tensor,
        row_loss: &Tensor,
        stats: &Tensor,
    ) -> Result<(), OpError> {
        let t = float_dtype(op, logits)?;
        let x2 = rows_2d(op, logits)?;
        let (rows, vocab) = (x2.shape()[0], x2.shape()[1]);
        if vocab == 0 {
            return Err(shape_err(op, "the class (last) dimension is empty"));
        }
        let (idx, tg, ignore) = check_targets(op, logits, targets, ignore_index)?;
        expect(op, "loss", loss, DType::F32, &[1])?;
        expect(op, "row_loss", row_loss, DType::F32, &[rows])?;
        expect(op, "stats", stats, DType::F32, &[2])?;
        let dx2 = dlogits.map(|d| rows_2d(op, d)).transpose()?;

        // 1. [count, 1/count].
        let mut args = KernelArgs::new()
            .tensor("targets", &tg)
            .tensor("stats", stats);
        args.push("ignore_index", ignore);
        let k = self.kernel(
            "cross_entropy",
            "ce_count",
            &[
                ("I", idx.to_string()),
                ("BLOCK", reduce_block(rows).to_string()),
            ],
            None,
            &args,
        )?;
        self.launch_args(&k, [1, 1, 1], &args)?;

        // 2. Per-row loss and gradient.
        if rows > 0 {
            let clusters = self.device().arch().target().caps.clusters;
            let async_rows = kgen_runtime::tensor_alignment(&x2) >= 4;
            // Flat views for the window kernels: whole contiguous [rows * V] tensors that
            // 16-byte vectors can read (rows * V * sizeof(T) a multiple of 16).
            let flat = |t: &Tensor| -> Result<Option<Tensor>, OpError> {
                // Extents are 32-bit in the kernel ABI.
                if !t.is_contiguous() || rows * vocab > i32::MAX as usize {
                    return Ok(None);
                }
                let f = t.reshape(&[rows * vocab])?;
                Ok((kgen_runtime::tensor_alignment(&f) >= 16).then_some(f))
            };
            let x_flat = flat(&x2)?;
            let dx_flat = dx2.as_ref().map(flat).transpose()?.flatten();
            let window_rows =
                !async_rows && x_flat.is_some() && (dx2.is_none() || dx_flat.is_some());
            let configs = ce_configs(
                rows,
                vocab,
                t.size_bytes() as usize,
                clusters,
                async_rows,
                window_rows,
            );
            let labels = config_labels(&configs);
            let shape_key = format!("T={t},I={idx},rows={rows},V={vocab}");
            // A row kernel's arguments: the 2-D logits (and dlogits), or for the window
            // kernels the flat views and V.
            let vocab_arg = i32::try_from(vocab).unwrap_or(i32::MAX);
            let row_args = |window: bool| -> Result<KernelArgs, OpError> {
                let (logits, dlogits) = if window {
                    let (Some(xf), true) = (&x_flat, dx2.is_none() || dx_flat.is_some()) else {
                        return Err(shape_err(op, "a window candidate without flat views"));
                    };
                    (xf, dx_flat.as_ref())
                } else {
                    (&x2, dx2.as_ref())
                };
                let mut a = KernelArgs::new()
                    .tensor("logits", logits)
                    .tensor("targets", &tg)
                    .tensor("stats", stats)
                    .tensor("loss", row_loss);
                if let Some(dx) = dlogits {
                    a.push_tensor("dlogits", dx);
                }
                if window {
                    a.push_scalar("vocab", vocab_arg);
                }
                a.push("ignore_index", ignore);
                Ok(a)
            };
            let row_kernel = |i: usize, args: &KernelArgs| {
                let c = configs[i];
                let mut defines = vec![
                    ("T", t.to_string()),
                    ("I", idx.to_string()),
                    ("BLOCK", c.block.to_string()),
                ];
                let clustered = c.cluster > 1;
                let cached = c.slots > 0;
                defines.push(("VEC", ce_vec(t, c.block).to_string()));
                if clustered {
                    defines.push(("PARTS", c.parts.to_string()));
                    defines.push(("CLUSTER", c.cluster.to_string()));
                }
                if c.window {
                    // Tiles of the longest window (two partial vectors at the ends): when
                    // SLOTS covers them, the re-read branch is not compiled.
                    defines.push(("MAXTILES", (vocab + 14).div_ceil(c.block).to_string()));
                }
                if cached {
                    defines.push(("SLOTS", c.slots.to_string()));
                    if c.depth > 0 {
                        defines.push(("DEPTH", c.depth.to_string()));
                    }
                    if !clustered && !c.window {
                        // Asynchronous fetches where cp.async can copy the rows.
                        defines.push(("ASYNC", async_rows.to_string()));
                    }
                }
                let in_place = dx2.is_none();
                let (stem, name) = match (c.window, clustered, cached, in_place) {
                    (true, _, _, false) => ("cross_entropy_window", "cross_entropy_window"),
                    (true, _, _, true) => ("cross_entropy_window", "cross_entropy_window_inplace"),
                    (false, true, _, false) => ("cross_entropy_cluster", "cross_entropy_cluster"),
                    (false, true, _, true) => {
                        ("cross_entropy_cluster", "cross_entropy_cluster_inplace")
                    }
                    (false, false, true, false) => ("cross_entropy_cached", "cross_entropy_cached"),
                    (false, false, true, true) => {
                        ("cross_entropy_cached", "cross_entropy_cached_inplace")
                    }
                    (false, false, false, false) => ("cross_entropy", "cross_entropy"),
                    (false, false, false, true) => ("cross_entropy", "cross_entropy_inplace"),
                };
                self.kernel(stem, name, &defines, Some(c.warps), args)
            };
            if dx2.is_some() {
                let (args, wargs) = (row_args(false)?, row_args(window_rows)?);
                self.launch_tuned("cross_entropy", &shape_key, &labels, |i, pass| {
                    let grid = grid_x(configs[i].blocks)?;
                    let a = if configs[i].window { &wargs } else { &args };
                    self.launch_maybe_timed(&*row_kernel(i, a)?, grid, a.args(), pass)
                })?;
            } else {
                // Not re-runnable (it overwrites its input): the out-of-place form's
                // tuned choice for this shape, else the default.
                let key = Autotuner::key("cross_entropy", self.device(), &shape_key);
                let i = self
                    .tuner()
                    .stored(&key)
                    .and_then(|l| labels.iter().position(|x| *x == l))
                    .unwrap_or(0);
                let args = row_args(configs[i].window)?;
                self.launch_args(&*row_kernel(i, &args)?, grid_x(configs[i].blocks)?, &args)?;
            }
        }

        // 3. The mean.
        let args = KernelArgs::new()
            .tensor("loss", row_loss)
            .tensor("stats", stats)
            .tensor("out", loss);
        let k = self.kernel(
            "cross_entropy",
            "ce_loss_mean",
            &[("BLOCK", reduce_block(rows).to_string())],
            None,
            &args,
        )?;
        self.launch_args(&k, [1, 1, 1], &args)
    }
}

/// The tuning labels of `ce_configs(rows, vocab, elem_bytes, clusters, async_rows,
/// window_rows)`, each with whether it is a window kernel (the self-checks' test of the
/// window kernels through the op, `checks::loss`).
#[cfg(test)]
pub(crate) fn ce_candidates(
    rows: usize,
    vocab: usize,
    elem_bytes: usize,
    clusters: bool,
    async_rows: bool,
    window_rows: bool,
) -> Vec<(String, bool)> {
    let configs = ce_configs(rows, vocab, elem_bytes, clusters, async_rows, window_rows);
    config_labels(&configs)
        .into_iter()
        .zip(configs.iter().map(|c| c.window))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_cover_the_row() {
        for clusters in [false, true] {
            for v in [1usize, 7, 1000, 2048, 4097, 8193, 50257, 128256] {
                for rows in [1usize, 7, 8192] {
                    let c: Vec<CeConfig> = [(true, false), (false, false), (false, true)]
                        .iter()
                        .flat_map(|&(a, w)| ce_configs(rows, v, 2, clusters, a, w))
                        .collect();
                    assert!(!c.is_empty(), "V={v}");
                    for c in &c {
                        assert!(c.block >= 32 && (1..=16).contains(&c.warps), "{c:?}");
                        if c.slots > 0 {
                            // Cached tiles never exceed the row or the scratch budget.
                            assert!(c.slots * c.block * 2 <= CE_SCRATCH_BYTES, "{c:?}");
                            if c.window {
                                // A window is at most 14 elements longer than its row.
                                assert!(c.slots >= 2 && c.cluster == 1, "{c:?}");
                                assert!((c.slots - 1) * c.block < v + 14, "V={v}: {c:?}");
                            } else if c.cluster == 1 {
                                assert!(c.slots >= 2, "{c:?}");
                                assert!((c.slots - 1) * c.block < v, "V={v}: {c:?}");
                            } else {
                                // A cluster block caches most of its own tiles, no more.
                                assert!(2 * c.slots >= c.parts && c.slots <= c.parts, "{c:?}");
                                assert!(c.slots * c.block * 2 <= CE_CLUSTER_SCRATCH_BYTES);
                            }
                        }
                        if c.cluster == 1 {
                            assert!((1..=rows).contains(&c.blocks), "V={v}: {c:?}");
                        } else {
                            assert!(clusters && v > CE_CLUSTER_MIN_VOCAB, "{c:?}");
                            assert_eq!(c.blocks, rows * c.cluster);
                            // The cluster's tiles cover the row.
                            assert!(c.cluster * c.parts * c.block >= v, "V={v}: {c:?}");
                        }
                    }
                }
            }
        }
        assert_eq!(
            ce_configs(3, 7, 2, true, true, false)[0],
            CeConfig::two_pass(32, 1, 3)
        );
        assert_eq!(ce_configs(3, 1000, 2, true, true, false)[0].block, 1024);
        // The defaults: a kernel reading each row once (whole row cached in one block
        // where it fits, else a cluster, else part of the row cached).
        let first = |rows, v, clusters, async_rows, window| {
            ce_configs(rows, v, 2, clusters, async_rows, window)[0]
        };
        let c = first(8192, 50304, true, true, false);
        assert_eq!(
            (c.block, c.warps, c.depth, c.cluster, c.window),
            (4096, 8, 4, 1, false)
        );
        assert!(c.slots * c.block >= 50304);
        let c = first(8192, 50257, true, false, true);
        assert_eq!((c.block, c.warps, c.depth, c.window), (4096, 8, 4, true));
        let c = first(8192, 50257, true, false, false);
        assert_eq!(
            (c.block, c.warps, c.depth, c.slots),
            (4096, 8, 0, 13),
            "{c:?}"
        );
        let c = first(4096, 128256, true, true, false);
        assert_eq!((c.block, c.warps, c.cluster, c.depth), (1024, 4, 8, 4));
        let c = first(4096, 128256, false, true, false);
        assert!(
            c.cluster == 1 && c.slots > 0 && c.slots * c.block < 128256,
            "{c:?}"
        );
        // Rows longer than the buffer are launched (the kernels load the tiles past
        // SLOTS themselves: a scratch slot out of range would trap); the case table runs
        // this one (`cross_entropy_cached T=f32 ... SLOTS=9 DEPTH=2 rows=2 V=40000`).
        assert!(ce_configs(2, 40000, 4, false, true, false)
            .iter()
            .any(|c| (c.block, c.slots, c.depth, c.cluster) == (4096, 9, 2, 1)));
        // Every list still holds the two-pass kernel.
        assert!(ce_configs(8192, 50257, 2, true, true, false)
            .contains(&CeConfig::two_pass(4096, 16, 8192)));
        // 2-byte rows (register prefetch): one candidate per (BLOCK, warps), no DEPTH.
        let odd = ce_configs(8192, 50257, 2, true, false, false);
        assert!(odd.iter().all(|c| !c.window));
        // With flat views 16-byte vectors can read: the window candidates, whole rows
        // cached (13 tiles of 4096 hold a 50257-element row's window).
        let windows = ce_configs(8192, 50257, 2, true, false, true);
        assert!(windows
            .iter()
            .any(|c| c.window && c.block == 4096 && c.slots == 13));
        let cached: Vec<_> = odd
            .iter()
            .filter(|c| c.slots > 0 && c.cluster == 1)
            .collect();
        assert!(!cached.is_empty() && cached.iter().all(|c| c.depth == 0));
        for (i, a) in cached.iter().enumerate() {
            assert!(cached[i + 1..]
                .iter()
                .all(|b| (b.block, b.warps) != (a.block, a.warps)));
        }
        let cl = ce_configs(8192, 50257, 2, true, true, false);
        // The whole bf16 row of 50257 fits: 13 tiles of 4096.
        assert!(cl.iter().any(|c| c.slots == 13 && c.block == 4096));
        assert!(cl
            .iter()
            .any(|c| c.cluster == 8 && c.parts == 7 && c.slots == 7 && c.block == 1024));
        // 128256 bf16 (250 KB a row): four blocks of 64 KB each hold a whole row.
        assert!(ce_configs(4096, 128256, 2, true, true, false)
            .iter()
            .any(|c| c.cluster == 4
                && c.parts == 8
                && c.slots == 8
                && c.block == 4096
                && c.warps == 16));
        assert_eq!(softmax_block(4097), 8192);
        assert_eq!(softmax_block(8193), 4096);
    }
}
