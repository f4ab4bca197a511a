//! The end-to-end training demo (the README's main job): a small transformer-style MLP
//! block trained with kgen ops only, forward and backward, on the GPU or the interpreter.
//!
//! Model (f32 parameters): `h = rmsnorm(x) · w_norm`, `u = linear(h, W_in)` (`[gate |
//! up]`, concatenated), `a = silu(gate) · up`, `logits = linear(a, W_out)`, loss = mean
//! cross-entropy over the non-ignored targets. The weights are stored `[in, out]` and
//! passed to `Ops::linear` / `Ops::linear_backward` as their transposes (torch's
//! `[out, in]` layout, free views). Backward by hand with the ops' backward kernels;
//! the gradients land directly in the optimizer's flat gradient buffer (each
//! parameter's gradient is a view of it: a weight's gradient is written through the
//! same transposed view). Then `clip_grad_norm_` (on the device) and one fused AdamW
//! launch for all parameters, two parameter groups (matrices with weight decay, the norm
//! weight without).
//!
//! Data: a fixed random "teacher" `W_t` labels random inputs with `argmax(x @ W_t)`; one
//! target in eight is `ignore_index`. A fresh batch every step, so the loss going down
//! means the model learns the teacher, not the batch.

use crate::ops::gemm::Activation;
use crate::ops::{OpError, Ops};
use crate::optim::{AdamW, MuonGroup, MuonWithAdamW, ParamGroup};
use crate::rng::Rng;
use kgen_core::types::DType;
use kgen_runtime::{Device, Tensor};

/// Sizes and schedule of the demo.
#[derive(Clone, Copy, Debug)]
pub struct TrainConfig {
    pub batch: usize,
    pub dim: usize,
    pub hidden: usize,
    pub classes: usize,
    pub steps: usize,
    pub lr: f64,
    pub log_every: usize,
    pub seed: u64,
    /// Muon (lr [`TrainConfig::muon_lr`]) on the two weight matrices and AdamW on the norm
    /// weight, through [`MuonWithAdamW`]; otherwise AdamW on everything.
    pub muon: bool,
    pub muon_lr: f64,
}

impl TrainConfig {
    /// Small enough for the interpreter (a few seconds).
    pub fn small() -> TrainConfig {
        TrainConfig {
            batch: 64,
            dim: 32,
            hidden: 64,
            classes: 16,
            steps: 200,
            lr: 1e-2,
            log_every: 20,
            seed: 1,
            muon: false,
            muon_lr: 0.05,
        }
    }

    /// A bigger model for a GPU.
    pub fn gpu() -> TrainConfig {
        TrainConfig {
            batch: 1024,
            dim: 256,
            hidden: 512,
            classes: 64,
            steps: 300,
            lr: 3e-3,
            log_every: 25,
            seed: 1,
            muon: false,
            muon_lr: 0.05,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct TrainReport {
    /// (step, mean loss) at every logged step.
    pub losses: Vec<(usize, f64)>,
    /// Final accuracy on a fresh batch (non-ignored targets).
    pub accuracy: f64,
    /// The whole run.
    pub seconds: f64,
    /// Step 1 alone: it compiles, loads and tunes every kernel the step uses.
    pub first_step_seconds: f64,
}

const IGNORE: i64 = -100;

struct Batch {
    x: Tensor,
    targets: Tensor,
    labels: Vec<i64>,
}

fn batch(
    device: &Device,
    rng: &mut Rng,
    teacher: &[f64],
    cfg: &TrainConfig,
) -> Result<Batch, OpError> {
    let (b, d, c) = (cfg.batch, cfg.dim, cfg.classes);
    let xs: Vec<f64> = (0..b * d).map(|_| rng.normalish()).collect();
    // The host-side labelling was most of a GPU step's time: rows in parallel, each
    // z = x_r @ W_t accumulated row of W_t by row (contiguous, so it vectorizes).
    let mut labels = vec![0i64; b];
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(16);
    let rows_per_thread = b.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (chunk, out) in xs
            .chunks(rows_per_thread * d)
            .zip(labels.chunks_mut(rows_per_thread))
        {
            scope.spawn(move || {
                let mut z = vec![0.0f64; c];
                for (x_r, label) in chunk.chunks_exact(d).zip(out.iter_mut()) {
                    z.fill(0.0);
                    for (&xi, t_i) in x_r.iter().zip(teacher.chunks_exact(c)) {
                        for (zk, &t) in z.iter_mut().zip(t_i) {
                            *zk += xi * t;
                        }
                    }
                    let mut best = (f64::MIN, 0usize);
                    for (k, &zk) in z.iter().enumerate() {
                        if zk > best.0 {
                            best = (zk, k);
                        }
                    }
                    *label = best.1 as i64;
                }
            });
        }
    });
    for label in labels.iter_mut().skip(7).step_by(8) {
        *label = IGNORE;
    }
    Ok(Batch {
        x: device.from_f64(DType::F32, &[b, d], &xs)?,
        targets: device.from_slice(&[b], &labels)?,
        labels,
    })
}

/// Trains; `log` receives each logged (step, loss).
pub fn train(
    device: &Device,
    cfg: &TrainConfig,
    mut log: impl FnMut(usize, f64),
) -> Result<TrainReport, OpError> {
    let start = std::time::Instant::now();
    let ops = Ops::new(device);
    let (b, d, f, c) = (cfg.batch, cfg.dim, cfg.hidden, cfg.classes);
    let mut rng = Rng::new(cfg.seed);
    let teacher: Vec<f64> = (0..d * c).map(|_| rng.normalish()).collect();

    let mut opt = Optimizer::new(&ops, cfg)?;
    let (w_in, w_out, w_norm) = (opt.param(0)?, opt.param(1)?, opt.param(2)?);
    let (g_in, g_out, g_norm) = (opt.grad(0)?, opt.grad(1)?, opt.grad(2)?);
    // The linear layers' weights and their gradients in torch's [out, in] layout: views.
    let (lin_in, lin_out) = (w_in.transpose(0, 1)?, w_out.transpose(0, 1)?);
    let (dlin_in, dlin_out) = (g_in.transpose(0, 1)?, g_out.transpose(0, 1)?);
    // Init: N(0, 1/fan_in) matrices, ones for the norm weight.
    let init = |rows: usize, cols: usize, rng: &mut Rng| -> Vec<f64> {
        let s = 1.0 / (rows as f64).sqrt();
        (0..rows * cols).map(|_| rng.normalish() * s).collect()
    };
    opt.init(0, d, 2 * f, &init(d, 2 * f, &mut rng))?;
    opt.init(1, f, c, &init(f, c, &mut rng))?;
    w_norm.copy_from_host(&kgen_core::host::HostTensor::from_f64(
        DType::F32,
        &[d],
        &vec![1.0; d],
    ))?;

    // Activations and their gradients, allocated once.
    let h = ops.empty(DType::F32, &[b, d])?;
    let rstd = ops.empty(DType::F32, &[b])?;
    let u = ops.empty(DType::F32, &[b, 2 * f])?;
    let a = ops.empty(DType::F32, &[b, f])?;
    let logits = ops.empty(DType::F32, &[b, c])?;
    let dlogits = ops.empty(DType::F32, &[b, c])?;
    let da = ops.empty(DType::F32, &[b, f])?;
    let du = ops.empty(DType::F32, &[b, 2 * f])?;
    let dh = ops.empty(DType::F32, &[b, d])?;
    let dx = ops.empty(DType::F32, &[b, d])?;
    let loss = ops.empty(DType::F32, &[1])?;
    let row_loss = ops.empty(DType::F32, &[b])?;
    let loss_stats = ops.empty(DType::F32, &[2])?;

    let mut losses = Vec::new();
    let mut first_step_seconds = 0.0;
    for step in 1..=cfg.steps {
        opt.set_lr_scale(cfg, lr_scale(step, cfg.steps))?;
        let batch = batch(device, &mut rng, &teacher, cfg)?;
        // Forward.
        ops.rmsnorm_into(&batch.x, &w_norm, &h, &rstd, 1e-6)?;
        ops.linear_into(&h, &lin_in, None, Activation::None, &u)?;
        ops.swiglu_concat_into(&u, &a)?;
        ops.linear_into(&a, &lin_out, None, Activation::None, &logits)?;
        ops.cross_entropy_into(
            &logits,
            &batch.targets,
            IGNORE,
            &loss,
            &dlogits,
            &row_loss,
            &loss_stats,
        )?;
        // Backward, gradients straight into the optimizer's buffer.
        let no_act = Activation::None;
        ops.linear_backward_into(&dlogits, &a, &lin_out, None, no_act, &da, &dlin_out, None)?;
        ops.swiglu_concat_backward_into(&u, &da, &du)?;
        ops.linear_backward_into(&du, &h, &lin_in, None, no_act, &dh, &dlin_in, None)?;
        ops.rmsnorm_backward_into(&batch.x, &w_norm, &rstd, &dh, &dx, &g_norm)?;
        // Update.
        opt.step(&ops)?;
        if step % cfg.log_every == 0 || step == 1 || step == cfg.steps {
            // Reading the loss is the only host synchronization of a step.
            let l = loss.to_f64_vec()?[0];
            if step == 1 {
                first_step_seconds = start.elapsed().as_secs_f64();
            }
            log(step, l);
            losses.push((step, l));
        }
    }
    // Accuracy on a fresh batch.
    let batch = batch(device, &mut rng, &teacher, cfg)?;
    ops.rmsnorm_into(&batch.x, &w_norm, &h, &rstd, 1e-6)?;
    ops.linear_into(&h, &lin_in, None, Activation::None, &u)?;
    ops.swiglu_concat_into(&u, &a)?;
    ops.linear_into(&a, &lin_out, None, Activation::None, &logits)?;
    let z = logits.to_f64_vec()?;
    let (mut right, mut total) = (0usize, 0usize);
    for (r, &label) in batch.labels.iter().enumerate() {
        if label == IGNORE {
            continue;
        }
        let row = &z[r * c..(r + 1) * c];
        let pred = (0..c).fold(0, |best, k| if row[k] > row[best] { k } else { best });
        right += (pred as i64 == label) as usize;
        total += 1;
    }
    Ok(TrainReport {
        losses,
        accuracy: right as f64 / total.max(1) as f64,
        seconds: start.elapsed().as_secs_f64(),
        first_step_seconds,
    })
}

/// The learning-rate schedule (modded-nanogpt's shape): constant for the first 60% of
/// the steps, then linear down to 10% at the last step.
pub fn lr_scale(step: usize, steps: usize) -> f64 {
    let start = 0.6 * steps as f64;
    let s = step as f64;
    if s <= start || steps <= 1 {
        1.0
    } else {
        1.0 - 0.9 * (s - start) / (steps as f64 - start)
    }
}

/// AdamW on everything, or Muon on the matrices and AdamW on the norm weight.
enum Optimizer {
    AdamW(Box<AdamW>),
    Muon(Box<MuonWithAdamW>),
}

impl Optimizer {
    fn new(ops: &Ops, cfg: &TrainConfig) -> Result<Optimizer, OpError> {
        let (d, f, c) = (cfg.dim, cfg.hidden, cfg.classes);
        let norm = ParamGroup {
            shapes: vec![vec![d]],
            weight_decay: 0.0,
            ..ParamGroup::new(cfg.lr)
        };
        if cfg.muon {
            // torch's [out, in] shapes, so that Muon's lr adjustment sees them as torch
            // would; the model uses their transposes, [in, out].
            let matrices = MuonGroup {
                shapes: vec![[2 * f, d], [c, f]],
                weight_decay: 0.01,
                ..MuonGroup::new(cfg.muon_lr)
            };
            return Ok(Optimizer::Muon(Box::new(MuonWithAdamW::new(
                ops,
                DType::F32,
                vec![matrices],
                vec![norm],
            )?)));
        }
        let groups = vec![
            ParamGroup {
                shapes: vec![vec![d, 2 * f], vec![f, c]],
                weight_decay: 0.01,
                ..ParamGroup::new(cfg.lr)
            },
            norm,
        ];
        let adamw = AdamW::new(ops, DType::F32, DType::F32, groups)?;
        Ok(Optimizer::AdamW(Box::new(adamw)))
    }

    /// Every group's learning rate: the configured one (`cfg.lr`, Muon's `cfg.muon_lr`)
    /// times `scale` (a change only re-uploads the optimizers' small hyperparameter
    /// tables, asynchronously).
    fn set_lr_scale(&mut self, cfg: &TrainConfig, scale: f64) -> Result<(), OpError> {
        let adamw = match self {
            Optimizer::AdamW(o) => o.as_mut(),
            Optimizer::Muon(o) => {
                for g in 0..o.muon.groups().len() {
                    o.muon.set_lr(g, cfg.muon_lr * scale)?;
                }
                &mut o.adamw
            }
        };
        for g in 0..adamw.groups().len() {
            adamw.set_lr(g, cfg.lr * scale)?;
        }
        Ok(())
    }

    /// Parameter `i` (0: W_in, 1: W_out, 2: the norm weight) in the model's layout
    /// (`[in, out]` matrices).
    fn param(&self, i: usize) -> Result<Tensor, OpError> {
        self.view(i, false)
    }

    /// Writes matrix `i`'s initial values, given in the model's `[rows, cols]` layout.
    fn init(&self, i: usize, rows: usize, cols: usize, v: &[f64]) -> Result<(), OpError> {
        let (t, shape, vals) = match self {
            Optimizer::AdamW(o) => (o.param(0, i), [rows, cols], v.to_vec()),
            Optimizer::Muon(o) => {
                // Muon stores torch's [out, in]: the transpose.
                let mut tv = vec![0.0; v.len()];
                for r in 0..rows {
                    for c in 0..cols {
                        tv[c * rows + r] = v[r * cols + c];
                    }
                }
                (o.muon.param(0, i)?, [cols, rows], tv)
            }
        };
        let h = kgen_core::host::HostTensor::from_f64(DType::F32, &shape, &vals);
        Ok(t.copy_from_host(&h)?)
    }

    fn grad(&self, i: usize) -> Result<Tensor, OpError> {
        self.view(i, true)
    }

    fn view(&self, i: usize, grad: bool) -> Result<Tensor, OpError> {
        Ok(match (self, i) {
            (Optimizer::AdamW(o), 2) if grad => o.grad(1, 0),
            (Optimizer::AdamW(o), 2) => o.param(1, 0),
            (Optimizer::AdamW(o), _) if grad => o.grad(0, i),
            (Optimizer::AdamW(o), _) => o.param(0, i),
            (Optimizer::Muon(o), 2) if grad => o.adamw.grad(0, 0),
            (Optimizer::Muon(o), 2) => o.adamw.param(0, 0),
            (Optimizer::Muon(o), _) if grad => o.muon.grad(0, i)?.transpose(0, 1)?,
            (Optimizer::Muon(o), _) => o.muon.param(0, i)?.transpose(0, 1)?,
        })
    }

    /// `clip_grad_norm_(1.0)` over AdamW's gradients (Muon normalizes its own), then
    /// the step.
    fn step(&mut self, ops: &Ops) -> Result<(), OpError> {
        match self {
            Optimizer::AdamW(o) => {
                o.clip_grad_norm_(ops, 1.0)?;
                o.step(ops)
            }
            Optimizer::Muon(o) => {
                o.adamw.clip_grad_norm_(ops, 1.0)?;
                o.step(ops)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loss goes down on the interpreter and the model beats chance by far.
    #[test]
    fn loss_goes_down_on_the_interpreter() {
        let cfg = TrainConfig {
            steps: 60,
            ..TrainConfig::small()
        };
        let r = train(&Device::interpreter(), &cfg, |_, _| {}).unwrap();
        let first = r.losses.first().unwrap().1;
        let last = r.losses.last().unwrap().1;
        assert!(first.is_finite() && last.is_finite());
        assert!(last < 0.6 * first, "loss {first} -> {last}");
        assert!(
            r.accuracy > 3.0 / cfg.classes as f64,
            "accuracy {}",
            r.accuracy
        );
    }

    /// With Muon on the matrices (MuonWithAdamW), the loss goes down at least as fast
    /// as with AdamW alone over the same steps and batches.
    #[test]
    fn muon_learns_at_least_as_fast_as_adamw_on_the_interpreter() {
        let cfg = TrainConfig {
            steps: 60,
            ..TrainConfig::small()
        };
        let d = Device::interpreter();
        let adamw = train(&d, &cfg, |_, _| {}).unwrap();
        let muon = train(&d, &TrainConfig { muon: true, ..cfg }, |_, _| {}).unwrap();
        let (a, m) = (
            adamw.losses.last().unwrap().1,
            muon.losses.last().unwrap().1,
        );
        assert!(m.is_finite() && m <= a, "final loss: Muon {m}, AdamW {a}");
    }
}
