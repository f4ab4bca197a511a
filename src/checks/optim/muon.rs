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
            shapes: vec![
                [33 * s, 70 * s],
                [70 * s, 33 * s],
                [20, 20],
                [1, 1],
                [33 * s, 70 * s],
            ],
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
            let t = device
                .from_f64(DType::F32, &[r, c], &p0)
                .map_err(|x| x.to_string())?;
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
                let t = device
                    .from_f64(DType::F32, &[r, c], &gv)
                    .map_err(|x| x.to_string())?;
                opt.grad(gi, j)
                    .map_err(e)?
                    .copy_from(&t)
                    .map_err(|x| x.to_string())?;
                let gr = t.to_f64_vec().map_err(|x| x.to_string())?;
                let (p, buf) = &mut refs[gi][j];
                torch_muon_step(&h, p, &gr, buf, r, c, true);
                scale = scale.max(g.adjust_lr.adjusted(g.lr, r, c));
            }
        }
        opt.step(&ops).map_err(e)?;
    }
    let mut worst = 0.0f64;
    for (gi, group_refs) in refs.iter().enumerate() {
        for (j, (want, _)) in group_refs.iter().enumerate() {
            let got = opt
                .param(gi, j)
                .map_err(e)?
                .to_f64_vec()
                .map_err(|x| x.to_string())?;
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
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
            two_groups(big)
                .iter()
                .map(|g| g.shapes.len())
                .sum::<usize>()
        ),
        check_muon(device, two_groups(big), 10, 11),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten Muon steps, two groups, mixed shapes, against torch.optim.Muon in f64.
    #[test]
    fn muon_matches_torch_on_the_interpreter() {
        let e = check_muon(&Device::interpreter(), two_groups(false), 10, 5).unwrap();
        eprintln!("muon drift {e:.2e}");
    }

    /// The layout: buckets by wide shape and schedule, the launch count of a step.
    #[test]
    fn buckets_and_launches() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let mut opt = Muon::new(&ops, DType::F32, two_groups(false)).unwrap();
        // Wide shapes: 33x70 (three matrices, two stored orientations), 20x20 (two
        // groups, two momentum settings), 1x1, 5x7.
        assert_eq!(opt.buckets(), 4);
        opt.step(&ops).unwrap();
        // prep per run (2 + 2 + 1 + 1), 14 products per bucket, and each run's last
        // update (into its parameters).
        assert_eq!(opt.step_launches(), 6 + 4 * 14 + 6);
        assert_eq!(opt.param(0, 1).unwrap().shape(), [70, 33]);
        assert!(opt.param(2, 0).is_err());
    }

    /// torch's argument checks.
    #[test]
    fn bad_hyperparameters_are_errors() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let with = |f: &dyn Fn(&mut MuonGroup)| {
            let mut g = MuonGroup {
                shapes: vec![[4, 4]],
                ..MuonGroup::new(0.02)
            };
            f(&mut g);
            Muon::new(&ops, DType::F32, vec![g]).is_err()
        };
        assert!(with(&|g| g.lr = -1.0));
        assert!(with(&|g| g.momentum = 1.0));
        assert!(with(&|g| g.weight_decay = f64::NAN));
        assert!(with(&|g| g.ns_steps = 100));
        assert!(with(&|g| g.ns_coefficients = vec![QUINTIC_F32; 2]));
        assert!(with(&|g| g.ns_steps = 0));
        assert!(with(&|g| g.shapes.push([0, 3])));
        assert!(!with(&|_| {}));
        assert!(Muon::new(&ops, DType::I32, vec![]).is_err());
    }

    const QUINTIC_F32: (f32, f32, f32) = crate::ops::newton_schulz::QUINTIC;
}
