//! The training loop, the validation loss, sampling, and the files for the PyTorch twin.

use super::data::{fixed_batches, write_npy_i64, Batch, Batches, Corpus, SplitMix};
use super::model::{backward, forward, Acts, GradBufs, Model};
use super::params::Params;
use super::{GptConfig, GptError};
use crate::ops::Ops;
use kgen_core::types::DType;
use kgen_runtime::Device;
use std::path::PathBuf;
use std::time::Instant;

/// Steps whose batches and losses `--dump-batches` writes (what the twin compares).
pub const DUMP_STEPS: usize = 20;

/// Extra outputs of a run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Write the initial weights, the first [`DUMP_STEPS`] batches, their losses, the
    /// configuration and the measured tokens/s here (for `bench/gpt_torch.py`).
    pub dump: Option<PathBuf>,
    /// Also sample before training (the untrained model's text, for comparison).
    pub sample_before: bool,
}

/// A prompt and the model's continuation.
#[derive(Clone, Debug)]
pub struct Sample {
    pub prompt: String,
    pub text: String,
}

/// What [`train`] reports as it goes.
#[derive(Clone, Debug)]
pub enum Event {
    /// Before the first step.
    Start { params: usize, device: String },
    /// The mean training loss of the steps since the last report, and their throughput
    /// (step 1 alone: it compiles, loads and tunes every kernel it uses).
    Step {
        step: usize,
        loss: f64,
        tokens_per_s: f64,
        ms_per_step: f64,
    },
    /// The loss over the fixed validation batches (step 0: before training).
    Eval { step: usize, loss: f64 },
    /// Samples after `step` steps.
    Samples { step: usize, samples: Vec<Sample> },
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct GptReport {
    /// Every step's training loss.
    pub step_losses: Vec<f64>,
    /// (step, validation loss), step 0 first.
    pub val_losses: Vec<(usize, f64)>,
    /// Tokens per second over steps 2.. (evaluations and sampling excluded).
    pub tokens_per_s: f64,
    /// The whole run.
    pub seconds: f64,
    /// Step 1 alone (the compilation, loading and tuning of the kernels the forward and
    /// evaluation before it did not already use included).
    pub first_step_seconds: f64,
    pub samples: Vec<Sample>,
}

/// Trains `cfg`'s model on `corpus`; `on` receives each [`Event`].
pub fn train(
    device: &Device,
    cfg: &GptConfig,
    corpus: &Corpus,
    opts: &RunOptions,
    mut on: impl FnMut(&Event),
) -> Result<GptReport, GptError> {
    cfg.validate()?;
    let need = cfg.seq + 1;
    if corpus.train.len() < need || corpus.val.len() < need.max(cfg.prompt_len + 1) {
        return Err(GptError::Data(format!(
            "{}: {} training and {} validation bytes; a window needs {need}",
            corpus.source,
            corpus.train.len(),
            corpus.val.len()
        )));
    }
    let start = Instant::now();
    let ops = Ops::new(device);
    let model = Model::new(device, cfg)?;
    let mut params = Params::new(&ops, cfg)?;
    params.init(cfg.seed)?;
    if let Some(dir) = &opts.dump {
        std::fs::create_dir_all(dir)
            .map_err(|e| GptError::Io(format!("{}: {e}", dir.display())))?;
        params.dump(dir)?;
    }
    on(&Event::Start {
        params: params.count(),
        device: device.describe(),
    });
    let (b, s) = (cfg.batch, cfg.seq);
    let acts = Acts::new(&ops, cfg, b, s)?;
    let grads = GradBufs::new(&ops, cfg, b, s)?;
    let val = fixed_batches(&corpus.val, b, s, cfg.eval_batches);
    let mut batches = Batches::new(&corpus.train, b, s, cfg.seed);
    let loss_hist = ops.zeros(DType::F32, &[cfg.steps])?;
    let mut report = GptReport::default();
    let mut dumped: Vec<Batch> = Vec::new();

    let mut rng = SplitMix::new(cfg.seed ^ 0x5a3b1e);
    if opts.sample_before {
        let samples = sample(&ops, &model, &params, cfg, &corpus.val, &mut rng)?;
        on(&Event::Samples {
            step: 0,
            samples: samples.clone(),
        });
    }
    let l0 = evaluate(&ops, &model, &params, &acts, &val)?;
    report.val_losses.push((0, l0));
    on(&Event::Eval { step: 0, loss: l0 });

    let n = cfg.tokens_per_step();
    let (mut mark, mut mark_step) = (Instant::now(), 0usize);
    let (mut train_secs, mut train_tokens) = (0.0f64, 0usize);
    let mut scale = f64::NAN;
    for step in 1..=cfg.steps {
        let sc = cfg.lr_scale(step);
        if sc != scale {
            params.set_lr_scale(sc)?;
            scale = sc;
        }
        let batch = batches.next_batch();
        acts.upload(&ops, &batch.x, &batch.y)?;
        if opts.dump.is_some() && step <= DUMP_STEPS {
            dumped.push(batch);
        }
        params.refresh_working(&ops)?;
        forward(&ops, &model, &params.w, &acts, true)?;
        backward(&ops, &model, &params.w, &params.g, &acts, &grads)?;
        params.grads_to_master(&ops)?;
        params.step(&ops)?;
        loss_hist.narrow(0, step - 1, 1)?.copy_from(&acts.loss)?;

        let eval_now = step % cfg.eval_every == 0 || step == cfg.steps;
        if step == 1 || step % cfg.log_every == 0 || eval_now {
            // Reading the losses is the loop's only host synchronization.
            let losses = loss_hist
                .narrow(0, mark_step, step - mark_step)?
                .to_f64_vec()?;
            let dt = mark.elapsed().as_secs_f64();
            let steps = step - mark_step;
            if step == 1 {
                report.first_step_seconds = dt;
            } else {
                train_secs += dt;
                train_tokens += steps * n;
            }
            on(&Event::Step {
                step,
                loss: losses.iter().sum::<f64>() / steps as f64,
                tokens_per_s: (steps * n) as f64 / dt,
                ms_per_step: 1e3 * dt / steps as f64,
            });
            if eval_now {
                let l = evaluate(&ops, &model, &params, &acts, &val)?;
                report.val_losses.push((step, l));
                on(&Event::Eval { step, loss: l });
            }
            mark = Instant::now();
            mark_step = step;
        }
    }
    report.step_losses = loss_hist.to_f64_vec()?;
    report.tokens_per_s = if train_secs > 0.0 {
        train_tokens as f64 / train_secs
    } else {
        f64::NAN
    };
    report.samples = sample(&ops, &model, &params, cfg, &corpus.val, &mut rng)?;
    on(&Event::Samples {
        step: cfg.steps,
        samples: report.samples.clone(),
    });
    report.seconds = start.elapsed().as_secs_f64();
    if let Some(dir) = &opts.dump {
        write_twin_files(dir, cfg, device, &dumped, &report)?;
    }
    Ok(report)
}

/// The mean loss over the fixed validation batches (the forward alone; the working
/// weights must be current).
fn evaluate(
    ops: &Ops,
    model: &Model,
    params: &Params,
    acts: &Acts,
    val: &[Batch],
) -> Result<f64, GptError> {
    params.refresh_working(ops)?;
    let mut total = 0.0;
    for b in val {
        acts.upload(ops, &b.x, &b.y)?;
        forward(ops, model, &params.w, acts, true)?;
        total += acts.loss.to_f64_vec()?[0];
    }
    Ok(total / val.len().max(1) as f64)
}

/// `cfg.samples` continuations of prompts taken from `text` (line starts spread over
/// it), generated together. Each new byte runs the forward over the whole context (the
/// last `cfg.seq` bytes) and samples the distribution at its last position. The batch
/// always has the training shape `[samples, seq]`, the context at positions `0..t` and
/// zeros after it, which the causal mask hides from position `t - 1`: one shape for
/// every step, so the ops' tuned launches are reused instead of tuned anew per length.
pub fn sample(
    ops: &Ops,
    model: &Model,
    params: &Params,
    cfg: &GptConfig,
    text: &[u8],
    rng: &mut SplitMix,
) -> Result<Vec<Sample>, GptError> {
    let (p, s) = (cfg.samples, cfg.seq);
    let plen = cfg.prompt_len.clamp(1, s);
    if p == 0 || cfg.sample_len == 0 || text.len() <= plen {
        return Ok(Vec::new());
    }
    params.refresh_working(ops)?;
    let room = text.len() - plen;
    let mut ctx: Vec<Vec<u8>> = (0..p)
        .map(|i| {
            let mut at = (2 * i + 1) * room / (2 * p);
            // Start at a line.
            if let Some(nl) = text[at..room].iter().position(|&c| c == b'\n') {
                at += nl + 1;
            }
            text[at.min(room)..at.min(room) + plen].to_vec()
        })
        .collect();
    let acts = Acts::new(ops, cfg, p, s)?;
    let mut x = vec![0i32; p * s];
    for _ in 0..cfg.sample_len {
        let t = ctx[0].len().min(s);
        for (row, c) in x.chunks_exact_mut(s).zip(&ctx) {
            for (xi, &b) in row.iter_mut().zip(&c[c.len() - t..]) {
                *xi = b as i32;
            }
        }
        acts.upload(ops, &x, &x)?;
        forward(ops, model, &params.w, &acts, false)?;
        let last = acts
            .logits
            .view(&[p, s, 256])?
            .select(1, t - 1)?
            .to_f64_vec()?;
        for (c, row) in ctx.iter_mut().zip(last.chunks_exact(256)) {
            c.push(pick(row, cfg.temperature, rng));
        }
    }
    Ok(ctx
        .iter()
        .map(|c| Sample {
            prompt: String::from_utf8_lossy(&c[..plen]).into_owned(),
            text: String::from_utf8_lossy(&c[plen..]).into_owned(),
        })
        .collect())
}

/// A byte from logits: softmax at `temperature` (0: the argmax).
fn pick(logits: &[f64], temperature: f64, rng: &mut SplitMix) -> u8 {
    let best = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
    if temperature <= 0.0 {
        return best as u8;
    }
    let w: Vec<f64> = logits
        .iter()
        .map(|&z| ((z - logits[best]) / temperature).exp())
        .collect();
    let mut r = rng.uniform() * w.iter().sum::<f64>();
    for (i, &wi) in w.iter().enumerate() {
        r -= wi;
        if r < 0.0 {
            return i as u8;
        }
    }
    best as u8
}

/// The twin's inputs: the batches `[steps, B, S]` (int64), the run's configuration,
/// per-step learning-rate multipliers and losses, and its tokens/s (`kgen.json`).
fn write_twin_files(
    dir: &std::path::Path,
    cfg: &GptConfig,
    device: &Device,
    batches: &[Batch],
    report: &GptReport,
) -> Result<(), GptError> {
    let k = batches.len();
    let shape = [k, cfg.batch, cfg.seq];
    let x: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.x.iter().map(|&t| t as i64))
        .collect();
    let y: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.y.iter().map(|&t| t as i64))
        .collect();
    write_npy_i64(&dir.join("batches_x.npy"), &shape, &x)?;
    write_npy_i64(&dir.join("batches_y.npy"), &shape, &y)?;
    let json = serde_json::json!({
        "d_model": cfg.d_model,
        "layers": cfg.layers,
        "heads": cfg.heads,
        "head_dim": cfg.head_dim(),
        "hidden": cfg.hidden,
        "seq": cfg.seq,
        "batch": cfg.batch,
        "vocab": super::kernels::VOCAB,
        "eps": cfg.eps,
        "rope_base": cfg.rope_base,
        "steps": cfg.steps,
        "lr": cfg.lr,
        "adamw_betas": [0.9, 0.95],
        "adamw_eps": 1e-8,
        "adamw_weight_decay": 0.0,
        "clip_grad_norm": 1.0,
        "muon_lr": cfg.muon_lr,
        "muon_weight_decay": cfg.muon_weight_decay,
        "muon_momentum": 0.95,
        "muon_nesterov": true,
        "muon_ns_steps": 5,
        "lr_scales": (1..=k).map(|s| cfg.lr_scale(s)).collect::<Vec<_>>(),
        "losses": report.step_losses.iter().take(k).collect::<Vec<_>>(),
        "tokens_per_s": report.tokens_per_s,
        "device": device.describe(),
    });
    let path = dir.join("kgen.json");
    let text = serde_json::to_string_pretty(&json).unwrap_or_default();
    std::fs::write(&path, text).map_err(|e| GptError::Io(format!("{}: {e}", path.display())))
}
