//! `kgen::optim`: a multi-tensor AdamW that updates every parameter of every param group
//! with ONE kernel launch per step and never synchronizes the host, plus the global
//! gradient norm / `clip_grad_norm_` / non-finite check over the same flat buffers
//! ([`grad`]). Kernels: `kernels-src/optim.kg`.
//!
//! # Layout
//! [`AdamW`] owns four flat device buffers: parameters `p [N]` and gradients `g [N]` of
//! the parameter dtype T (f32, f16 or bf16), moments `m`, `v [N]` of the state dtype S
//! (f32 by default in mixed precision, or T as in torch). Each registered parameter is a
//! view `p.narrow(0, offset, numel).reshape(shape)` ([`AdamW::param`]) and its gradient the
//! same view of `g` ([`AdamW::grad`]): write gradients straight into those views (the ops'
//! `_into` forms do) and the step needs no gather. Each tensor starts 16-byte aligned, each
//! group's segment starts at a multiple of [`GROUP_ALIGN`] elements so that every kernel
//! chunk (`BLOCK` elements, `BLOCK` dividing `GROUP_ALIGN`) belongs to exactly one group.
//! Padding is zero and stays zero: a zero gradient gives zero moments and a zero update,
//! and weight decay of a zero parameter is zero.
//!
//! # A step
//! [`AdamW::step`] uses one row of hyperparameters per group computed on the host in f64
//! (`1 - lr*wd`, the betas and `1 - beta`s, eps, `step_size = lr / (1 - beta1^t)`,
//! `1 / sqrt(1 - beta2^t)`; [`ParamGroup::hyper_row`]) and launches `adamw_multi` once
//! with a `[groups, 8]` view of a device table that holds the rows of up to
//! [`HP_STEPS_MAX`] consecutive steps. The table is refilled (one pinned asynchronous
//! copy on the ops' stream) every that many steps and after `set_lr` or
//! `set_step_count`, so most steps are the kernel launch alone. A debug counter
//! ([`AdamW::step_launches`]) counts the launches so tests can check the "one launch".
//!
//! # AMSGrad
//! A group with `amsgrad: true` is torch's `amsgrad=True`: the optimizer keeps a fourth
//! flat buffer `max_exp_avg_sq` ([`AdamW::max_exp_avg_sq_flat`], state dtype, zero at
//! the start) and that group's denominator uses `max(max_exp_avg_sq, v)`, stored back
//! (the kernel's `AMSGRAD` variant, still one launch; groups without it are unchanged).
//!
//! # Differences from `torch.optim.AdamW`
//! - One step counter for the whole optimizer; torch keeps `state["step"]` per parameter.
//!   Every parameter is updated at every step: there is no "grad is None, skip" (a zero
//!   gradient still gets weight decay and the momentum update, as in torch when the grad
//!   is a zero tensor).
//! - The math is torch's *fused* kernel's (`param *= 1 - lr*wd; m = b1*m + (1-b1)*g;
//!   v = b2*v + (1-b2)*g*g; param -= step_size * m / (sqrt(v)/bc2_sqrt + eps)`) in f32 for
//!   every dtype, rounding p, m, v to their dtypes once on store (torch's `foreach` path
//!   on bf16 tensors rounds after every op instead). The bias corrections, `1 - beta` and
//!   `1 - lr*wd` are computed on the host in f64 like torch's single-tensor path and
//!   passed as f32 (torch's fused kernel forms `1 - beta2` in f32 from an f32 beta2,
//!   which puts a 1.3e-5 relative error on every v for beta2 = 0.999; ours is 6e-8).
//! - The division `m / denom` is `m * r * r` with the hardware's approximate
//!   `r = rsqrt(denom)` (~2^-22 relative on the update; IEEE divisions made the kernel
//!   issue-bound, 821 us vs 586 us for the bf16 GPT-2 step on an H100).
//! - States may be f32 while the parameters are f16/bf16 (torch keeps states in the
//!   parameter dtype); `S = T` gives torch's behaviour.
//! - Hyperparameters are host numbers (no tensor lr, `differentiable`,
//!   `grad_scale`/`found_inf`); a [`AdamW::set_lr`] takes effect at the next step.
//!   [`AdamW::set_capturable`] is torch's `capturable`: the step count lives on the
//!   device and the kernel computes the bias corrections from it (in f32, as torch's
//!   capturable path does), so a CUDA graph can replay the step. Non-finite gradients propagate into p, m, v exactly as in torch; use
//!   [`grad::GradStats`] (its non-finite count) to decide to skip a step.
//! - Parameters live in one flat buffer (views), so the set of parameters is fixed at
//!   construction.

use crate::ops::{dtype_err, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{grid_x, Device, Kernel, RuntimeError, Tensor};
use std::sync::Arc;

pub mod grad;
pub mod muon;

pub use grad::{clip_grad_norm_, grad_norm, read_grad_stats, GradNorm, GradStats, GradStatsLaunch};
pub use muon::{AdjustLr, Muon, MuonGroup, MuonWithAdamW};

/// Every group's segment of the flat buffers starts at a multiple of this many elements,
/// so any kernel `BLOCK` dividing it keeps every chunk inside one group.
pub const GROUP_ALIGN: usize = 4096;
/// Columns of the per-group hyperparameter table (see `kernels-src/optim.kg`).
pub const HP_COLS: usize = 8;
/// Columns of the capturable mode's per-group table: `[lr, ln(beta1), ln(beta2), 0]`.
pub const CAP_COLS: usize = 4;
/// Capturable mode's grid when the launch names none: this many blocks per SM (a grid-
/// stride launch, so that the device counter, steps × grid in an i32, lasts 2^31 / grid
/// steps: a million on an H100).
pub const CAPTURABLE_BLOCKS_PER_SM: usize = 16;
/// At most this many steps' hyperparameter rows are uploaded at once.
pub const HP_STEPS_MAX: usize = 128;
/// The most param groups (the table is uploaded through the runtime's pinned ring, whose
/// slots hold 16 KiB: 512 rows of 8 f32).
pub const MAX_GROUPS: usize = 512;

/// One torch-style param group: hyperparameters and the shapes of its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamGroup {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    pub maximize: bool,
    /// torch's `amsgrad`: the denominator uses the largest second moment so far.
    pub amsgrad: bool,
    /// The shapes of this group's parameters, in order ([`AdamW::param`]`(group, j)`).
    pub shapes: Vec<Vec<usize>>,
}

impl ParamGroup {
    /// torch.optim.AdamW's defaults (betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2,
    /// maximize False, amsgrad False) with the given lr and no parameters yet.
    pub fn new(lr: f64) -> ParamGroup {
        ParamGroup {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            maximize: false,
            amsgrad: false,
            shapes: Vec::new(),
        }
    }

    /// torch's argument checks (`0 <= lr`, `0 <= eps`, `0 <= beta < 1`, `0 <=
    /// weight_decay`), plus finiteness.
    fn validate(&self, index: usize) -> Result<(), OpError> {
        let (b1, b2) = self.betas;
        let bad = |what: String| Err(hyper_err(format!("param group {index}: {what}")));
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return bad(format!("invalid learning rate {}", self.lr));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return bad(format!("invalid epsilon {}", self.eps));
        }
        if !(0.0..1.0).contains(&b1) {
            return bad(format!("invalid beta1 {b1} (must be in [0, 1))"));
        }
        if !(0.0..1.0).contains(&b2) {
            return bad(format!("invalid beta2 {b2} (must be in [0, 1))"));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(format!("invalid weight_decay {}", self.weight_decay));
        }
        Ok(())
    }

    /// The group's row of the kernel's table for step `t` (1 for the first step), see
    /// `kernels-src/optim.kg`: `[1 - lr*wd, beta1, ±(1 - beta1), beta2, 1 - beta2, eps,
    /// lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t)]`, each computed in f64 (the bias corrections
    /// as torch computes them, `1 - beta ** step`) and rounded to f32 once.
    pub fn hyper_row(&self, t: u64) -> [f32; HP_COLS] {
        let (b1, b2) = self.betas;
        let bc1 = 1.0 - b1.powf(t as f64);
        let bc2 = 1.0 - b2.powf(t as f64);
        let sign = if self.maximize { -1.0 } else { 1.0 };
        [
            (1.0 - self.lr * self.weight_decay) as f32,
            b1 as f32,
            (sign * (1.0 - b1)) as f32,
            b2 as f32,
            (1.0 - b2) as f32,
            self.eps as f32,
            (self.lr / bc1) as f32,
            (1.0 / bc2.sqrt()) as f32,
        ]
    }
}

/// A bad hyperparameter. `OpError` has no value variant (src/ops/mod.rs belongs to the
/// lead), so this is reported as `OpError::Shape` with op "AdamW".
fn hyper_err(what: String) -> OpError {
    shape_err("AdamW", what)
}

/// Where one parameter lives in the flat buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub offset: usize,
    pub shape: Vec<usize>,
    pub numel: usize,
}

/// One group's padded segment `[start, start + len)` of the flat buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub start: usize,
    pub len: usize,
    pub slots: Vec<Slot>,
}

/// The flat layout of a list of groups: every tensor at a multiple of `tensor_align`
/// elements, every group at a multiple of `group_align`, the total padded to a multiple
/// of `group_align` (so the chunk count is exact for any block dividing it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatLayout {
    pub len: usize,
    pub group_align: usize,
    pub segments: Vec<Segment>,
}

impl FlatLayout {
    pub fn new(
        groups: &[Vec<Vec<usize>>],
        tensor_align: usize,
        group_align: usize,
    ) -> Result<FlatLayout, OpError> {
        let overflow = || shape_err("AdamW", "the parameters overflow the address space");
        let up = |x: usize, a: usize| x.checked_next_multiple_of(a).ok_or_else(overflow);
        let mut at = 0usize;
        let mut segments = Vec::with_capacity(groups.len());
        for shapes in groups {
            let start = at;
            let mut slots = Vec::with_capacity(shapes.len());
            for shape in shapes {
                let numel = shape
                    .iter()
                    .try_fold(1usize, |a, &d| a.checked_mul(d))
                    .ok_or_else(overflow)?;
                at = up(at, tensor_align)?;
                slots.push(Slot {
                    offset: at,
                    shape: shape.clone(),
                    numel,
                });
                at = at.checked_add(numel).ok_or_else(overflow)?;
            }
            at = up(at, group_align)?;
            segments.push(Segment {
                start,
                len: at - start,
                slots,
            });
        }
        Ok(FlatLayout {
            len: at,
            group_align,
            segments,
        })
    }

    /// `block_group[c]` = the group owning chunk `c` of `block` elements (`block` must
    /// divide `group_align`).
    pub fn block_groups(&self, block: usize) -> Vec<i32> {
        let mut v = Vec::with_capacity(self.len / block);
        for (gi, s) in self.segments.iter().enumerate() {
            v.extend(std::iter::repeat_n(gi as i32, s.len / block));
        }
        v
    }
}

/// How `adamw_multi` is launched: chunk size, grid (None: one chunk per block; Some(g):
/// at most g blocks, each looping over chunks) and warps (None: the compiler's choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdamWLaunch {
    pub block: usize,
    pub grid: Option<usize>,
    pub num_warps: Option<u32>,
}

impl Default for AdamWLaunch {
    /// Measured on an H100 over the GPT-2 list (124.4M): f32 1167 us, bf16/bf16 590 us,
    /// bf16/f32 918 us per step (2.95-2.99 TB/s); block 2048 is the same, a grid-stride
    /// grid of 8 blocks/SM 3-7% slower.
    fn default() -> Self {
        AdamWLaunch {
            block: 1024,
            grid: None,
            num_warps: None,
        }
    }
}

/// Checks a chunk size: a power of two from 32 to `GROUP_ALIGN`.
pub(crate) fn check_block(block: usize) -> Result<(), OpError> {
    if block.is_power_of_two() && (32..=GROUP_ALIGN).contains(&block) {
        Ok(())
    } else {
        Err(OpError::Runtime(RuntimeError::LaunchConfig(format!(
            "block {block}: must be a power of two from 32 to {GROUP_ALIGN}"
        ))))
    }
}

/// AdamW over flat buffers; see the module docs.
pub struct AdamW {
    device: Device,
    param_dtype: DType,
    state_dtype: DType,
    groups: Vec<ParamGroup>,
    layout: FlatLayout,
    p: Tensor,
    g: Tensor,
    m: Tensor,
    v: Tensor,
    /// (param view, grad view) per group and parameter.
    views: Vec<Vec<(Tensor, Tensor)>>,
    /// `[hp_steps * groups, HP_COLS]`: the hyperparameter rows of `hp_steps` consecutive
    /// steps, uploaded together (one small copy every `hp_steps` steps, not one per step).
    hp: Tensor,
    hp_steps: usize,
    /// The first step whose rows `hp` holds; None: `hp` is stale (new lr, step count).
    hp_first_step: Option<u64>,
    block_group: Tensor,
    /// Capturable mode: the device step counter `[1]` i32 (steps done × the grid) and
    /// per group `[lr, ln(beta1), ln(beta2), 0]` (see `optim.kg`); both are also passed,
    /// unread, in the normal mode.
    count: Tensor,
    cap: Tensor,
    /// AMSGrad: `max_exp_avg_sq [N]` (state dtype) and the per-group flags `[groups]`
    /// (f32 1 on / -1 off) when some group has `amsgrad`; otherwise 1-element placeholders the
    /// kernel does not read.
    vmax: Tensor,
    ams: Tensor,
    amsgrad: bool,
    capturable: bool,
    /// Capturable mode: the counter value (in steps) and the hyperparameters the next
    /// step uploads first (after `set_capturable`, `set_lr`, `set_step_count`).
    pending_count: Option<u64>,
    cap_stale: bool,
    launch: AdamWLaunch,
    kernel: Option<Arc<Kernel>>,
    step: u64,
    step_launches: u64,
    stats: Option<GradStats>,
}

impl std::fmt::Debug for AdamW {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdamW")
            .field("param_dtype", &self.param_dtype)
            .field("state_dtype", &self.state_dtype)
            .field("groups", &self.groups.len())
            .field("len", &self.layout.len)
            .field("step", &self.step)
            .field("launch", &self.launch)
            .finish_non_exhaustive()
    }
}

impl AdamW {
    /// Allocates zeroed flat buffers on `ops`' device for the groups' parameters
    /// (parameters zero: initialize them through [`AdamW::param`] views).
    pub fn new(
        ops: &Ops,
        param_dtype: DType,
        state_dtype: DType,
        groups: Vec<ParamGroup>,
    ) -> Result<AdamW, OpError> {
        AdamW::with_launch(
            ops,
            param_dtype,
            state_dtype,
            groups,
            AdamWLaunch::default(),
        )
    }

    /// [`AdamW::new`] with a launch configuration.
    pub fn with_launch(
        ops: &Ops,
        param_dtype: DType,
        state_dtype: DType,
        groups: Vec<ParamGroup>,
        launch: AdamWLaunch,
    ) -> Result<AdamW, OpError> {
        const OP: &str = "AdamW";
        for (what, d) in [("parameter", param_dtype), ("state", state_dtype)] {
            if !matches!(d, DType::F32 | DType::F16 | DType::BF16) {
                return Err(dtype_err(
                    OP,
                    format!("{what} dtype must be f32, f16 or bf16, got {d}"),
                ));
            }
        }
        if groups.is_empty() {
            return Err(shape_err(OP, "no param groups"));
        }
        if groups.len() > MAX_GROUPS {
            return Err(shape_err(
                OP,
                format!("{} param groups; at most {MAX_GROUPS}", groups.len()),
            ));
        }
        for (i, gr) in groups.iter().enumerate() {
            gr.validate(i)?;
        }
        check_block(launch.block)?;
        // 16 bytes of the narrower of the two dtypes.
        let narrow = param_dtype.size_bytes().min(state_dtype.size_bytes()) as usize;
        let shapes: Vec<Vec<Vec<usize>>> = groups.iter().map(|g| g.shapes.clone()).collect();
        let layout = FlatLayout::new(&shapes, 16 / narrow, GROUP_ALIGN)?;
        if layout.len > i32::MAX as usize {
            return Err(shape_err(
                OP,
                format!("{} elements in all; the kernels index with i32", layout.len),
            ));
        }
        let device = ops.device().clone();
        let n = layout.len;
        let p = ops.zeros(param_dtype, &[n])?;
        let g = ops.zeros(param_dtype, &[n])?;
        let m = ops.zeros(state_dtype, &[n])?;
        let v = ops.zeros(state_dtype, &[n])?;
        let mut views = Vec::with_capacity(groups.len());
        for seg in &layout.segments {
            let mut row = Vec::with_capacity(seg.slots.len());
            for s in &seg.slots {
                let view = |t: &Tensor| t.narrow(0, s.offset, s.numel)?.reshape(&s.shape);
                row.push((view(&p)?, view(&g)?));
            }
            views.push(row);
        }
        let row_bytes = groups.len() * HP_COLS * 4;
        let hp_steps = (kgen_runtime::UPLOAD_ASYNC_MAX_BYTES / row_bytes).clamp(1, HP_STEPS_MAX);
        let hp = ops.zeros(DType::F32, &[hp_steps * groups.len(), HP_COLS])?;
        let block_group = upload_block_groups(&device, &layout, launch.block)?;
        let count = ops.zeros(DType::I32, &[1])?;
        let cap = ops.zeros(DType::F32, &[groups.len(), CAP_COLS])?;
        let amsgrad = groups.iter().any(|g| g.amsgrad);
        let (vmax, ams) = if amsgrad {
            let flags: Vec<f32> = groups
                .iter()
                .map(|g| if g.amsgrad { 1.0 } else { -1.0 })
                .collect();
            (
                ops.zeros(state_dtype, &[n])?,
                device.from_slice(&[flags.len()], &flags)?,
            )
        } else {
            (ops.zeros(state_dtype, &[1])?, ops.zeros(DType::F32, &[1])?)
        };
        Ok(AdamW {
            device,
            param_dtype,
            state_dtype,
            groups,
            layout,
            p,
            g,
            m,
            v,
            views,
            hp,
            hp_steps,
            hp_first_step: None,
            block_group,
            count,
            cap,
            vmax,
            ams,
            amsgrad,
            capturable: false,
            pending_count: None,
            cap_stale: false,
            launch,
            kernel: None,
            step: 0,
            step_launches: 0,
            stats: None,
        })
    }

    /// Parameter `j` of group `group`: a view of the flat parameter buffer.
    ///
    /// # Panics
    /// When the indices are out of range (like slice indexing).
    pub fn param(&self, group: usize, j: usize) -> Tensor {
        self.views[group][j].0.clone()
    }

    /// The gradient of [`AdamW::param`]`(group, j)`: a view of the flat gradient buffer.
    ///
    /// # Panics
    /// When the indices are out of range.
    pub fn grad(&self, group: usize, j: usize) -> Tensor {
        self.views[group][j].1.clone()
    }

    /// The flat parameter buffer `[N]` (padding included, zero).
    pub fn params_flat(&self) -> &Tensor {
        &self.p
    }

    /// The flat gradient buffer `[N]`.
    pub fn grads_flat(&self) -> &Tensor {
        &self.g
    }

    /// The flat first moments (`exp_avg`) `[N]`, for checkpoints.
    pub fn exp_avg_flat(&self) -> &Tensor {
        &self.m
    }

    /// The flat second moments (`exp_avg_sq`) `[N]`.
    pub fn exp_avg_sq_flat(&self) -> &Tensor {
        &self.v
    }

    /// AMSGrad's `max_exp_avg_sq` buffer (same layout as [`AdamW::exp_avg_sq_flat`]), when
    /// some group has `amsgrad`. Its slots of the other groups hold their `exp_avg_sq`.
    pub fn max_exp_avg_sq_flat(&self) -> Option<&Tensor> {
        self.amsgrad.then_some(&self.vmax)
    }

    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    pub fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }

    pub fn param_dtype(&self) -> DType {
        self.param_dtype
    }

    pub fn state_dtype(&self) -> DType {
        self.state_dtype
    }

    /// Steps taken (torch's `state["step"]`, shared by all parameters).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Sets the step counter (resuming from a checkpoint). In capturable mode the device
    /// counter is set by the next step (an asynchronous upload before its launch).
    pub fn set_step_count(&mut self, step: u64) {
        self.step = step;
        self.hp_first_step = None;
        if self.capturable {
            self.pending_count = Some(step);
        }
    }

    /// Capturable mode on or off (torch's `capturable`). On: the step count lives on the
    /// device (each launch advances it) and the kernel computes the bias corrections from
    /// it, so [`AdamW::step`] may be captured into a CUDA graph and replayed; the next
    /// step outside a capture uploads the counter and the hyperparameters first (a step
    /// inside a capture with those pending is an error: run one step eagerly first).
    /// [`AdamW::step_count`] then counts `step` calls only;
    /// [`AdamW::device_step_count`] reads the device's. Off: reads the device count back
    /// (one host synchronization) and continues from it. The grid must stay fixed while
    /// capturable ([`AdamW::set_launch`] is refused); the device counter holds steps ×
    /// grid in an i32, so at most 2^31 / grid steps (a million at the default grid of
    /// [`CAPTURABLE_BLOCKS_PER_SM`] blocks per SM).
    pub fn set_capturable(&mut self, ops: &Ops, on: bool) -> Result<(), OpError> {
        self.check_device(ops)?;
        if on == self.capturable {
            return Ok(());
        }
        if on {
            self.capturable = true;
            self.pending_count = Some(self.step);
            self.cap_stale = true;
        } else {
            self.step = self.device_step_count(ops)?;
            self.capturable = false;
            self.pending_count = None;
            self.hp_first_step = None;
        }
        self.kernel = None;
        Ok(())
    }

    pub fn capturable(&self) -> bool {
        self.capturable
    }

    /// The steps taken as the device counts them (capturable mode: graph replays
    /// included; one host synchronization), else [`AdamW::step_count`].
    pub fn device_step_count(&self, ops: &Ops) -> Result<u64, OpError> {
        if !self.capturable {
            return Ok(self.step);
        }
        if let Some(s) = self.pending_count {
            return Ok(s);
        }
        ops.stream().synchronize()?;
        let c = self.count.to_vec::<i32>()?[0];
        let grid = self.capturable_grid(ops) as i64;
        Ok((c as i64 / grid).max(0) as u64)
    }

    /// The grid of a capturable step (fixed for a given optimizer and device).
    fn capturable_grid(&self, ops: &Ops) -> usize {
        let nchunks = (self.layout.len / self.launch.block).max(1);
        self.launch
            .grid
            .unwrap_or(CAPTURABLE_BLOCKS_PER_SM * ops.sm_count())
            .clamp(1, nchunks)
    }

    /// Kernel launches issued by [`AdamW::step`] so far (one per step with any
    /// parameters): the debug counter behind the "one launch per step" check.
    pub fn step_launches(&self) -> u64 {
        self.step_launches
    }

    /// The learning rate of a group.
    pub fn lr(&self, group: usize) -> Option<f64> {
        self.groups.get(group).map(|g| g.lr)
    }

    /// Changes a group's learning rate from the next step on (schedulers).
    pub fn set_lr(&mut self, group: usize, lr: f64) -> Result<(), OpError> {
        let n = self.groups.len();
        let Some(g) = self.groups.get_mut(group) else {
            return Err(shape_err("AdamW", format!("param group {group} of {n}")));
        };
        let old = g.lr;
        g.lr = lr;
        if let Err(e) = g.validate(group) {
            g.lr = old;
            return Err(e);
        }
        self.hp_first_step = None;
        self.cap_stale = true;
        Ok(())
    }

    pub fn launch_config(&self) -> AdamWLaunch {
        self.launch
    }

    /// Changes the launch configuration (tuning). A new block re-uploads the chunk →
    /// group table, synchronously: call it at setup time, not per step.
    pub fn set_launch(&mut self, launch: AdamWLaunch) -> Result<(), OpError> {
        check_block(launch.block)?;
        if self.capturable {
            return Err(OpError::Runtime(RuntimeError::LaunchConfig(
                "AdamW: the launch cannot change in capturable mode (the device step \
                 counter counts in grids); set_capturable(false) first"
                    .into(),
            )));
        }
        if launch.block != self.launch.block {
            self.block_group = upload_block_groups(&self.device, &self.layout, launch.block)?;
        }
        self.launch = launch;
        self.kernel = None;
        Ok(())
    }

    /// Sets every gradient to zero (a memset of the flat buffer, queued on the stream of
    /// the `Ops` the optimizer was made with, where its buffers live).
    pub fn zero_grad(&self) -> Result<(), OpError> {
        Ok(self.g.fill_zero()?)
    }

    /// One AdamW step over every parameter: ONE kernel launch on `ops`' stream (and,
    /// every [`HP_STEPS_MAX`] steps or after a hyperparameter change, one small
    /// asynchronous upload of the hyperparameter table first); no host synchronization.
    ///
    ///
    /// Capturing it into a CUDA graph needs capturable mode ([`AdamW::set_capturable`]);
    /// otherwise it is a [`RuntimeError::Graph`]: each step reads the bias corrections of
    /// its own step count, which a replayed launch would not advance.
    pub fn step(&mut self, ops: &Ops) -> Result<(), OpError> {
        self.check_device(ops)?;
        if self.capturable {
            return self.capturable_step(ops);
        }
        if ops.stream().is_capturing() {
            return Err(OpError::Runtime(RuntimeError::Graph(
                "AdamW::step cannot be captured: every step reads the bias corrections of \
                 its own step count, which a replayed launch would not advance \
                 (AdamW::set_capturable makes it capturable)"
                    .into(),
            )));
        }
        let t = self.step + 1;
        let nchunks = self.layout.len / self.launch.block;
        if nchunks > 0 {
            let ng = self.groups.len();
            let first = match self.hp_first_step {
                Some(f) if t >= f && t < f + self.hp_steps as u64 => f,
                _ => {
                    // The rows of steps t .. t + hp_steps, in one asynchronous upload
                    // (queued after every earlier step's kernel: no row is overwritten
                    // while a kernel may still read it).
                    let mut table = Vec::with_capacity(self.hp_steps * ng * HP_COLS);
                    for k in 0..self.hp_steps as u64 {
                        for g in &self.groups {
                            table.extend_from_slice(&g.hyper_row(t + k));
                        }
                    }
                    ops.stream().upload_f32_async(&self.hp, &table)?;
                    self.hp_first_step = Some(t);
                    t
                }
            };
            let hp = self.hp.narrow(0, (t - first) as usize * ng, ng)?;
            let grid = self.launch.grid.map_or(nchunks, |g| g.clamp(1, nchunks));
            self.launch_step(ops, &hp, grid)?;
        }
        self.step = t;
        Ok(())
    }

    /// A capturable step: the uploads pending since `set_capturable` / `set_lr` /
    /// `set_step_count` (not inside a capture), then the launch, which advances the
    /// device's step counter.
    fn capturable_step(&mut self, ops: &Ops) -> Result<(), OpError> {
        let nchunks = self.layout.len / self.launch.block;
        let grid = self.capturable_grid(ops);
        if self.cap_stale || self.pending_count.is_some() {
            if ops.stream().is_capturing() {
                return Err(OpError::Runtime(RuntimeError::Graph(
                    "AdamW (capturable): the step count or hyperparameters changed; run one \
                     step outside the capture first, which uploads them"
                        .into(),
                )));
            }
            if self.cap_stale {
                let ng = self.groups.len();
                let mut rows = Vec::with_capacity(ng * HP_COLS);
                let mut cap = Vec::with_capacity(ng * CAP_COLS);
                for g in &self.groups {
                    // Columns 6 and 7 (the bias corrections) are not read in this mode.
                    rows.extend_from_slice(&g.hyper_row(1));
                    let (b1, b2) = g.betas;
                    cap.extend_from_slice(&[g.lr as f32, b1.ln() as f32, b2.ln() as f32, 0.0]);
                }
                let hp = self.hp.narrow(0, 0, ng)?;
                ops.stream().upload_f32_async(&hp, &rows)?;
                ops.stream().upload_f32_async(&self.cap, &cap)?;
                self.hp_first_step = None;
                self.cap_stale = false;
            }
            if let Some(steps) = self.pending_count.take() {
                let c = steps
                    .checked_mul(grid as u64)
                    .filter(|&c| c <= i32::MAX as u64);
                let Some(c) = c else {
                    return Err(OpError::Runtime(RuntimeError::LaunchConfig(format!(
                        "AdamW (capturable): step {steps} x grid {grid} overflows the \
                         device's i32 step counter"
                    ))));
                };
                let bytes = (c as i32).to_le_bytes();
                ops.stream().upload_async(&self.count, &bytes)?;
            }
        }
        if nchunks > 0 {
            let hp = self.hp.narrow(0, 0, self.groups.len())?;
            self.launch_step(ops, &hp, grid)?;
        }
        self.step += 1;
        Ok(())
    }

    /// Launches `adamw_multi` once over every chunk.
    fn launch_step(&mut self, ops: &Ops, hp: &Tensor, grid: usize) -> Result<(), OpError> {
        let args = KernelArgs::new()
            .tensor("p", &self.p)
            .tensor("g", &self.g)
            .tensor("m", &self.m)
            .tensor("v", &self.v)
            .tensor("block_group", &self.block_group)
            .tensor("hp", hp)
            .tensor("count", &self.count)
            .tensor("cap", &self.cap)
            .tensor("vmax", &self.vmax)
            .tensor("ams", &self.ams);
        let kernel = match &self.kernel {
            Some(k) => k.clone(),
            None => self.build_kernel(ops, &args)?,
        };
        ops.launch_args(&kernel, grid_x(grid)?, &args)?;
        self.kernel = Some(kernel);
        self.step_launches += 1;
        Ok(())
    }

    /// The global L2 norm of the gradients, on the device: `[sumsq, norm,
    /// nonfinite_count, 1.0]` (see [`grad::GradStats`]). The tensor is this optimizer's
    /// workspace, overwritten by the next call.
    pub fn grad_norm(&mut self, ops: &Ops) -> Result<Tensor, OpError> {
        self.check_device(ops)?;
        let g = self.g.clone();
        let stats = self.stats(ops)?;
        stats.compute(ops, &g, f32::INFINITY)?;
        Ok(stats.stats().clone())
    }

    /// torch's `clip_grad_norm_(params, max_norm)` over this optimizer's gradients, on
    /// the device (three launches, no host synchronization). Returns `[sumsq, norm,
    /// nonfinite_count, clip_coef]` (the workspace, overwritten by the next call).
    pub fn clip_grad_norm_(&mut self, ops: &Ops, max_norm: f32) -> Result<Tensor, OpError> {
        self.check_device(ops)?;
        let g = self.g.clone();
        let stats = self.stats(ops)?;
        stats.clip_(ops, &g, max_norm)?;
        Ok(stats.stats().clone())
    }

    fn stats(&mut self, ops: &Ops) -> Result<&GradStats, OpError> {
        if self.stats.is_none() {
            self.stats = Some(GradStats::new(ops, GradStatsLaunch::default())?);
        }
        Ok(self.stats.as_ref().expect("just set"))
    }

    fn check_device(&self, ops: &Ops) -> Result<(), OpError> {
        if ops.device().same(&self.device) {
            Ok(())
        } else {
            Err(OpError::Runtime(RuntimeError::WrongDevice(
                "AdamW: the ops handle is on another device than the optimizer".into(),
            )))
        }
    }

    /// The `adamw_multi` specialization for this optimizer's dtypes, launch and
    /// flags, and the alignments of `args` (the step's arguments).
    fn build_kernel(&self, ops: &Ops, args: &KernelArgs) -> Result<Arc<Kernel>, OpError> {
        ops.kernel(
            "optim",
            "adamw_multi",
            &[
                ("T", self.param_dtype.to_string()),
                ("S", self.state_dtype.to_string()),
                ("BLOCK", self.launch.block.to_string()),
                ("ONE_GROUP", (self.groups.len() == 1).to_string()),
                ("CAPTURABLE", self.capturable.to_string()),
                ("AMSGRAD", self.amsgrad.to_string()),
            ],
            self.launch.num_warps,
            args,
        )
    }
}

fn upload_block_groups(
    device: &Device,
    layout: &FlatLayout,
    block: usize,
) -> Result<Tensor, OpError> {
    let bg = layout.block_groups(block);
    if bg.is_empty() {
        // Nothing to update; a one-element table keeps the tensor non-empty.
        return Ok(device.from_slice(&[1], &[0i32])?);
    }
    Ok(device.from_slice(&[bg.len()], &bg)?)
}
