//! `kgen train`: the main job, a small GPT trained on real text (`kgen::gpt`), or with
//! `--mlp` the earlier MLP demo (`kgen::train`); on the GPU when there is one, otherwise
//! on the interpreter (smaller models), saying which.

use super::common::{say, CliError, CliResult};
use super::TrainArgs;
use kgen::gpt::{Corpus, Event, GptConfig, RunOptions};
use kgen::runtime::Device;
use kgen::train::{train, TrainConfig};

pub fn run(a: TrainArgs) -> CliResult {
    let (device, fallback) = if a.no_gpu {
        (Device::interpreter(), Some("--no-gpu".to_string()))
    } else {
        Device::best()
    };
    if let Some(lr) = a
        .muon_lr
        .into_iter()
        .chain(a.lr)
        .find(|lr| !(lr.is_finite() && *lr > 0.0))
    {
        return Err(CliError::Msg(format!(
            "learning rate {lr}: must be positive"
        )));
    }
    if a.mlp {
        run_mlp(&a, &device, fallback)
    } else {
        run_gpt(&a, &device, fallback)
    }
}

fn run_gpt(a: &TrainArgs, device: &Device, fallback: Option<String>) -> CliResult {
    let mut cfg = if device.is_gpu() && !a.tiny {
        GptConfig::gpu()
    } else {
        GptConfig::tiny()
    };
    if let Some(s) = a.steps {
        cfg.steps = s as usize;
        cfg.log_every = cfg.log_every.min((cfg.steps / 10).max(1));
        cfg.eval_every = cfg.eval_every.min(cfg.steps);
    }
    if let Some(lr) = a.lr {
        cfg.lr = lr;
    }
    if let Some(lr) = a.muon_lr {
        cfg.muon_lr = lr;
    }
    if let Some(s) = a.seed {
        cfg.seed = s;
    }
    match &fallback {
        Some(why) => say(format_args!(
            "{why}\nthe interpreter is exact but slow: training a tiny GPT for a few steps \
             (a GPU trains a 6-layer one)"
        )),
        None => say(format_args!("device: {}", device.describe())),
    }
    let corpus = match &a.data {
        Some(p) => Corpus::from_path(p, None),
        None => Corpus::default_corpus(),
    }
    .map_err(|e| CliError::Msg(e.to_string()))?;
    say(format_args!(
        "data: {} ({:.2} MB to train on, {:.2} MB held out for validation)",
        corpus.source,
        corpus.train.len() as f64 / 1e6,
        corpus.val.len() as f64 / 1e6
    ));
    say(format_args!(
        "model: byte-level GPT, {l} layer{ls} of width {d} ({h} head{hs} of {hd}, RoPE, causal \
         attention; SwiGLU MLP of {f}; RMSNorm), embedding tied to the head; context {s}, batch \
         {b} ({t} tokens/step); bf16 compute, f32 master weights; Muon lr {mlr} on the hidden \
         matrices + AdamW lr {lr} on the embedding and norms; {steps} steps",
        l = cfg.layers,
        ls = if cfg.layers == 1 { "" } else { "s" },
        d = cfg.d_model,
        h = cfg.heads,
        hs = if cfg.heads == 1 { "" } else { "s" },
        hd = cfg.head_dim(),
        f = cfg.hidden,
        s = cfg.seq,
        b = cfg.batch,
        t = cfg.tokens_per_step(),
        mlr = cfg.muon_lr,
        lr = cfg.lr,
        steps = cfg.steps,
    ));
    let opts = RunOptions {
        dump: a.dump_batches.clone(),
        sample_before: device.is_gpu(),
    };
    let report = kgen::gpt::train(device, &cfg, &corpus, &opts, |e| match e {
        Event::Start { params, .. } => say(format_args!(
            "{:.2}M parameters",
            *params as f64 / 1e6
        )),
        Event::Step {
            step,
            loss,
            tokens_per_s,
            ms_per_step,
        } => {
            if *step == 1 {
                say(format_args!(
                    "step {step:>5}  loss {loss:.4}  ({:.2} s: compiles, loads and tunes the kernels)",
                    ms_per_step / 1e3
                ))
            } else {
                say(format_args!(
                    "step {step:>5}  loss {loss:.4}  {tokens_per_s:>9.0} tokens/s  {ms_per_step:.1} ms/step"
                ))
            }
        }
        Event::Eval { step, loss } => say(format_args!(
            "step {step:>5}  validation loss {loss:.4}"
        )),
        Event::Samples { step, samples } => {
            let when = if *step == 0 {
                "before training".to_string()
            } else {
                format!("after {step} steps")
            };
            say(format_args!(
                "samples {when} ([prompt from the validation text] then the model's bytes):"
            ));
            for s in samples {
                say(format_args!("----\n[{}]{}", s.prompt, s.text));
            }
            say(format_args!("----"));
        }
    })
    .map_err(|e| CliError::Msg(format!("training failed: {e}")))?;
    let first = report.step_losses.first().copied().unwrap_or(f64::NAN);
    // The last few steps' mean (one step's loss is noisy).
    let tail = &report.step_losses[report.step_losses.len().saturating_sub(cfg.log_every)..];
    let last = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    let v0 = report.val_losses.first().map_or(f64::NAN, |v| v.1);
    let v1 = report.val_losses.last().map_or(f64::NAN, |v| v.1);
    say(format_args!(
        "loss {first:.4} (step 1) -> {last:.4} (the last {} steps), validation {v0:.4} -> \
         {v1:.4}; {:.1} s in all (step 1: {:.2} s), then {:.0} tokens/s",
        tail.len(),
        report.seconds,
        report.first_step_seconds,
        report.tokens_per_s
    ));
    if let Some(dir) = &a.dump_batches {
        say(format_args!(
            "wrote the twin's inputs to {} (python3 bench/gpt_torch.py {})",
            dir.display(),
            dir.display()
        ));
    }
    if v1.partial_cmp(&v0) != Some(std::cmp::Ordering::Less) {
        return Err(CliError::Msg("the validation loss did not go down".into()));
    }
    Ok(())
}

fn run_mlp(a: &TrainArgs, device: &Device, fallback: Option<String>) -> CliResult {
    let mut cfg = if device.is_gpu() {
        TrainConfig::gpu()
    } else {
        TrainConfig::small()
    };
    cfg.muon = a.muon;
    if let Some(lr) = a.muon_lr {
        if !a.muon {
            return Err(CliError::Msg("--muon-lr with --mlp needs --muon".into()));
        }
        cfg.muon_lr = lr;
    }
    if let Some(s) = a.steps {
        cfg.steps = s as usize;
        cfg.log_every = (s as usize / 10).max(1);
    }
    match &fallback {
        Some(why) => say(format_args!(
            "{why}\nthe interpreter is exact but slow: training the small model"
        )),
        None => say(format_args!("device: {}", device.describe())),
    }
    say(format_args!(
        "model: rmsnorm -> [{d} x 2*{f}] -> swiglu -> [{f} x {c}] -> cross-entropy (1 target in 8 ignored); \
         batch {b}, {opt}",
        d = cfg.dim,
        f = cfg.hidden,
        c = cfg.classes,
        b = cfg.batch,
        opt = if cfg.muon {
            format!(
                "Muon lr {} on the two matrices (Newton-Schulz on tensor cores) + AdamW lr {} \
                 on the norm weight, one step; clip_grad_norm 1.0 on AdamW's gradients",
                cfg.muon_lr, cfg.lr
            )
        } else {
            format!(
                "AdamW lr {} (2 param groups, one fused launch per step), clip_grad_norm 1.0",
                cfg.lr
            )
        }
    ));
    let report = train(device, &cfg, |step, loss| {
        say(format_args!("step {step:>5}  loss {loss:.4}"));
    })
    .map_err(|e| CliError::Msg(format!("training failed: {e}")))?;
    let first = report.losses.first().map(|l| l.1).unwrap_or(f64::NAN);
    let last = report.losses.last().map(|l| l.1).unwrap_or(f64::NAN);
    say(format_args!(
        "loss {first:.4} -> {last:.4}; accuracy on a fresh batch {:.1}% (chance {:.1}%); {:.2} s \
         (step 1, which compiles, loads and tunes the kernels: {:.2} s; then {:.1} ms per step, \
         generating each batch on the host included)",
        100.0 * report.accuracy,
        100.0 / cfg.classes as f64,
        report.seconds,
        report.first_step_seconds,
        1e3 * (report.seconds - report.first_step_seconds) / (cfg.steps.max(2) - 1) as f64
    ));
    if last.partial_cmp(&first) != Some(std::cmp::Ordering::Less) {
        return Err(CliError::Msg("the loss did not go down".into()));
    }
    Ok(())
}
