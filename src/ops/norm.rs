//! RMSNorm and LayerNorm, forward and backward, over the last dimension of `x [..., C]`
//! (`kernels-src/rmsnorm.kg`, `layernorm.kg`, `rmsnorm_bwd.kg`, `layernorm_bwd.kg`).
//!
//! Assumes: x, y, dy, dx share one float dtype T (f32, f16, bf16), as do w and b; the
//! saved statistics (rstd, mean) are f32 `[rows]` with rows = the product of the leading
//! dimensions. x may be any contiguous tensor or a 2-D view with a row stride (last
//! stride 1). Outputs may not overlap inputs (the launch rejects it).
//!
//! Guarantees: f32 arithmetic, outputs rounded to T once. Configurations: BLOCK is the
//! smallest power of two covering the row when C ≤ 8192 (forward) / 4096 (backward: more
//! live tiles) so the row stays in registers and x is read once, else 4096 (the
//! multi-pass fallback, about 5/3 of the traffic in the backward). Forward rows of at
//! most 1024 with at least 8 rows per SM also try (first) the multi-row kernels
//! `rmsnorm_rows` / `layernorm_rows`: ROWS rows per block as one [ROWS, BLOCK] tile,
//! grid cdiv(rows, ROWS) (one tiny block per row underuses the memory system). The
//! backward passes run a grid-stride loop over G ≈ 2×SM blocks (more for narrow rows)
//! writing per-block f32 dw (and db) partials `[G, C]`, then a deterministic column sum.
//! On a GPU the first call per shape times 2–6 candidate configurations (warps, G,
//! ROWS) through [`Ops::tuner`] (KGEN_AUTOTUNE=0: the first,
//! the default) and remembers the fastest; no call synchronizes the host otherwise.
//!
//! Also home of the small row helpers the other op files share (`rows_cols`,
//! `one_tile`).

use super::plan::{launches_of, Launch, Pass, PlanKey};
use super::{as_rows, default_warps, expect, float_dtype, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{grid_1d, grid_x, Tensor};

/// Largest row the forward kernels keep in registers (one tile); longer rows take the
/// multi-pass path.
const MAX_ONE_TILE: usize = 8192;
/// The same for the backward kernels, which hold more tiles at once (x, dy, w and the
/// partials: at 8192 they need about 140 registers per thread with 16 warps, over the
/// 128 that 512 threads allow).
const MAX_ONE_TILE_BWD: usize = 4096;
/// BLOCK of the multi-pass path.
const MULTI_TILE_BLOCK: usize = 4096;

/// The `ONE_TILE` define of the row kernels with a one-tile and a multi-tile path
/// (`rmsnorm`, `layernorm`, `rmsnorm_bwd`, `softmax`, `softmax_bwd`): true when the row
/// fits one tile, which compiles the one-tile path only (half the PTX: the driver JITs
/// it faster, and ptxas allocates registers for one path).
pub(crate) fn one_tile(cols: usize, block: usize) -> (&'static str, String) {
    ("ONE_TILE", (cols <= block).to_string())
}

/// (rows, cols) of `x [..., C]`: rows = product of the leading dims (1 for a 1-D x).
pub(crate) fn rows_cols(op: &'static str, x: &Tensor) -> Result<(usize, usize), OpError> {
    match x.shape().split_last() {
        None => Err(shape_err(
            op,
            "expected a tensor of rank >= 1, got a scalar",
        )),
        Some((&c, lead)) => Ok((lead.iter().product(), c)),
    }
}

/// `x` as `[rows, cols]` (`as_rows`, also for rank 1).
fn rows_view(op: &'static str, x: &Tensor, rows: usize, cols: usize) -> Result<Tensor, OpError> {
    if x.rank() == 1 {
        return Ok(x.reshape(&[rows, cols])?);
    }
    as_rows(op, x)
}

/// BLOCK for a row of `cols` elements: the smallest power of two covering the row while
/// that fits `max_one_tile`, else the multi-pass BLOCK.
fn norm_block(cols: usize, max_one_tile: usize) -> usize {
    if cols <= max_one_tile {
        cols.next_power_of_two().max(32)
    } else {
        MULTI_TILE_BLOCK
    }
}

/// The forward kernels' default warps (what runs untuned) for a row tile of `block`
/// elements: 16 elements per thread, up to 8 warps.
pub(crate) fn default_fwd_warps(block: usize) -> u32 {
    (block / 512).clamp(1, 8) as u32
}

/// Warp candidates of the forward kernels for a row tile of `block` elements: the
/// default first, 16 elements per thread up to 8 warps, then half and a quarter of it.
/// Measured on an H100 (bf16, 128 MiB in, `kgen run`, two rounds, µs; RMSNorm /
/// LayerNorm): 2048 columns at 2 / 4 / 8 warps 94.5-94.7 / 94.5-94.6 / 94.3-94.5 and
/// 95.7 / 95.1 / 104; 4096 at 4 / 8 / 16 warps 94.5 / 94.3-94.4 / 103.5 and 94.8-95.1 /
/// 94.5-94.6 / 114.5; 8192 at 8 / 16 / 32 warps 94.4-94.5 / 99.5 / 159 and 94.4-94.5 /
/// 105.4 / 205. Fewer elements per thread than that only lose (more warps, the same
/// bytes), so no larger count is a candidate.
fn fwd_warp_candidates(block: usize) -> Vec<u32> {
    let w = default_fwd_warps(block);
    let mut v = vec![w];
    for c in [w / 2, w / 4] {
        if c >= 1 && !v.contains(&c) {
            v.push(c);
        }
    }
    v
}

/// Largest row (cols) the multi-row forward kernels (`rmsnorm_rows`, `layernorm_rows`)
/// take: one [ROWS, BLOCK] tile with BLOCK <= this.
const MAX_ROWS_KERNEL_BLOCK: usize = 1024;
/// The multi-row forward kernels are candidates from this many rows per SM on (below,
/// one row per block already gives few rows per SM and more blocks spread them better).
const ROWS_KERNEL_MIN_ROWS_PER_SM: usize = 8;

/// One launch configuration of the forward norm kernels: `rows_per_block` Some(ROWS)
/// runs the `_rows` kernel (one [ROWS, BLOCK] tile, grid cdiv(rows, ROWS)), None the
/// one-row-per-block kernel (grid rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FwdConfig {
    rows_per_block: Option<usize>,
    block: usize,
    warps: u32,
}

impl FwdConfig {
    fn label(&self) -> String {
        match self.rows_per_block {
            None => format!("BLOCK={},warps={}", self.block, self.warps),
            Some(r) => format!("ROWS={r},BLOCK={},warps={}", self.block, self.warps),
        }
    }

    /// The kernel's name: `op` or `op_rows`.
    fn kernel_name(&self, op: &'static str, rows_op: &'static str) -> &'static str {
        if self.rows_per_block.is_some() {
            rows_op
        } else {
            op
        }
    }

    /// -D values (T, [ROWS,] BLOCK, and ONE_TILE for the one-row kernel); ROWS is part
    /// of the kernel-cache key through these.
    fn defines(&self, t: DType, cols: usize) -> Vec<(&'static str, String)> {
        let mut d = vec![("T", t.to_string())];
        if let Some(r) = self.rows_per_block {
            d.push(("ROWS", r.to_string()));
        }
        d.push(("BLOCK", self.block.to_string()));
        if self.rows_per_block.is_none() {
            d.push(one_tile(cols, self.block));
        }
        d
    }

    fn grid(&self, rows: usize) -> Result<[u32; 3], OpError> {
        Ok(grid_x(rows.div_ceil(self.rows_per_block.unwrap_or(1)))?)
    }
}

/// Forward candidates for `rows` rows of `cols` elements on `sms` SMs, the expected
/// fastest first. Short rows (cols <= 1024) with at least 8 rows per SM: multi-row
/// blocks first, tiles of ROWS * BLOCK = 4096 elements at 64 per thread, 2048 and 4096
/// at 32 per thread (BLOCK 1024: ROWS=4 warps=2, ROWS=2 warps=2, ROWS=4 warps=4), ROWS
/// at most rows / (2 * sms) (at least two blocks per SM) and at least 2. Then the
/// one-row-per-block candidates ([`fwd_warp_candidates`]).
/// Measured on an H100 (bf16 16384x768, single timed launches, µs, rmsnorm / layernorm):
/// ROWS=4 w=2 24.5 / 27.3, ROWS=2 w=2 25.1 / 28.2, ROWS=4 w=4 25.3 / 27.8, ROWS=4 w=8
/// 27.7 / 28.8, ROWS=8 w=16 30.9 / 37.2; one row per block w=2 25.0 / 28.5: fewer, fuller
/// threads win; 16 elements per thread loses (more warps meet at each block barrier).
///
/// No candidate has more elements per thread than `cap` allows ([`PerThreadCap`]: 64,
/// or 32 where 64 does not compile or spills).
fn fwd_configs(rows: usize, cols: usize, sms: usize, cap: PerThreadCap) -> Vec<FwdConfig> {
    let block = norm_block(cols, MAX_ONE_TILE);
    let mut v = Vec::new();
    if block <= MAX_ROWS_KERNEL_BLOCK && rows >= ROWS_KERNEL_MIN_ROWS_PER_SM * sms {
        let max_r = (rows / (2 * sms).max(1)).max(1);
        let max_r = 1usize << max_r.ilog2();
        for (elems, per_thread) in [(4096, 64), (2048, 32), (4096, 32)] {
            if per_thread > cap.multi_row {
                continue;
            }
            let r = (elems / block).min(max_r);
            if r < 2 {
                continue;
            }
            let warps = (r * block / (32 * per_thread)).clamp(1, 16) as u32;
            let c = FwdConfig {
                rows_per_block: Some(r),
                block,
                warps,
            };
            if !v.contains(&c) {
                v.push(c);
            }
        }
        // Rows that are a whole number of 256-element spans but not a power of two
        // (768): a tile exactly as wide as the row leaves no lane masked (a 1024-wide
        // tile masks a quarter of them at 768).
        if cols.is_multiple_of(256) && cols < block {
            for (r, warps) in [(4usize, 2u32), (4, 4), (2, 2)] {
                let r = r.min(max_r);
                let c = FwdConfig {
                    rows_per_block: Some(r),
                    block: cols,
                    warps,
                };
                if r >= 2 && !v.contains(&c) {
                    v.push(c);
                }
            }
        }
    }
    v.extend(
        fwd_warp_candidates(block)
            .into_iter()
            .filter(|&w| block <= cap.one_row * 32 * w as usize)
            .map(|warps| FwdConfig {
                rows_per_block: None,
                block,
                warps,
            }),
    );
    // Longer one-tile rows: two rows per [2, BLOCK] tile (w, and b, read once per two
    // rows instead of once per row: at 4096 columns that per-row re-read is as many
    // bytes from L2 as the row itself), at 16 and 32 elements per thread.
    if block > MAX_ROWS_KERNEL_BLOCK
        && block <= MAX_TWO_ROW_BLOCK
        && cols <= block
        && rows >= ROWS_KERNEL_MIN_ROWS_PER_SM * sms
    {
        for per_thread in [16, 32] {
            let c = FwdConfig {
                rows_per_block: Some(2),
                block,
                warps: (2 * block / (32 * per_thread)).clamp(1, 16) as u32,
            };
            if !v.contains(&c) {
                v.push(c);
            }
        }
    }
    v
}

/// Largest one-tile row for the two-rows-per-block forward candidates.
const MAX_TWO_ROW_BLOCK: usize = 4096;

/// (BLOCK, ROWS) of the dw/db column-sum kernels: BLOCK columns per block, enough blocks
/// to cover the SMs where the row allows; ROWS partial rows per step, so that a step
/// loads about 4096 elements (few serial steps even for a large G).
pub(crate) fn colsum_tile(cols: usize, sms: usize, min_rows: usize) -> (usize, usize) {
    let block = if cols >= 128 * sms {
        128
    } else if cols >= 64 * sms {
        64
    } else {
        32
    };
    (block, (4096 / block).max(min_rows))
}

impl Ops {
    // ---------------------------------------------------------------- RMSNorm

    /// `y = x * rstd * w`, `rstd = 1/sqrt(mean(x²) + eps)` over the last dim.
    /// Returns `(y [like x], rstd f32 [rows])`.
    pub fn rmsnorm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<(Tensor, Tensor), OpError> {
        let (rows, _) = rows_cols("rmsnorm", x)?;
        let t = float_dtype("rmsnorm", x)?;
        let y = self.empty(t, x.shape())?;
        let rstd = self.empty(DType::F32, &[rows])?;
        self.rmsnorm_into(x, w, &y, &rstd, eps)?;
        Ok((y, rstd))
    }

    /// [`Ops::rmsnorm`] into existing `y` (x's shape and dtype) and `rstd` (f32 `[rows]`).
    pub fn rmsnorm_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        y: &Tensor,
        rstd: &Tensor,
        eps: f32,
    ) -> Result<(), OpError> {
        const OP: &str = "rmsnorm";
        const ROWS_OP: &str = "rmsnorm_rows";
        let (rows, cols) = rows_cols(OP, x)?;
        let t = float_dtype(OP, x)?;
        check_cols(OP, cols)?;
        expect(OP, "w", w, t, &[cols])?;
        expect(OP, "y", y, t, x.shape())?;
        expect(OP, "rstd", rstd, DType::F32, &[rows])?;
        let (x2, y2) = (rows_view(OP, x, rows, cols)?, rows_view(OP, y, rows, cols)?);
        let cap = PerThreadCap::new(false, &[&x2, &y2]);
        let cfgs = fwd_configs(rows, cols, self.sm_count(), cap);
        let args = KernelArgs::new()
            .tensor("x", &x2)
            .tensor("w", w)
            .tensor("y", &y2)
            .tensor("rstd", rstd)
            .scalar("eps", eps);
        self.launch_planned(
            PlanKey::new(OP),
            &args,
            || format!("T={t},rows={rows},cols={cols}"),
            || cfgs.iter().map(FwdConfig::label).collect(),
            |i| {
                let c = cfgs[i];
                let k = self.kernel(
                    OP,
                    c.kernel_name(OP, ROWS_OP),
                    &c.defines(t, cols),
                    Some(c.warps),
                    &args,
                )?;
                Ok((k, c.grid(rows)?))
            },
        )
    }

    /// The residual add fused with the RMSNorm after it (Llama's `h = x + residual;
    /// y = rmsnorm(h) * w`): returns `(h [like x], y [like x], rstd f32 [rows])`, with h
    /// rounded to x's dtype as torch's add stores it and y, rstd those of
    /// [`Ops::rmsnorm`]`(h)`, in one pass over memory (4 element sizes per element; an add
    /// and then the norm move 5). The backward is [`Ops::rmsnorm_backward`] on h (the
    /// add passes the gradient through to both x and residual).
    pub fn add_rmsnorm(
        &self,
        x: &Tensor,
        residual: &Tensor,
        w: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor, Tensor), OpError> {
        let (rows, _) = rows_cols("add_rmsnorm", x)?;
        let t = float_dtype("add_rmsnorm", x)?;
        let h = self.empty(t, x.shape())?;
        let y = self.empty(t, x.shape())?;
        let rstd = self.empty(DType::F32, &[rows])?;
        self.add_rmsnorm_into(x, residual, w, &h, &y, &rstd, eps)?;
        Ok((h, y, rstd))
    }

    /// [`Ops::add_rmsnorm`] into existing `h`, `y` (x's shape and dtype) and `rstd`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm_into(
        &self,
        x: &Tensor,
        residual: &Tensor,
        w: &Tensor,
        h: &Tensor,
        y: &Tensor,
        rstd: &Tensor,
        eps: f32,
    ) -> Result<(), OpError> {
        const OP: &str = "add_rmsnorm";
        let (rows, cols) = rows_cols(OP, x)?;
        let t = float_dtype(OP, x)?;
        check_cols(OP, cols)?;
        expect(OP, "residual", residual, t, x.shape())?;
        expect(OP, "w", w, t, &[cols])?;
        expect(OP, "h", h, t, x.shape())?;
        expect(OP, "y", y, t, x.shape())?;
        expect(OP, "rstd", rstd, DType::F32, &[rows])?;
        let view = |v: &Tensor| rows_view(OP, v, rows, cols);
        let (x2, r2, h2, y2) = (view(x)?, view(residual)?, view(h)?, view(y)?);
        // One row per block (a multi-row form is not written): the forward's one-row
        // candidates.
        let cap = PerThreadCap::new(false, &[&x2, &r2, &h2, &y2]);
        let cfgs: Vec<FwdConfig> = fwd_configs(rows, cols, self.sm_count(), cap)
            .into_iter()
            .filter(|c| c.rows_per_block.is_none())
            .collect();
        let args = KernelArgs::new()
            .tensor("x", &x2)
            .tensor("residual", &r2)
            .tensor("w", w)
            .tensor("h", &h2)
            .tensor("y", &y2)
            .tensor("rstd", rstd)
            .scalar("eps", eps);
        self.launch_planned(
            PlanKey::new(OP),
            &args,
            || format!("T={t},rows={rows},cols={cols}"),
            || cfgs.iter().map(FwdConfig::label).collect(),
            |i| {
                let c = cfgs[i];
                let k = self.kernel("rmsnorm", OP, &c.defines(t, cols), Some(c.warps), &args)?;
                Ok((k, c.grid(rows)?))
            },
        )
    }

    /// Gradients of [`Ops::rmsnorm`] given the saved `rstd`: `(dx [like x], dw [C])`.
    pub fn rmsnorm_backward(
        &self,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
    ) -> Result<(Tensor, Tensor), OpError> {
        let t = float_dtype("rmsnorm_backward", x)?;
        let dx = self.empty(t, x.shape())?;
        let dw = self.empty(w.dtype(), w.shape())?;
        self.rmsnorm_backward_into(x, w, rstd, dy, &dx, &dw)?;
        Ok((dx, dw))
    }

    /// [`Ops::rmsnorm_backward`] into existing `dx` and `dw`. The f32 partials `[G, C]`
    /// (G ≤ 4×SM) live in the handle's scratch buffer.
    pub fn rmsnorm_backward_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        dw: &Tensor,
    ) -> Result<(), OpError> {
        self.rmsnorm_backward_impl("rmsnorm_backward", x, w, rstd, dy, None, dx, dw)
    }

    /// The backward of [`Ops::add_rmsnorm`]: given the saved `h` and `rstd`, the
    /// gradient `dy` of y and the gradient `dh_residual` that reaches h along the
    /// residual stream (from the layers above), returns `(dh, dw)` with
    /// `dh = dh_residual + rmsnorm_backward(h, dy)`, in one pass. dh is the gradient of
    /// both x and residual (the add passes it to each).
    pub fn add_rmsnorm_backward(
        &self,
        h: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
        dh_residual: &Tensor,
    ) -> Result<(Tensor, Tensor), OpError> {
        let t = float_dtype("add_rmsnorm_backward", h)?;
        let dh = self.empty(t, h.shape())?;
        let dw = self.empty(w.dtype(), w.shape())?;
        self.add_rmsnorm_backward_into(h, w, rstd, dy, dh_residual, &dh, &dw)?;
        Ok((dh, dw))
    }

    /// [`Ops::add_rmsnorm_backward`] into existing `dh` (h's shape and dtype) and `dw`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm_backward_into(
        &self,
        h: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
        dh_residual: &Tensor,
        dh: &Tensor,
        dw: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "add_rmsnorm_backward";
        self.rmsnorm_backward_impl(OP, h, w, rstd, dy, Some(dh_residual), dh, dw)
    }

    /// `rmsnorm_bwd` (+ its dw column sum), with `dres` added to dx (`RESIDUAL`) when
    /// given.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward_impl(
        &self,
        op: &'static str,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
        dres: Option<&Tensor>,
        dx: &Tensor,
        dw: &Tensor,
    ) -> Result<(), OpError> {
        let (rows, cols) = rows_cols(op, x)?;
        let t = float_dtype(op, x)?;
        check_cols(op, cols)?;
        expect(op, "w", w, t, &[cols])?;
        expect(op, "rstd", rstd, DType::F32, &[rows])?;
        expect(op, "dy", dy, t, x.shape())?;
        expect(op, "dx", dx, t, x.shape())?;
        expect(op, "dw", dw, t, &[cols])?;
        let x2 = rows_view(op, x, rows, cols)?;
        let dy2 = rows_view(op, dy, rows, cols)?;
        let dx2 = rows_view(op, dx, rows, cols)?;
        // The residual gradient, or x as the unread placeholder of the plain backward.
        let dres2 = match dres {
            Some(r) => {
                expect(op, "dh_residual", r, t, x.shape())?;
                rows_view(op, r, rows, cols)?
            }
            None => x2.clone(),
        };
        let cfgs = self.bwd_configs(rows, cols, wide_rows(t, &[&x2, w, &dy2, &dx2, &dres2]));
        let g_max = cfgs.iter().map(|c| c.g).max().unwrap_or(1);
        let (workspace, partial_all) = self.take_workspace(&[g_max, cols])?;
        let tuned_op = if dres.is_some() {
            "rmsnorm_bwd_residual"
        } else {
            "rmsnorm_bwd"
        };
        // What the kernels depend on: the tensors (dres2 is x when absent: the op names
        // the form); the workspace is a fresh allocation's start, always 16-byte aligned.
        let plan_key = PlanKey::new(tuned_op).tensors(&[x, w, rstd, dy, dx, dw, &dres2]);
        // Candidate i's G partial rows of dw (the launches write exactly those).
        let parts = cfgs
            .iter()
            .map(|c| partial_all.narrow(0, 0, c.g))
            .collect::<Result<Vec<_>, _>>()?;
        let (cb, cr) = colsum_tile(cols, self.sm_count(), 16);
        // Candidate i's arguments of the main kernel and of the dw column sum.
        let main_args = |i: usize| {
            KernelArgs::new()
                .tensor("x", &x2)
                .tensor("w", w)
                .tensor("dy", &dy2)
                .tensor("rstd", rstd)
                .tensor("dx", &dx2)
                .tensor("dw_partial", &parts[i])
                .tensor("dres", &dres2)
        };
        let colsum_args = |i: usize| {
            KernelArgs::new()
                .tensor("dw_partial", &parts[i])
                .tensor("dw", dw)
        };
        let resolve = |i: usize| -> Result<Vec<Launch>, OpError> {
            let BwdConfig {
                block,
                g,
                warps,
                min_blocks,
            } = cfgs[i];
            let defs = [
                ("T", t.to_string()),
                ("BLOCK", block.to_string()),
                one_tile(cols, block),
                ("RESIDUAL", dres.is_some().to_string()),
            ];
            let main = self.kernel_bounded(
                "rmsnorm_bwd",
                "rmsnorm_bwd",
                &defs,
                Some(warps),
                min_blocks,
                &main_args(i),
            )?;
            // dw = the column sum of exactly the G partial rows the main launch wrote
            // (timed together: a larger G costs the column sum more).
            let colsum = self.kernel(
                "rmsnorm_bwd",
                "rmsnorm_bwd_dw",
                &[
                    ("T", t.to_string()),
                    ("BLOCK", cb.to_string()),
                    ("ROWS", cr.to_string()),
                ],
                None,
                &colsum_args(i),
            )?;
            Ok(vec![(main, grid_x(g)?), (colsum, grid_1d(cols, cb)?)])
        };
        let run = |i: usize, launches: &[Launch], pass: Pass| -> Result<f32, OpError> {
            let [(main, main_grid), (colsum, colsum_grid)] = launches_of::<2>(op, launches)?;
            let ms = self.launch_maybe_timed(main, *main_grid, main_args(i).args(), pass)?;
            Ok(ms + self.launch_maybe_timed(colsum, *colsum_grid, colsum_args(i).args(), pass)?)
        };
        self.launch_tuned_planned(
            plan_key,
            || format!("T={t},rows={rows},cols={cols}"),
            || cfgs.iter().map(BwdConfig::label).collect(),
            resolve,
            run,
        )?;
        self.give_back_workspace(workspace);
        Ok(())
    }

    /// Candidate configurations of the norm backward kernels, the default first.
    /// One-tile rows (BLOCK covers the row) with the default warps and G = k·SM,
    /// k = max(2, 32 / warps) (about 32 resident warps per SM), then 2k·SM, both compiled
    /// for 2 resident blocks per SM (without the bound the driver's JIT gave
    /// layernorm_bwd<4096> 78 registers at 16 warps, one block per SM: 230 us on an H100
    /// vs 181 us with it); the first again without the bound; for rows of
    /// 2048 to 4096 also the two-pass path with BLOCK = half the row's (fewer registers,
    /// twice the blocks per SM; the second pass re-reads the row from L2). G ≤ rows.
    /// At 16 warps the bound leaves 64 registers per thread, which only 16-bit rows
    /// read with 16-byte vectors fit (`wide_bound`): f32 rows, and 16-bit rows of 2-,
    /// 4- or 8-byte alignment, spilled 4 to 124 bytes there (ptxas 13.0, sm_80 and
    /// sm_90a: `tests/no_spills.rs`), so they run unbounded.
    fn bwd_configs(&self, rows: usize, cols: usize, wide_bound: bool) -> Vec<BwdConfig> {
        let sms = self.sm_count();
        let block = norm_block(cols, MAX_ONE_TILE_BWD);
        let w = default_warps(block);
        let k = (32 / w as usize).max(2);
        let mut v: Vec<BwdConfig> = Vec::new();
        let mut add = |block: usize, g: usize, warps: u32, bound: bool| {
            let g = g.min(rows).max(1);
            let c = BwdConfig {
                block,
                g,
                warps,
                min_blocks: (bound && g >= 2 * sms && (warps < 16 || wide_bound)).then_some(2),
            };
            if !v.contains(&c) {
                v.push(c);
            }
        };
        add(block, k * sms, w, true);
        add(block, 2 * k * sms, w, true);
        add(block, k * sms, w, false);
        if cols > MAX_ONE_TILE_BWD / 2 && cols <= MAX_ONE_TILE_BWD {
            add(block / 2, 2 * k * sms, (w / 2).max(1), true);
            add(block / 4, 4 * k * sms, (w / 4).max(1), true);
        }
        v
    }

    // ---------------------------------------------------------------- LayerNorm

    /// `y = (x - mean) * rstd * w + b` over the last dim (biased variance, like torch).
    /// Returns `(y [like x], mean f32 [rows], rstd f32 [rows])`.
    pub fn layernorm(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor, Tensor), OpError> {
        let (rows, _) = rows_cols("layernorm", x)?;
        let t = float_dtype("layernorm", x)?;
        let y = self.empty(t, x.shape())?;
        let mean = self.empty(DType::F32, &[rows])?;
        let rstd = self.empty(DType::F32, &[rows])?;
        self.layernorm_into(x, w, b, &y, &mean, &rstd, eps)?;
        Ok((y, mean, rstd))
    }

    /// [`Ops::layernorm`] into existing `y`, `mean`, `rstd`.
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        y: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        eps: f32,
    ) -> Result<(), OpError> {
        const OP: &str = "layernorm";
        const ROWS_OP: &str = "layernorm_rows";
        let (rows, cols) = rows_cols(OP, x)?;
        let t = float_dtype(OP, x)?;
        check_cols(OP, cols)?;
        expect(OP, "w", w, t, &[cols])?;
        expect(OP, "b", b, t, &[cols])?;
        expect(OP, "y", y, t, x.shape())?;
        expect(OP, "mean", mean, DType::F32, &[rows])?;
        expect(OP, "rstd", rstd, DType::F32, &[rows])?;
        let (x2, y2) = (rows_view(OP, x, rows, cols)?, rows_view(OP, y, rows, cols)?);
        let cfgs = fwd_configs(
            rows,
            cols,
            self.sm_count(),
            PerThreadCap::new(true, &[&x2, &y2]),
        );
        let args = KernelArgs::new()
            .tensor("x", &x2)
            .tensor("w", w)
            .tensor("b", b)
            .tensor("y", &y2)
            .tensor("mean", mean)
            .tensor("rstd", rstd)
            .scalar("eps", eps);
        self.launch_planned(
            PlanKey::new(OP),
            &args,
            || format!("T={t},rows={rows},cols={cols}"),
            || cfgs.iter().map(FwdConfig::label).collect(),
            |i| {
                let c = cfgs[i];
                let k = self.kernel(
                    OP,
                    c.kernel_name(OP, ROWS_OP),
                    &c.defines(t, cols),
                    Some(c.warps),
                    &args,
                )?;
                Ok((k, c.grid(rows)?))
            },
        )
    }

    /// Gradients of [`Ops::layernorm`] given the saved `mean`, `rstd`:
    /// `(dx [like x], dw [C], db [C])`.
    pub fn layernorm_backward(
        &self,
        x: &Tensor,
        w: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor), OpError> {
        let t = float_dtype("layernorm_backward", x)?;
        let dx = self.empty(t, x.shape())?;
        let dw = self.empty(w.dtype(), w.shape())?;
        let db = self.empty(w.dtype(), w.shape())?;
        self.layernorm_backward_into(x, w, mean, rstd, dy, &dx, &dw, &db)?;
        Ok((dx, dw, db))
    }

    /// [`Ops::layernorm_backward`] into existing `dx`, `dw`, `db`. Allocates the f32
    /// partials `2 × [G, C]` as a workspace.
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_backward_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        dw: &Tensor,
        db: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "layernorm_backward";
        let (rows, cols) = rows_cols(OP, x)?;
        let t = float_dtype(OP, x)?;
        check_cols(OP, cols)?;
        expect(OP, "w", w, t, &[cols])?;
        expect(OP, "mean", mean, DType::F32, &[rows])?;
        expect(OP, "rstd", rstd, DType::F32, &[rows])?;
        expect(OP, "dy", dy, t, x.shape())?;
        expect(OP, "dx", dx, t, x.shape())?;
        expect(OP, "dw", dw, t, &[cols])?;
        expect(OP, "db", db, t, &[cols])?;
        let x2 = rows_view(OP, x, rows, cols)?;
        let dy2 = rows_view(OP, dy, rows, cols)?;
        let dx2 = rows_view(OP, dx, rows, cols)?;
        let cfgs = self.bwd_configs(rows, cols, wide_rows(t, &[&x2, w, &dy2, &dx2]));
        let g_max = cfgs.iter().map(|c| c.g).max().unwrap_or(1);
        let (workspace, parts) = self.take_workspace(&[2, g_max, cols])?;
        let (pw_all, pb_all) = (parts.select(0, 0)?, parts.select(0, 1)?);
        let plan_key = PlanKey::new("layernorm_bwd").tensors(&[x, w, mean, rstd, dy, dx, dw, db]);
        // Candidate i's G partial rows of dw and db (the launches write exactly those).
        let parts = cfgs
            .iter()
            .map(|c| Ok((pw_all.narrow(0, 0, c.g)?, pb_all.narrow(0, 0, c.g)?)))
            .collect::<Result<Vec<_>, OpError>>()?;
        let (cb, cr) = colsum_tile(cols, self.sm_count(), 8);
        // Candidate i's arguments of the main kernel and of the dw, db column sums.
        let main_args = |i: usize| {
            KernelArgs::new()
                .tensor("x", &x2)
                .tensor("w", w)
                .tensor("dy", &dy2)
                .tensor("mean", mean)
                .tensor("rstd", rstd)
                .tensor("dx", &dx2)
                .tensor("dw_partial", &parts[i].0)
                .tensor("db_partial", &parts[i].1)
        };
        let colsum_args = |i: usize| {
            KernelArgs::new()
                .tensor("dw_partial", &parts[i].0)
                .tensor("db_partial", &parts[i].1)
                .tensor("dw", dw)
                .tensor("db", db)
        };
        let resolve = |i: usize| -> Result<Vec<Launch>, OpError> {
            let BwdConfig {
                block,
                g,
                warps,
                min_blocks,
            } = cfgs[i];
            // The general kernel: its one-tile-only form (`ONE_TILE`, which `rmsnorm_bwd`
            // takes) spills 4 bytes at the 64-register bound of min_blocks = 2 (ptxas 13.0).
            let defs = [("T", t.to_string()), ("BLOCK", block.to_string())];
            let main = self.kernel_bounded(
                "layernorm_bwd",
                "layernorm_bwd",
                &defs,
                Some(warps),
                min_blocks,
                &main_args(i),
            )?;
            // dw, db = column sums of exactly the G partial rows the main launch wrote.
            let colsums = self.kernel(
                "layernorm_bwd",
                "layernorm_bwd_dwdb",
                &[
                    ("T", t.to_string()),
                    ("BLOCK", cb.to_string()),
                    ("ROWS", cr.to_string()),
                ],
                None,
                &colsum_args(i),
            )?;
            Ok(vec![(main, grid_x(g)?), (colsums, grid_1d(cols, cb)?)])
        };
        let run = |i: usize, launches: &[Launch], pass: Pass| -> Result<f32, OpError> {
            let [(main, main_grid), (colsums, colsums_grid)] = launches_of::<2>(OP, launches)?;
            let ms = self.launch_maybe_timed(main, *main_grid, main_args(i).args(), pass)?;
            Ok(
                ms + self.launch_maybe_timed(
                    colsums,
                    *colsums_grid,
                    colsum_args(i).args(),
                    pass,
                )?,
            )
        };
        self.launch_tuned_planned(
            plan_key,
            || format!("T={t},rows={rows},cols={cols}"),
            || cfgs.iter().map(BwdConfig::label).collect(),
            resolve,
            run,
        )?;
        self.give_back_workspace(workspace);
        Ok(())
    }
}

/// The most elements per thread of the forward candidates (`fwd_configs`), of the
/// multi-row and of the one-row kernels.
#[derive(Clone, Copy, Debug)]
struct PerThreadCap {
    multi_row: usize,
    one_row: usize,
}

impl PerThreadCap {
    /// 64, except: 32 for rows less than 16-byte aligned in `tensors` (read element by
    /// element or in short vectors: at 64, each thread's share of a multi-row tile spans
    /// twice the rows, their statistics and an address and a predicate per element live
    /// at once, which the compiler refuses for `layernorm_rows`, a [128, 32] f32 tile at
    /// 2 warps, the default candidate of `layernorm` on [33792, 7]; and ptxas spilled
    /// 24-104 bytes at 255 registers for `add_rmsnorm`, f32, 4096 wide, 2 warps); and 32
    /// for the one-row LayerNorm (`layernorm`: at 64 it needs about 278 registers, the
    /// compiler refuses it). Found by `tests/no_spills.rs`.
    fn new(layernorm: bool, tensors: &[&Tensor]) -> PerThreadCap {
        let narrow = tensors
            .iter()
            .any(|x| kgen_runtime::tensor_alignment(x) < 16);
        let cap = |c: bool| if c { 32 } else { 64 };
        PerThreadCap {
            multi_row: cap(narrow),
            one_row: cap(narrow || layernorm),
        }
    }

    /// No cap below 64 (the candidates as measured on 16-byte aligned rows).
    #[cfg(test)]
    const WIDE: PerThreadCap = PerThreadCap {
        multi_row: 64,
        one_row: 64,
    };
}

/// Whether the first forward candidate for `rows` rows of `cols` on `sms` SMs runs the
/// multi-row kernels (the self-checks' end-to-end test of that path, `checks::norm`).
#[cfg(test)]
pub(crate) fn multi_row_first(rows: usize, cols: usize, sms: usize) -> bool {
    fwd_configs(rows, cols, sms, PerThreadCap::WIDE)[0]
        .rows_per_block
        .is_some()
}

/// Whether the norm backward's tensors of dtype `t` are 16-bit and read with 16-byte
/// vectors (every one 16-byte aligned): the rows whose 16-warp kernels fit the bound of
/// two blocks per SM.
fn wide_rows(t: DType, tensors: &[&Tensor]) -> bool {
    t.size_bytes() == 2
        && tensors
            .iter()
            .all(|x| kgen_runtime::tensor_alignment(x) >= 16)
}

/// One launch configuration of `rmsnorm_bwd` / `layernorm_bwd`. `min_blocks`: compile
/// for that many resident blocks per SM (`.minnctapersm`), which a grid of G >= 2·SM
/// blocks walking the rows counts on.
#[derive(Clone, Copy, Debug, PartialEq)]
struct BwdConfig {
    block: usize,
    g: usize,
    warps: u32,
    min_blocks: Option<u32>,
}

impl BwdConfig {
    fn label(&self) -> String {
        let bound = match self.min_blocks {
            Some(b) => format!(",min_blocks={b}"),
            None => String::new(),
        };
        format!(
            "BLOCK={},G={},warps={}{bound}",
            self.block, self.g, self.warps
        )
    }
}

fn check_cols(op: &'static str, cols: usize) -> Result<(), OpError> {
    if cols == 0 {
        return Err(shape_err(op, "the normalized (last) dimension is empty"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kgen_runtime::Device;

    #[test]
    fn fwd_configs_put_multi_row_blocks_first_for_many_short_rows() {
        let labels = |rows, cols| -> Vec<String> {
            fwd_configs(rows, cols, 132, PerThreadCap::WIDE)
                .iter()
                .map(FwdConfig::label)
                .collect()
        };
        assert_eq!(
            labels(16384, 768),
            [
                "ROWS=4,BLOCK=1024,warps=2",
                "ROWS=2,BLOCK=1024,warps=2",
                "ROWS=4,BLOCK=1024,warps=4",
                "ROWS=4,BLOCK=768,warps=2",
                "ROWS=4,BLOCK=768,warps=4",
                "ROWS=2,BLOCK=768,warps=2",
                "BLOCK=1024,warps=2",
                "BLOCK=1024,warps=1",
            ]
        );
        // Few rows, or rows longer than one 4096 tile: one row per block only.
        assert!(fwd_configs(1000, 768, 132, PerThreadCap::WIDE)
            .iter()
            .all(|c| c.rows_per_block.is_none()));
        assert!(fwd_configs(16384, 8192, 132, PerThreadCap::WIDE)
            .iter()
            .all(|c| c.rows_per_block.is_none()));
        // Rows of 2048 to 4096: one row per block first, then two rows per block.
        let labels_4096: Vec<String> = labels(16384, 4096);
        assert_eq!(
            labels_4096,
            [
                "BLOCK=4096,warps=8",
                "BLOCK=4096,warps=4",
                "BLOCK=4096,warps=2",
                "ROWS=2,BLOCK=4096,warps=16",
                "ROWS=2,BLOCK=4096,warps=8",
            ]
        );
        // Tiny rows: ROWS capped so that every SM gets at least two blocks.
        for c in fwd_configs(2000, 7, 132, PerThreadCap::WIDE) {
            if let Some(r) = c.rows_per_block {
                assert!(r >= 2 && 2000usize.div_ceil(r) >= 2 * 132, "{c:?}");
            }
        }
    }

    #[test]
    fn the_tuned_memo_finds_its_choice_by_label() {
        let ops = Ops::new(&Device::interpreter());
        let labels = |l: &[&str]| -> Vec<String> { l.iter().map(|s| s.to_string()).collect() };
        assert_eq!(ops.tuned_memo("relu|n=7", &labels(&["A", "B"])), None);
        ops.remember_tuned("relu|n=7".into(), "B");
        assert_eq!(ops.tuned_memo("relu|n=7", &labels(&["A", "B"])), Some(1));
        // Other candidates for the same shape: found where it now stands, or not at all.
        assert_eq!(ops.tuned_memo("relu|n=7", &labels(&["B", "C"])), Some(0));
        assert_eq!(ops.tuned_memo("relu|n=7", &labels(&["A", "C"])), None);
        assert_eq!(ops.tuned_memo("relu|n=8", &labels(&["A", "B"])), None);
    }
}
