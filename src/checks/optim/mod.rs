//! End-to-end checks of the optimizer and the gradient statistics against float64
//! references, on any device: the unit tests run them on the interpreter with awkward
//! sizes, [`gpu_checks`] on the selected device with medium ones (`kgen selftest`).
//!
//! Tolerances are stated per comparison as `rtol` and `atol`: an element passes when
//! `|got - want| <= max(rtol * |want|, atol)`; the reported number is the worst
//! `|got - want| / max(|want|, atol / rtol)` (a relative error that stops growing where
//! the absolute tolerance takes over), which passes when it is `<= rtol`.

pub mod muon;

use crate::cases::torch_adamw::torch_adamw_step;
use crate::cases::Rng;
use crate::ops::Ops;
use crate::optim::{read_grad_stats, AdamW, AdamWLaunch, GradStats, GradStatsLaunch, ParamGroup};
use kgen_core::host::HostTensor;
use kgen_core::types::DType;
use kgen_runtime::Device;

/// Values rounded to `dtype` (round to nearest even), as f64.
pub(crate) fn round_to(dtype: DType, v: &[f64]) -> Vec<f64> {
    HostTensor::from_f64(dtype, &[v.len()], v).to_f64_vec()
}

/// Worst relative error (see the module docs), or an error naming the first element out
/// of tolerance. NaN matches only NaN, ±inf only itself.
pub(crate) fn compare(
    what: &str,
    got: &[f64],
    want: &[f64],
    rtol: f64,
    atol: f64,
) -> Result<f64, String> {
    let floor = (atol / rtol).max(f64::MIN_POSITIVE);
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        ));
    }
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok_special = (w.is_nan() && g.is_nan()) || (w.is_infinite() && g == w);
        if ok_special {
            continue;
        }
        let err = (g - w).abs() / w.abs().max(floor);
        if err.is_nan() || err > rtol {
            return Err(format!(
                "{what}[{i}] = {g:e}, expected {w:e} (relative error {err:.2e} > {rtol:.1e})"
            ));
        }
        worst = worst.max(err);
    }
    Ok(worst)
}

/// One AdamW trajectory to check.
#[derive(Clone, Debug)]
pub(crate) struct AdamWCheck {
    pub param: DType,
    pub state: DType,
    pub groups: Vec<ParamGroup>,
    pub steps: u64,
    pub seed: u64,
    pub launch: AdamWLaunch,
    /// (step, factor): before that step every group's lr is multiplied by the factor
    /// through `AdamW::set_lr` (a scheduler), in the reference too.
    pub lr_change: Option<(u64, f64)>,
    /// Capturable mode from this step on (`AdamW::set_capturable` before it): the
    /// device counts the steps and computes the bias corrections.
    pub capturable_from: Option<u64>,
}

/// Per-step relative rounding of a dtype (half an ulp at the bottom of a binade).
fn unit(d: DType) -> f64 {
    match d {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

/// Runs `steps` AdamW steps on `device` with fresh random gradients written into the
/// grad views every step, and the same steps with torch's algorithm in f64 (state rounded
/// to its storage dtype after every step, as torch stores it). Checks p, m and v of every
/// parameter, that padding stays zero, the step counter, and that every step was exactly
/// one launch. Returns the worst relative error of p.
///
/// Tolerances. The f64 reference and the f32 kernel see the same stored inputs at each
/// step, so they differ by the kernel's f32 arithmetic (a few f32 ulps of each result)
/// and, where a result lies near a rounding tie of the storage dtype, by one ulp of that
/// dtype (a tie flip); differences carry over to later steps. With u = 2^-24 (f32),
/// 2^-11 (f16), 2^-8 (bf16), the relative half-ulp at the bottom of a binade:
/// - f32 storage: `rtol = 4 steps u` (a few ulps per step).
/// - f16/bf16 storage: at most one flip per step, `rtol = 2 steps u` (`steps` ulps), AND
///   at most 10% of the elements (+2, for tiny tensors) may differ at all. Flips are
///   frequent because exact ties are: `0.9 m + 0.1 g` of 8-bit-mantissa m and g often
///   lands exactly on a bf16 tie, which f64 (0.9 = 0.9000000000000000222) and f32 (0.9 =
///   0.89999998) then round in opposite directions. Measured on the interpreter: up to
///   2.7% of m and 0.7% of p after 5-10 steps. A systematic error (a wrong lr, beta or
///   rounding mode) moves every element and breaks the 10%, even where it is smaller
///   than one ulp per element.
/// - `atol`: m cancels towards zero, so rtol times the largest gradient (0.1); v has no
///   cancellation (0); p: the update's error where m cancels or a half m, v or p flipped
///   (the update is <= ~10 lr per step): `steps lr max(1e-4, 16 u)`, u of the coarser of
///   T and S.
pub(crate) fn check_adamw(device: &Device, c: &AdamWCheck) -> Result<f64, String> {
    let e = |x: crate::ops::OpError| x.to_string();
    let r = |x: kgen_runtime::RuntimeError| x.to_string();
    let ops = Ops::new(device);
    let mut opt =
        AdamW::with_launch(&ops, c.param, c.state, c.groups.clone(), c.launch).map_err(e)?;
    let mut rng = Rng::new(c.seed);
    // (group, index, p, m, v, max_exp_avg_sq) in f64, the reference's state.
    type RefState = (usize, usize, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);
    let mut refs: Vec<RefState> = Vec::new();
    for (gi, g) in c.groups.iter().enumerate() {
        for (j, shape) in g.shapes.iter().enumerate() {
            let n: usize = shape.iter().product();
            let init: Vec<f64> = (0..n).map(|_| rng.signed_magnitude(1e-2, 1.0)).collect();
            let h = HostTensor::from_f64(c.param, shape, &init);
            opt.param(gi, j).copy_from_host(&h).map_err(r)?;
            refs.push((
                gi,
                j,
                h.to_f64_vec(),
                vec![0.0; n],
                vec![0.0; n],
                vec![0.0; n],
            ));
        }
    }
    let mut groups = c.groups.clone();
    for t in 1..=c.steps {
        if c.capturable_from == Some(t) {
            opt.set_capturable(&ops, true).map_err(e)?;
        }
        if let Some((at, factor)) = c.lr_change {
            if t == at {
                for (gi, g) in groups.iter_mut().enumerate() {
                    g.lr *= factor;
                    opt.set_lr(gi, g.lr).map_err(e)?;
                }
            }
        }
        for (gi, j, p, m, v, vmax) in refs.iter_mut() {
            let g = &groups[*gi];
            let n = p.len();
            let raw: Vec<f64> = (0..n).map(|_| rng.signed_magnitude(1e-3, 1e-1)).collect();
            let h = HostTensor::from_f64(c.param, &g.shapes[*j], &raw);
            opt.grad(*gi, *j).copy_from_host(&h).map_err(r)?;
            torch_adamw_step(p, &h.to_f64_vec(), m, v, vmax, &g.into(), t);
            *p = round_to(c.param, p);
            *m = round_to(c.state, m);
            *v = round_to(c.state, v);
            // The buffer's slots of a group without amsgrad hold its v (optim.kg).
            *vmax = if g.amsgrad {
                round_to(c.state, vmax)
            } else {
                v.clone()
            };
        }
        let before = opt.step_launches();
        opt.step(&ops).map_err(e)?;
        let launches = opt.step_launches() - before;
        if launches != 1 {
            return Err(format!(
                "step {t} made {launches} kernel launches, expected 1"
            ));
        }
    }
    if opt.step_count() != c.steps {
        return Err(format!(
            "step_count {} after {} steps",
            opt.step_count(),
            c.steps
        ));
    }
    if c.capturable_from.is_some() {
        let on_device = opt.device_step_count(&ops).map_err(e)?;
        if on_device != c.steps {
            return Err(format!(
                "the device counted {on_device} steps after {}",
                c.steps
            ));
        }
    }
    let steps = c.steps as f64;
    let rtol = |d: DType| {
        if d == DType::F32 {
            4.0 * steps * unit(d)
        } else {
            2.0 * steps * unit(d)
        }
    };
    // Half storage: also bound the share of elements that differ at all.
    let check = |what: String, got: &[f64], want: &[f64], d: DType, atol: f64| {
        let worst = compare(&what, got, want, rtol(d), atol)?;
        let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
        if d != DType::F32 && differ > 2 + got.len() / 10 {
            return Err(format!(
                "{what}: {differ} of {} elements differ (> 10%)",
                got.len()
            ));
        }
        Ok::<f64, String>(worst)
    };
    // The update's error: f32 arithmetic where m cancels, or a tie flip of a half m/v
    // (2 u relative) or p, on an update of <= ~10 lr per step.
    let p_atol = |lr: f64| steps * lr * (1e-4f64).max(16.0 * unit(c.param).max(unit(c.state)));
    let mut worst = 0.0f64;
    let layout = opt.layout().clone();
    for (gi, j, p, m, v, vmax) in &refs {
        let lr = c.groups[*gi].lr;
        let slot = &layout.segments[*gi].slots[*j];
        let label = |x: &str| {
            format!(
                "{:?} group {gi} param {j} {x} after {} steps",
                slot.shape, c.steps
            )
        };
        let read = |t: &kgen_runtime::Tensor| -> Result<Vec<f64>, String> {
            t.narrow(0, slot.offset, slot.numel)
                .map_err(r)?
                .to_f64_vec()
                .map_err(r)
        };
        let gp = opt.param(*gi, *j).to_f64_vec().map_err(r)?;
        worst = worst.max(check(label("p"), &gp, p, c.param, p_atol(lr))?);
        let gm = read(opt.exp_avg_flat())?;
        check(label("m"), &gm, m, c.state, rtol(c.state) * 0.1)?;
        let gv = read(opt.exp_avg_sq_flat())?;
        check(label("v"), &gv, v, c.state, 0.0)?;
        if let Some(t) = opt.max_exp_avg_sq_flat() {
            check(label("max_exp_avg_sq"), &read(t)?, vmax, c.state, 0.0)?;
        }
    }
    // Padding (everything outside the slots) is still zero in p, g, m, v.
    let mut inside = vec![false; layout.len];
    for s in layout.segments.iter().flat_map(|s| &s.slots) {
        inside[s.offset..s.offset + s.numel].fill(true);
    }
    let buffers = [
        ("p", Some(opt.params_flat())),
        ("m", Some(opt.exp_avg_flat())),
        ("v", Some(opt.exp_avg_sq_flat())),
        ("max_exp_avg_sq", opt.max_exp_avg_sq_flat()),
    ];
    for (name, t) in buffers.iter().filter_map(|(n, t)| Some((n, (*t)?))) {
        let vals = t.to_f64_vec().map_err(r)?;
        if let Some(i) = (0..layout.len).find(|&i| !inside[i] && vals[i] != 0.0) {
            return Err(format!("padding element {i} of {name} became {}", vals[i]));
        }
    }
    Ok(worst)
}

/// Gradient statistics + clipping of `n` random values of `dtype` with some elements
/// replaced (`inject`: (index, value), e.g. inf or NaN), against f64: sumsq, norm, the
/// non-finite count (exact), the clip coefficient (torch's formula, NaN propagating) and
/// the clipped gradient. Returns the worst relative error.
///
/// Tolerances: the f32 partial sums of squares of positive terms err by about
/// (chunks per block + log2 BLOCK) f32 ulps: rtol 1e-5 for sumsq, half that for the
/// norm and the coefficient; the clipped gradient is x * coef rounded to the dtype:
/// rtol 2e-5 for f32, 2^-7 (one ulp, a tie flip) for bf16 and f16 (plus f16's
/// subnormal spacing 6e-8 absolute).
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_clip(
    device: &Device,
    dtype: DType,
    n: usize,
    scale: f64,
    inject: &[(usize, f64)],
    max_norm: f32,
    launch: GradStatsLaunch,
    seed: u64,
) -> Result<f64, String> {
    let e = |x: crate::ops::OpError| x.to_string();
    let r = |x: kgen_runtime::RuntimeError| x.to_string();
    let ops = Ops::new(device);
    let mut rng = Rng::new(seed);
    let mut raw: Vec<f64> = (0..n)
        .map(|_| rng.signed_magnitude(1e-3, 1.0) * scale)
        .collect();
    for &(i, v) in inject {
        raw[i] = v;
    }
    let x = round_to(dtype, &raw);
    let g = device.from_f64(dtype, &[n], &x).map_err(r)?;
    let stats = GradStats::new(&ops, launch).map_err(e)?;
    stats
        .stats()
        .copy_from_host(&HostTensor::from_f64(DType::F32, &[4], &[f64::NAN; 4]))
        .map_err(r)?;
    stats.clip_(&ops, &g, max_norm).map_err(e)?;
    let got = read_grad_stats(stats.stats()).map_err(e)?;
    let sumsq: f64 = x.iter().map(|v| v * v).sum();
    let norm = sumsq.sqrt();
    let bad = x.iter().filter(|v| !v.is_finite()).count() as u64;
    let ratio = max_norm as f64 / (norm + 1e-6);
    let coef = if ratio > 1.0 { 1.0 } else { ratio };
    if got.nonfinite != bad {
        return Err(format!(
            "non-finite count {}, expected {bad}",
            got.nonfinite
        ));
    }
    let mut worst = compare("sumsq", &[got.sumsq], &[sumsq], 1e-5, 0.0)?;
    worst = worst.max(compare("norm", &[got.norm], &[norm], 5e-6, 0.0)?);
    worst = worst.max(compare("clip_coef", &[got.clip_coef], &[coef], 5e-6, 0.0)?);
    let want: Vec<f64> = round_to(dtype, &x.iter().map(|v| v * coef).collect::<Vec<_>>());
    let gv = g.to_f64_vec().map_err(r)?;
    if coef == 1.0 {
        // The skip path: the gradient must be untouched, bit for bit.
        let same = gv
            .iter()
            .zip(&x)
            .all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
        if !same {
            return Err("clip_coef is 1 but the gradient changed".into());
        }
    } else {
        let rtol = if dtype == DType::F32 {
            2e-5
        } else {
            2f64.powi(-7)
        };
        // f16 results may be subnormal (spacing 6e-8).
        let atol = if dtype == DType::F16 { 6e-8 } else { 0.0 };
        worst = worst.max(compare("clipped grad", &gv, &want, rtol, atol)?);
    }
    Ok(worst)
}

/// The optimizer's GPU self-test entries: AdamW trajectories (two groups, maximize in
/// one; f32, bf16 with f32 and bf16 states; one-chunk-per-block and grid-stride launches)
/// and the gradient statistics (clipping, no clipping, inf and NaN injected), each on
/// medium awkward sizes against f64. Deterministic (fixed seeds).
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let mut out = muon::gpu_checks(device);
    let groups = |lr_scale: f64| -> Vec<ParamGroup> {
        vec![
            ParamGroup {
                betas: (0.9, 0.999),
                weight_decay: 0.1,
                shapes: vec![vec![1000, 257], vec![7], vec![4097], vec![1]],
                ..ParamGroup::new(1e-3 * lr_scale)
            },
            ParamGroup {
                betas: (0.8, 0.95),
                eps: 1e-6,
                weight_decay: 0.0,
                maximize: true,
                shapes: vec![vec![3, 1000], vec![65_537]],
                ..ParamGroup::new(3e-3 * lr_scale)
            },
        ]
    };
    for &(t, s, grid) in &[
        (DType::F32, DType::F32, None),
        (DType::BF16, DType::F32, None),
        (DType::BF16, DType::BF16, Some(264)),
        (DType::F16, DType::F32, Some(7)),
    ] {
        let lr_scale = if t == DType::F32 { 1.0 } else { 20.0 };
        let c = AdamWCheck {
            param: t,
            state: s,
            groups: groups(lr_scale),
            steps: 5,
            seed: 42,
            launch: AdamWLaunch {
                grid,
                ..AdamWLaunch::default()
            },
            lr_change: None,
            capturable_from: None,
        };
        out.push((
            format!("optim AdamW T={t} S={s} grid={grid:?} 2 groups x 5 steps (1 launch/step)"),
            check_adamw(device, &c),
        ));
    }
    // Past two refills of the hyperparameter table, with an lr change between refills.
    let steps = 2 * crate::optim::HP_STEPS_MAX as u64 + 40;
    let at = crate::optim::HP_STEPS_MAX as u64 + 17;
    let c = AdamWCheck {
        param: DType::F32,
        state: DType::F32,
        groups: vec![ParamGroup {
            shapes: vec![vec![4097], vec![7]],
            ..ParamGroup::new(1e-3)
        }],
        steps,
        seed: 43,
        launch: AdamWLaunch::default(),
        lr_change: Some((at, 0.25)),
        capturable_from: None,
    };
    out.push((
        format!("optim AdamW T=f32 1 group x {steps} steps, lr x0.25 at step {at}"),
        check_adamw(device, &c),
    ));
    // Capturable mode (device step counter, bias corrections on the device), switched on
    // after 3 steps, with an lr change after that: two groups, f32 and bf16.
    for &(t, s) in &[(DType::F32, DType::F32), (DType::BF16, DType::F32)] {
        let lr_scale = if t == DType::F32 { 1.0 } else { 20.0 };
        let c = AdamWCheck {
            param: t,
            state: s,
            groups: groups(lr_scale),
            steps: 12,
            seed: 44,
            launch: AdamWLaunch::default(),
            lr_change: Some((9, 0.5)),
            capturable_from: Some(4),
        };
        out.push((
            format!("optim AdamW T={t} S={s} capturable from step 4, 2 groups x 12 steps"),
            check_adamw(device, &c),
        ));
    }
    // AMSGrad in the second group (beta2 0.5: v falls, the maximum matters), f32 and
    // bf16 params.
    for &(t, s) in &[(DType::F32, DType::F32), (DType::BF16, DType::F32)] {
        let lr_scale = if t == DType::F32 { 1.0 } else { 20.0 };
        let mut gs = groups(lr_scale);
        gs[1].amsgrad = true;
        gs[1].betas = (0.8, 0.5);
        let c = AdamWCheck {
            param: t,
            state: s,
            groups: gs,
            steps: 8,
            seed: 45,
            launch: AdamWLaunch::default(),
            lr_change: None,
            capturable_from: None,
        };
        out.push((
            format!("optim AdamW T={t} S={s} amsgrad in group 1, 2 groups x 8 steps"),
            check_adamw(device, &c),
        ));
    }
    let l = GradStatsLaunch::default();
    for &(dt, n, scale, ref inject, max_norm, what) in &[
        (DType::F32, 1_000_003, 1e-2, vec![], 1.0f32, "clipped"),
        (DType::F32, 262_147, 1e-2, vec![], 1e6, "unclipped"),
        (
            DType::BF16,
            262_147,
            1e-2,
            vec![(12_345usize, f64::INFINITY)],
            1.0,
            "inf",
        ),
        (
            DType::F32,
            65_537,
            1.0,
            vec![(7, f64::NAN), (65_000, f64::NEG_INFINITY)],
            1.0,
            "NaN+inf",
        ),
    ] {
        out.push((
            format!("optim clip_grad_norm_ T={dt} n={n} max_norm={max_norm} ({what})"),
            check_clip(device, dt, n, scale, inject, max_norm, l, 7),
        ));
    }
    out
}

#[cfg(test)]
mod tests;
