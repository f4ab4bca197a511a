//! `Muon` (torch.optim.Muon's algorithm) over flat buffers grouped by shape, and
//! [`MuonWithAdamW`]: Muon on the hidden matrices and the fused AdamW on the rest, in one
//! `step()`.
//!
//! # The algorithm (torch 2.9+ `torch/optim/_muon.py`, per 2-D parameter)
//! ```text
//! buf = lerp(buf, g, 1 - momentum)                    (buf starts at zero)
//! u   = lerp(g, buf, momentum) if nesterov else buf
//! o   = newton_schulz(u, ns_coefficients, ns_steps, eps)   (bf16, wide orientation)
//! p   = p * (1 - lr * weight_decay) - adjusted_lr * o
//! adjusted_lr = lr * sqrt(max(1, rows / cols))        ("original", the default)
//!             = lr * 0.2 * sqrt(max(rows, cols))      ("match_rms_adamw")
//! ```
//!
//! # Layout and launches
//! Parameters, gradients and momentum live in three flat device buffers. Matrices whose
//! Newton–Schulz is the same computation (the same wide shape `m x n` and the same
//! schedule and eps) form one *bucket*: their iterations are one batched launch per
//! product (`ops/newton_schulz.rs`), 3 per step. Inside a bucket, the matrices stored
//! with the same shape and momentum settings form a *run*, laid out contiguously so that
//! the memory-bound launches (momentum + bf16 cast + partial norms, the final update) take
//! the run as one `[k, rows, cols]` tensor. GPT-2 small's 48 matrices are 3 buckets
//! (768 x 768, 768 x 2304, 768 x 3072: c_fc `[3072, 768]` and the MLP projection
//! `[768, 3072]` share one, the first read through its transpose) and 4 runs: 4 + 42 + 4 =
//! 50 launches per step, whatever the batch size (the last update of each run writes its
//! parameters itself: `ns_update_emit`). No host synchronization; the
//! per-matrix `(1 - lr * wd, -adjusted_lr)` rows are uploaded (asynchronously) only at the
//! first step and after [`Muon::set_lr`], so a step is the same launches every time and a
//! CUDA graph can capture it (after one eager step, which compiles and tunes).
//!
//! # Differences from `torch.optim.Muon`
//! - The momentum buffer is f32 whatever the parameter dtype (torch: the parameter's).
//! - The normalization is applied inside the first step's products, in f32:
//!   `A = s^2 X0 X0^T` and `X1 = s (a X0 + B X0)` with `s = 1 / max(||X0||, eps)` from the
//!   bf16-rounded X0 (torch rounds `X0 / ||X0||` to bf16 first, with a bf16 norm).
//! - `X = a X + B X` is computed as `(a I + B) X`: `a` is added to B's diagonal in f32
//!   before B is rounded to bf16 (torch's `addmm` adds `a X` in f32), so B's diagonal
//!   rounds at a's magnitude (`kernels-src/ns.kg`).
//! - The Newton–Schulz products accumulate in f32 and round A, B and X to bf16 once per
//!   product (torch: the same through cuBLAS; `addmm`'s epilogue is also f32).
//! - Hyperparameters are host numbers; one set of parameters fixed at construction (flat
//!   buffers); every parameter is updated each step (no "grad is None, skip").

use crate::ops::newton_schulz::{ns_schedule, orient, EmitTo, Momentum, NsWork, NS_EPS, QUINTIC};
use crate::ops::{shape_err, OpError, Ops};
use crate::optim::{AdamW, ParamGroup};
use kgen_core::types::DType;
use kgen_runtime::Tensor;

/// torch.optim.Muon's `adjust_lr_fn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AdjustLr {
    /// `lr * sqrt(max(1, rows / cols))` (torch's default, `None` or "original").
    #[default]
    Original,
    /// `lr * 0.2 * sqrt(max(rows, cols))`: an update RMS like AdamW's.
    MatchRmsAdamW,
}

impl AdjustLr {
    /// The learning rate applied to a `[rows, cols]` parameter's update.
    pub fn adjusted(self, lr: f64, rows: usize, cols: usize) -> f64 {
        let (r, c) = (rows as f64, cols as f64);
        match self {
            AdjustLr::Original => lr * (r / c).max(1.0).sqrt(),
            AdjustLr::MatchRmsAdamW => lr * 0.2 * r.max(c).sqrt(),
        }
    }
}

/// One param group: torch.optim.Muon's hyperparameters and the shapes of its matrices.
#[derive(Clone, Debug, PartialEq)]
pub struct MuonGroup {
    pub lr: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub nesterov: bool,
    /// One `(a, b, c)` for every step, or one per step (e.g. Polar Express).
    pub ns_coefficients: Vec<(f32, f32, f32)>,
    pub ns_steps: usize,
    pub eps: f64,
    pub adjust_lr: AdjustLr,
    /// `[rows, cols]` of each parameter, in order ([`Muon::param`]`(group, j)`).
    pub shapes: Vec<[usize; 2]>,
}

impl MuonGroup {
    /// torch.optim.Muon's defaults (weight_decay 0.1, momentum 0.95, Nesterov, the
    /// quintic coefficients, 5 steps, eps 1e-7, "original" lr adjustment) with `lr`.
    pub fn new(lr: f64) -> MuonGroup {
        MuonGroup {
            lr,
            weight_decay: 0.1,
            momentum: 0.95,
            nesterov: true,
            ns_coefficients: vec![QUINTIC],
            ns_steps: 5,
            eps: NS_EPS as f64,
            adjust_lr: AdjustLr::Original,
            shapes: Vec::new(),
        }
    }

    fn validate(&self, i: usize) -> Result<Vec<(f32, f32, f32)>, OpError> {
        let bad = |w: String| Err(shape_err("muon", format!("param group {i}: {w}")));
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return bad(format!("invalid learning rate {}", self.lr));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(format!("invalid weight_decay {}", self.weight_decay));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return bad(format!(
                "invalid momentum {} (must be in [0, 1))",
                self.momentum
            ));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return bad(format!("invalid eps {}", self.eps));
        }
        if let Some(s) = self.shapes.iter().find(|s| s[0] == 0 || s[1] == 0) {
            return bad(format!(
                "an empty matrix {s:?} (Muon updates matrices of at least 1 x 1)"
            ));
        }
        if self.ns_steps >= 100 {
            return bad(format!(
                "ns_steps {} (torch allows fewer than 100)",
                self.ns_steps
            ));
        }
        ns_schedule(&self.ns_coefficients, self.ns_steps)
    }
}

/// A run: matrices of one stored shape and momentum setting, contiguous in the flat
/// buffers, inside one bucket.
struct Run {
    rows: usize,
    cols: usize,
    mu: f32,
    nesterov: bool,
    /// Element offset of the run in the flat buffers, and its matrices (group, index).
    offset: usize,
    members: Vec<(usize, usize)>,
    /// Its first matrix's index in the bucket's batch.
    first: usize,
    /// `[k, 2]` f32: `(1 - lr * wd, -adjusted_lr)` per matrix.
    hp: Tensor,
}

/// Matrices whose Newton–Schulz is one batched computation.
struct Bucket {
    work: NsWork,
    sched: Vec<(f32, f32, f32)>,
    eps: f32,
    runs: Vec<Run>,
}

/// Where a parameter lives.
#[derive(Clone, Copy)]
struct Slot {
    offset: usize,
    rows: usize,
    cols: usize,
}

/// torch.optim.Muon over flat buffers (see the module docs).
pub struct Muon {
    groups: Vec<MuonGroup>,
    dtype: DType,
    p: Tensor,
    g: Tensor,
    buf: Tensor,
    slots: Vec<Vec<Slot>>,
    buckets: Vec<Bucket>,
    hp_dirty: bool,
    launches: u64,
}

/// Every run starts at a multiple of this many elements (256 bytes of f32).
const RUN_ALIGN: usize = 64;

impl Muon {
    /// A Muon optimizer for the groups' matrices, parameters and gradients of `dtype`
    /// (f32, f16 or bf16), all zero (write the initial values into [`Muon::param`]).
    pub fn new(ops: &Ops, dtype: DType, groups: Vec<MuonGroup>) -> Result<Muon, OpError> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(crate::ops::dtype_err(
                "muon",
                format!("float parameters, not {dtype}"),
            ));
        }
        let mut scheds = Vec::new();
        for (i, gr) in groups.iter().enumerate() {
            scheds.push(gr.validate(i)?);
        }
        // Bucket key: wide shape, schedule, eps. Run key: stored shape, momentum.
        type BKey = (usize, usize, Vec<(u32, u32, u32)>, u64);
        let mut bkeys: Vec<BKey> = Vec::new();
        // Per bucket: (rows, cols, momentum bits, nesterov, members).
        type RKey = (usize, usize, u64, bool, Vec<(usize, usize)>);
        let mut runs: Vec<Vec<RKey>> = Vec::new();
        for (gi, gr) in groups.iter().enumerate() {
            let bits: Vec<(u32, u32, u32)> = scheds[gi]
                .iter()
                .map(|&(a, b, c)| (a.to_bits(), b.to_bits(), c.to_bits()))
                .collect();
            for (j, &[r, c]) in gr.shapes.iter().enumerate() {
                let key = (
                    r.min(c),
                    r.max(c),
                    bits.clone(),
                    (gr.eps as f32).to_bits() as u64,
                );
                let bi = match bkeys.iter().position(|k| *k == key) {
                    Some(b) => b,
                    None => {
                        bkeys.push(key);
                        runs.push(Vec::new());
                        bkeys.len() - 1
                    }
                };
                let mu = (gr.momentum as f32).to_bits() as u64;
                let rl = &mut runs[bi];
                match rl
                    .iter_mut()
                    .find(|x| (x.0, x.1, x.2, x.3) == (r, c, mu, gr.nesterov))
                {
                    Some(x) => x.4.push((gi, j)),
                    None => rl.push((r, c, mu, gr.nesterov, vec![(gi, j)])),
                }
            }
        }
        let mut slots: Vec<Vec<Slot>> = groups
            .iter()
            .map(|g| {
                vec![
                    Slot {
                        offset: 0,
                        rows: 0,
                        cols: 0,
                    };
                    g.shapes.len()
                ]
            })
            .collect();
        let mut total = 0usize;
        let mut buckets = Vec::new();
        for (bi, rl) in runs.into_iter().enumerate() {
            let (m, n) = (bkeys[bi].0, bkeys[bi].1);
            let k: usize = rl.iter().map(|x| x.4.len()).sum();
            let first_group = rl[0].4[0].0;
            let work = NsWork::new(ops, DType::BF16, k, m, n)?;
            let mut brun = Vec::new();
            let mut first = 0;
            for (r, c, mu, nesterov, members) in rl {
                total = total.next_multiple_of(RUN_ALIGN);
                let offset = total;
                for (idx, &(gi, j)) in members.iter().enumerate() {
                    slots[gi][j] = Slot {
                        offset: offset + idx * r * c,
                        rows: r,
                        cols: c,
                    };
                }
                total += members.len() * r * c;
                brun.push(Run {
                    rows: r,
                    cols: c,
                    mu: f32::from_bits(mu as u32),
                    nesterov,
                    offset,
                    hp: ops.zeros(DType::F32, &[members.len(), 2])?,
                    members,
                    first,
                });
                first += brun.last().map_or(0, |x: &Run| x.members.len());
            }
            buckets.push(Bucket {
                work,
                sched: scheds[first_group].clone(),
                eps: groups[first_group].eps as f32,
                runs: brun,
            });
        }
        let n = total.max(1);
        Ok(Muon {
            p: ops.zeros(dtype, &[n])?,
            g: ops.zeros(dtype, &[n])?,
            buf: ops.zeros(DType::F32, &[n])?,
            groups,
            dtype,
            slots,
            buckets,
            hp_dirty: true,
            launches: 0,
        })
    }

    fn view(&self, t: &Tensor, group: usize, j: usize) -> Result<Tensor, OpError> {
        let s = self
            .slots
            .get(group)
            .and_then(|g| g.get(j))
            .ok_or_else(|| shape_err("muon", format!("no parameter ({group}, {j})")))?;
        Ok(t.narrow(0, s.offset, s.rows * s.cols)?
            .reshape(&[s.rows, s.cols])?)
    }

    /// Parameter `j` of `group`: a `[rows, cols]` view of the flat parameter buffer.
    pub fn param(&self, group: usize, j: usize) -> Result<Tensor, OpError> {
        self.view(&self.p, group, j)
    }

    /// Its gradient: the same view of the flat gradient buffer (write gradients here).
    pub fn grad(&self, group: usize, j: usize) -> Result<Tensor, OpError> {
        self.view(&self.g, group, j)
    }

    /// Its momentum buffer (f32).
    pub fn momentum_buffer(&self, group: usize, j: usize) -> Result<Tensor, OpError> {
        self.view(&self.buf, group, j)
    }

    pub fn params_flat(&self) -> &Tensor {
        &self.p
    }

    pub fn grads_flat(&self) -> &Tensor {
        &self.g
    }

    pub fn groups(&self) -> &[MuonGroup] {
        &self.groups
    }

    pub fn param_dtype(&self) -> DType {
        self.dtype
    }

    /// How many batched Newton–Schulz computations a step runs.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Kernel launches queued by the steps so far (a debug counter for tests).
    pub fn step_launches(&self) -> u64 {
        self.launches
    }

    /// Sets a group's learning rate, from the next step on.
    pub fn set_lr(&mut self, group: usize, lr: f64) -> Result<(), OpError> {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(shape_err("muon", format!("invalid learning rate {lr}")));
        }
        let g = self
            .groups
            .get_mut(group)
            .ok_or_else(|| shape_err("muon", format!("no param group {group}")))?;
        g.lr = lr;
        self.hp_dirty = true;
        Ok(())
    }

    /// Zeroes the gradients (a memset of the flat buffer).
    pub fn zero_grad(&self) -> Result<(), OpError> {
        Ok(self.g.fill_zero()?)
    }

    /// One Muon step over every parameter; no host synchronization.
    pub fn step(&mut self, ops: &Ops) -> Result<(), OpError> {
        if self.hp_dirty {
            for b in &self.buckets {
                for r in &b.runs {
                    let mut rows = Vec::with_capacity(2 * r.members.len());
                    for &(gi, _) in &r.members {
                        let g = &self.groups[gi];
                        rows.push((1.0 - g.lr * g.weight_decay) as f32);
                        rows.push(-g.adjust_lr.adjusted(g.lr, r.rows, r.cols) as f32);
                    }
                    ops.stream().upload_f32_async(&r.hp, &rows)?;
                }
            }
            self.hp_dirty = false;
        }
        let mut launches = 0;
        for b in &mut self.buckets {
            for r in &b.runs {
                let g = orient("muon", &r_view(&self.g, r)?)?;
                let buf = r_view(&self.buf, r)?;
                ops.ns_prep_run(
                    &b.work,
                    r.first,
                    &g,
                    Some(Momentum {
                        buf: &buf,
                        mu: r.mu,
                        nesterov: r.nesterov,
                    }),
                )?;
                launches += 1;
            }
            // The last update of each run goes straight into its parameters.
            let to = b
                .runs
                .iter()
                .map(|r| {
                    Ok(EmitTo {
                        first: r.first,
                        p: orient("muon", &r_view(&self.p, r)?)?,
                        hp: Some(&r.hp),
                    })
                })
                .collect::<Result<Vec<_>, OpError>>()?;
            ops.ns_iterate_into(&mut b.work, &b.sched, b.eps, &to)?;
            launches += 3 * b.sched.len() as u64 - 1 + b.runs.len() as u64;
        }
        self.launches += launches;
        Ok(())
    }
}

/// A run's `[k, rows, cols]` view of a flat buffer.
fn r_view(t: &Tensor, r: &Run) -> Result<Tensor, OpError> {
    let k = r.members.len();
    Ok(t.narrow(0, r.offset, k * r.rows * r.cols)?
        .reshape(&[k, r.rows, r.cols])?)
}

/// Muon on the hidden matrices and the fused multi-tensor AdamW on everything else
/// (embeddings, norms, biases, the head), stepped together (seed optim-adamw-muon.md,
/// nanochat, modded-nanogpt).
pub struct MuonWithAdamW {
    pub muon: Muon,
    pub adamw: AdamW,
}

impl MuonWithAdamW {
    /// Both optimizers, parameters of `dtype` (AdamW's states f32).
    pub fn new(
        ops: &Ops,
        dtype: DType,
        muon_groups: Vec<MuonGroup>,
        adamw_groups: Vec<ParamGroup>,
    ) -> Result<MuonWithAdamW, OpError> {
        Ok(MuonWithAdamW {
            muon: Muon::new(ops, dtype, muon_groups)?,
            adamw: AdamW::new(ops, dtype, DType::F32, adamw_groups)?,
        })
    }

    /// One step of both.
    pub fn step(&mut self, ops: &Ops) -> Result<(), OpError> {
        self.muon.step(ops)?;
        self.adamw.step(ops)
    }

    /// Zeroes both optimizers' gradients.
    pub fn zero_grad(&self) -> Result<(), OpError> {
        self.muon.zero_grad()?;
        self.adamw.zero_grad()
    }
}
