//! `kgen train`: the end-to-end training demo (`kgen::train`), on the GPU when there is
//! one, otherwise on the interpreter (a smaller model), saying which.

use super::common::{say, CliError, CliResult};
use super::TrainArgs;
use kgen::runtime::Device;
use kgen::train::{train, TrainConfig};

pub fn run(a: TrainArgs) -> CliResult {
    let (device, fallback) = if a.no_gpu {
        (Device::interpreter(), Some("--no-gpu".to_string()))
    } else {
        Device::best()
    };
    let mut cfg = if device.is_gpu() {
        TrainConfig::gpu()
    } else {
        TrainConfig::small()
    };
    cfg.muon = a.muon;
    if let Some(lr) = a.muon_lr {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(CliError::Msg(format!("--muon-lr {lr}: must be positive")));
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
    let report = train(&device, &cfg, |step, loss| {
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
