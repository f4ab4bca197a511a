//! Checks of [`crate::optim::Muon`] and [`crate::optim::MuonWithAdamW`] against the
//! float64 port of torch.optim.Muon's step ([`crate::cases::torch_muon`], bf16 rounding
//! of the Newton–Schulz iteration modelled), on any device.

use crate::cases::torch_muon::{torch_muon_step, TorchAdjustLr, TorchMuonHyper};
use crate::cases::Rng;
use crate::ops::Ops;
use crate::optim::muon::{AdjustLr, Muon, MuonGroup};
use kgen_core::types::DType;
use kgen_runtime::Device;

/// Two groups mixing square, wide and tall matrices, shapes shared across groups (so
/// runs with different momentum share a bucket), one wide-tall pair of one working shape
/// (one bucket, two runs), Nesterov on and off, both lr adjustments, a 1 x 1 matrix.
pub(crate) fn two_groups(big: bool) -> Vec<MuonGroup> {
    let s = if big { 3 } else { 1 };
    vec![
        MuonGroup {
            weight_decay: 0.1,
            shapes: vec![[33 * s, 70 * s], [70 * s, 33 * s], [20, 20], [1, 1], [33 * s, 70 * s]],
            ..MuonGroup::new(0.02)
        },
        MuonGroup {
            momentum: 0.9,
            nesterov: false,
            weight_decay: 0.0,
            adjust_lr: AdjustLr::MatchRmsAdamW,
            shapes: vec![[20, 20], [7, 5]],
            ..MuonGroup::new(0.01)
        },
    ]
}

fn torch_hyper(g: &MuonGroup) -> TorchMuonHyper {
    TorchMuonHyper {
        lr: g.lr,
        weight_decay: g.weight_decay,
        momentum: g.momentum,
        nesterov: g.nesterov,
        ns_coefficients: g
            .ns_coefficients
            .iter()
            .map(|&(a, b, c)| (a as f64, b as f64, c as f64))
            .collect(),
        eps: g.eps,
        ns_steps: g.ns_steps,
        adjust_lr: match g.adjust_lr {
            AdjustLr::Original => TorchAdjustLr::Original,
            AdjustLr::MatchRmsAdamW => TorchAdjustLr::MatchRmsAdamW,
        },
    }
}

/// `steps` Muon steps with fresh random gradients each step, against the reference;
/// returns the worst `|p - p_ref|` divided by the largest total update `steps *
/// adjusted_lr` (the parameters' drift relative to how far they moved).
pub(crate) fn check_muon(
    device: &Device,
    groups: Vec<MuonGroup>,
    steps: usize,
    seed: u64,
) -> Result<f64, String> {
    let e = |x: crate::ops::OpError| x.to_string();
    let ops = Ops::new(device);
    let mut opt = Muon::new(&ops, DType::F32, groups.clone()).map_err(e)?;
    let mut rng = Rng::new(seed);
    // Reference state per (group, j): p, buf.
    let mut refs: Vec<Vec<(Vec<f64>, Vec<f64>)>> = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let mut v = Vec::new();
        for (j, &[r, c]) in g.shapes.iter().enumerate() {
            let p0: Vec<f64> = (0..r * c).map(|_| rng.normalish() * 0.1).collect();
            let p = opt.param(gi, j).map_err(e)?;
            let t = device.from_f64(DType::F32, &[r, c], &p0).map_err(|x| x.to_string())?;
            p.copy_from(&t).map_err(|x| x.to_string())?;
            v.push((p.to_f64_vec().map_err(|x| x.to_string())?, vec![0.0; r * c]));
        }
        refs.push(v);
    }
    let mut scale = 0.0f64;
    for _ in 0..steps {
        for (gi, g) in groups.iter().enumerate() {
            let h = torch_hyper(g);
            for (j, &[r, c]) in g.shapes.iter().enumerate() {
                let gv: Vec<f64> = (0..r * c).map(|_| rng.normalish()).collect();
                let t = device.from_f64(DType::F32, &[r, c], &gv).map_err(|x| x.to_string())?;
                opt.grad(gi, j).map_err(e)?.copy_from(&t).map_err(|x| x.to_string())?;
                let gr = t.to_f64_vec().map_err(|x| x.to_string())?;
                let (p, buf) = &mut refs[gi][j];
                torch_muon_step(&h, p, &gr, buf, r, c, true);
                scale = scale.max(g.adjust_lr.adjusted(g.lr, r, c));
            }
        }
        opt.step(&ops).map_err(e)?;
    }
    let mut worst = 0.0f64;
    for (gi, g) in groups.iter().enumerate() {
        for j in 0..g.shapes.len() {
            let got = opt.param(gi, j).map_err(e)?.to_f64_vec().map_err(|x| x.to_string())?;
            for (i, (a, b)) in got.iter().zip(&refs[gi][j].0).enumerate() {
                let err = (a - b).abs() / (scale * steps as f64);
                if !err.is_finite() || err > MUON_TOL {
                    return Err(format!(
                        "group {gi} param {j} element {i}: {a} vs {b} ({err:.2e} of the total update)"
                    ));
                }
                worst = worst.max(err);
            }
        }
    }
    Ok(worst)
}

/// Drift allowed, relative to the total update: each step's orthogonalized update agrees
/// with the reference to bf16 accuracy (a few 1e-2 absolute on entries of order 1).
pub const MUON_TOL: f64 = 2e-2;

/// The Muon entries of `kgen selftest`.
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let big = device.is_gpu();
    vec![(
        format!(
            "muon 10 steps, 2 groups, {} matrices of mixed shapes vs torch.optim.Muon in f64",
            two_groups(big).iter().map(|g| g.shapes.len()).sum::<usize>()
        ),
        check_muon(device, two_groups(big), 10, 11),
    )]
}
