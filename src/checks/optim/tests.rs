//! Tests of `kgen::optim` on the interpreter: layout, AdamW trajectories against torch's
//! algorithm in f64 (two groups, ten steps, awkward sizes, every dtype pairing), gradient
//! statistics with inf and NaN, and every typed error. (Here, beside the checks they
//! run, so that the optimizer's own files need no test references.)

use super::{check_adamw, check_clip, compare, round_to, AdamWCheck};
use crate::cases::torch_adamw::{torch_adamw_step, TorchHyper};
use crate::cases::Rng;
use crate::ops::{OpError, Ops};
use crate::optim::*;
use kgen_core::host::HostTensor;
use kgen_core::types::DType;
use kgen_runtime::Device;

fn two_groups(lr_scale: f64) -> Vec<ParamGroup> {
    vec![
        ParamGroup {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.1,
            shapes: vec![vec![7], vec![1000], vec![1], vec![4097]],
            ..ParamGroup::new(1e-3 * lr_scale)
        },
        ParamGroup {
            betas: (0.8, 0.95),
            eps: 1e-6,
            weight_decay: 0.01,
            maximize: true,
            shapes: vec![vec![33, 31], vec![1]],
            ..ParamGroup::new(3e-3 * lr_scale)
        },
    ]
}

fn adamw_case(param: DType, state: DType, launch: AdamWLaunch) -> AdamWCheck {
    // Half params: a larger lr so every step moves p by many ulps of its dtype (with
    // lr 1e-3 most bf16 updates would round away and a wrong update could pass).
    let lr_scale = if param == DType::F32 { 1.0 } else { 20.0 };
    AdamWCheck {
        param,
        state,
        groups: two_groups(lr_scale),
        steps: 10,
        seed: 3,
        launch,
        lr_change: None,
        capturable_from: None,
    }
}

fn run(c: &AdamWCheck) {
    let d = Device::interpreter();
    match check_adamw(&d, c) {
        Ok(worst) => eprintln!(
            "{:?}/{:?} {:?}: worst p rel err {worst:.2e}",
            c.param, c.state, c.launch
        ),
        Err(e) => panic!("{:?}/{:?} {:?}: {e}", c.param, c.state, c.launch),
    }
}

/// Past the hyperparameter table's refills (every HP_STEPS_MAX steps) and an lr change
/// in the middle of a table (which must refill it).
#[test]
fn adamw_long_trajectory_with_lr_change() {
    let groups = vec![
        ParamGroup {
            weight_decay: 0.1,
            shapes: vec![vec![7], vec![300]],
            ..ParamGroup::new(1e-3)
        },
        ParamGroup {
            betas: (0.8, 0.95),
            maximize: true,
            shapes: vec![vec![33]],
            ..ParamGroup::new(3e-3)
        },
    ];
    let steps = 2 * HP_STEPS_MAX as u64 + 40;
    run(&AdamWCheck {
        param: DType::F32,
        state: DType::F32,
        groups,
        steps,
        seed: 9,
        launch: AdamWLaunch::default(),
        lr_change: Some((HP_STEPS_MAX as u64 + 17, 0.25)),
        capturable_from: None,
    });
}

#[test]
fn adamw_two_groups_ten_steps_f32() {
    run(&adamw_case(DType::F32, DType::F32, AdamWLaunch::default()));
}

#[test]
fn adamw_two_groups_ten_steps_bf16_params_f32_states() {
    run(&adamw_case(DType::BF16, DType::F32, AdamWLaunch::default()));
}

#[test]
fn adamw_two_groups_ten_steps_bf16_params_bf16_states() {
    run(&adamw_case(
        DType::BF16,
        DType::BF16,
        AdamWLaunch::default(),
    ));
}

#[test]
fn adamw_two_groups_ten_steps_f16_and_f32_with_bf16_states() {
    run(&adamw_case(DType::F16, DType::F32, AdamWLaunch::default()));
    run(&adamw_case(DType::F32, DType::BF16, AdamWLaunch::default()));
}

/// AMSGrad in one of two groups (torch's per-group `amsgrad`), ten steps against torch's
/// algorithm in f64, f32 and half storage, plain and capturable. Its beta2 = 0.5 makes v
/// fall between steps, so the maximum differs from v (checked: otherwise a kernel that
/// ignored it would pass).
#[test]
fn adamw_amsgrad_trajectories() {
    for (param, state, capturable_from) in [
        (DType::F32, DType::F32, None),
        (DType::BF16, DType::F32, None),
        (DType::BF16, DType::BF16, None),
        (DType::F32, DType::F32, Some(4)),
    ] {
        let mut c = adamw_case(param, state, AdamWLaunch::default());
        c.groups[1].amsgrad = true;
        c.groups[1].betas = (0.8, 0.5);
        c.capturable_from = capturable_from;
        run(&c);
    }
    // The maximum mattered: in the amsgrad group most elements of max_exp_avg_sq are
    // above v after ten steps; the other group's slots hold v.
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut groups = two_groups(1.0);
    groups[1].amsgrad = true;
    groups[1].betas = (0.8, 0.5);
    let mut opt = AdamW::new(&ops, DType::F32, DType::F32, groups.clone()).unwrap();
    let mut rng = Rng::new(5);
    for _ in 0..10 {
        for (gi, g) in groups.iter().enumerate() {
            for (j, shape) in g.shapes.iter().enumerate() {
                let n: usize = shape.iter().product();
                let raw: Vec<f64> = (0..n).map(|_| rng.signed_magnitude(1e-3, 1e-1)).collect();
                opt.grad(gi, j)
                    .copy_from_host(&HostTensor::from_f64(DType::F32, shape, &raw))
                    .unwrap();
            }
        }
        opt.step(&ops).unwrap();
    }
    let vmax = opt.max_exp_avg_sq_flat().unwrap().to_f64_vec().unwrap();
    let v = opt.exp_avg_sq_flat().to_f64_vec().unwrap();
    let layout = opt.layout();
    for (gi, seg) in layout.segments.iter().enumerate() {
        let slots = seg.slots.iter().flat_map(|s| s.offset..s.offset + s.numel);
        let (above, total) = slots.fold((0, 0), |(a, t), i| (a + (vmax[i] > v[i]) as usize, t + 1));
        if gi == 1 {
            assert!(
                above * 2 > total,
                "group 1: max above v in only {above} of {total}"
            );
        } else {
            assert_eq!(above, 0, "group {gi} has no amsgrad: its slots hold v");
        }
    }
    // Without amsgrad anywhere there is no buffer.
    let plain = AdamW::new(&ops, DType::F32, DType::F32, two_groups(1.0)).unwrap();
    assert!(plain.max_exp_avg_sq_flat().is_none());
}

#[test]
fn adamw_grid_stride_and_other_blocks() {
    for launch in [
        AdamWLaunch {
            block: 256,
            grid: Some(3),
            num_warps: None,
        },
        AdamWLaunch {
            block: 4096,
            grid: Some(1),
            num_warps: Some(4),
        },
    ] {
        run(&adamw_case(DType::F32, DType::F32, launch));
    }
}

/// Capturable mode (torch's `capturable`): the device counts the steps and computes the
/// bias corrections in f32; the trajectory still matches torch's in f64. Switched on at
/// step 1 or mid-run, with an lr change while on, for f32 and bf16 parameters and a
/// grid-stride launch; switching off resumes from the device's count.
#[test]
fn adamw_capturable_trajectories() {
    for (param, state, from, launch) in [
        (DType::F32, DType::F32, 1, AdamWLaunch::default()),
        (DType::BF16, DType::F32, 4, AdamWLaunch::default()),
        (
            DType::F32,
            DType::BF16,
            2,
            AdamWLaunch {
                block: 256,
                grid: Some(3),
                num_warps: None,
            },
        ),
    ] {
        run(&AdamWCheck {
            steps: 12,
            lr_change: Some((8, 0.5)),
            capturable_from: Some(from),
            ..adamw_case(param, state, launch)
        });
    }
}

/// Capturable mode: the launch is fixed while it is on, switching off reads the
/// device's count back, and a step inside a capture needs it.
#[test]
fn adamw_capturable_mode_switches() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut opt = AdamW::new(&ops, DType::F32, DType::F32, two_groups(1.0)).unwrap();
    opt.step(&ops).unwrap();
    opt.set_capturable(&ops, true).unwrap();
    assert!(opt.capturable());
    let e = opt.set_launch(AdamWLaunch::default()).unwrap_err();
    assert!(e.to_string().contains("capturable"), "{e}");
    // The counter is uploaded by the next step: until then the device count is pending.
    assert_eq!(opt.device_step_count(&ops).unwrap(), 1);
    for _ in 0..3 {
        opt.step(&ops).unwrap();
    }
    assert_eq!(opt.device_step_count(&ops).unwrap(), 4);
    opt.set_step_count(10);
    opt.step(&ops).unwrap();
    assert_eq!(opt.device_step_count(&ops).unwrap(), 11);
    opt.set_capturable(&ops, false).unwrap();
    assert_eq!(opt.step_count(), 11);
    opt.set_launch(AdamWLaunch::default()).unwrap();
}

/// The check itself must be able to fail: a wrong hyperparameter in the reference's
/// copy of the groups (the optimizer gets the right ones) is caught.
#[test]
fn adamw_check_detects_a_wrong_update() {
    let d = Device::interpreter();
    let c = adamw_case(DType::F32, DType::F32, AdamWLaunch::default());
    let ops = Ops::new(&d);
    let mut opt = AdamW::new(&ops, DType::F32, DType::F32, c.groups.clone()).unwrap();
    let p = opt.param(1, 0);
    let n = p.numel();
    let mut rng = Rng::new(1);
    let init: Vec<f64> = (0..n).map(|_| rng.signed_magnitude(0.01, 1.0)).collect();
    let grads: Vec<f64> = (0..n).map(|_| rng.signed_magnitude(1e-3, 0.1)).collect();
    p.copy_from_host(&HostTensor::from_f64(DType::F32, &[33, 31], &init))
        .unwrap();
    opt.grad(1, 0)
        .copy_from_host(&HostTensor::from_f64(DType::F32, &[33, 31], &grads))
        .unwrap();
    opt.step(&ops).unwrap();
    let got = p.to_f64_vec().unwrap();
    let init = round_to(DType::F32, &init);
    let grads = round_to(DType::F32, &grads);
    let reference = |h: TorchHyper| {
        let (mut q, mut m, mut v) = (init.clone(), vec![0.0; n], vec![0.0; n]);
        torch_adamw_step(&mut q, &grads, &mut m, &mut v, &mut [], &h, 1);
        q
    };
    let right = TorchHyper::from(&c.groups[1]);
    let tol = 1e-6;
    assert!(compare("p", &got, &reference(right), tol, 1e-9).is_ok());
    for wrong in [
        TorchHyper {
            maximize: false,
            ..right
        },
        TorchHyper {
            weight_decay: 0.0,
            ..right
        },
        TorchHyper {
            lr: right.lr * 1.01,
            ..right
        },
    ] {
        assert!(compare("p", &got, &reference(wrong), tol, 1e-9).is_err());
    }
}

#[test]
fn layout_aligns_tensors_and_groups() {
    let shapes = vec![
        vec![vec![7], vec![1], vec![3, 5]],
        vec![],
        vec![vec![4097], vec![0, 9]],
    ];
    let l = FlatLayout::new(&shapes, 4, GROUP_ALIGN).unwrap();
    let s = &l.segments;
    assert_eq!(
        s[0].slots.iter().map(|x| x.offset).collect::<Vec<_>>(),
        [0, 8, 12]
    );
    assert_eq!((s[0].start, s[0].len), (0, GROUP_ALIGN));
    assert_eq!((s[1].start, s[1].len), (GROUP_ALIGN, 0));
    assert_eq!(s[2].start, GROUP_ALIGN);
    assert_eq!(s[2].slots[0].offset, GROUP_ALIGN);
    assert_eq!(s[2].slots[1].offset, GROUP_ALIGN + 4100);
    assert_eq!(s[2].len, 2 * GROUP_ALIGN);
    assert_eq!(l.len, 3 * GROUP_ALIGN);
    let bg = l.block_groups(1024);
    assert_eq!(bg.len(), 12);
    assert!(bg[..4].iter().all(|&g| g == 0) && bg[4..].iter().all(|&g| g == 2));
}

#[test]
fn hyper_row_bias_corrections() {
    let g = ParamGroup {
        betas: (0.9, 0.999),
        maximize: true,
        ..ParamGroup::new(1e-3)
    };
    let r1 = g.hyper_row(1);
    assert_eq!(r1[0], (1.0 - 1e-3 * 1e-2) as f32);
    assert_eq!(r1[2], -(1.0f64 - 0.9) as f32);
    assert_eq!(r1[4], (1.0f64 - 0.999) as f32);
    // The point of sending 1 - beta2: f32 arithmetic on f32(beta2) would be 1.3e-5 off.
    assert!(((1.0 - 0.999f32) as f64 / 1e-3 - 1.0).abs() > 1e-5);
    assert!((r1[4] as f64 / 1e-3 - 1.0).abs() < 1e-7);
    assert_eq!(r1[6], (1e-3f64 / (1.0 - 0.9)) as f32);
    assert_eq!(r1[7], (1.0 / (1.0f64 - 0.999).sqrt()) as f32);
    let r = g.hyper_row(10_000);
    assert_eq!(r[6], 1e-3f32);
    assert!((r[7] as f64 - 1.0 / (1.0 - 0.999f64.powi(10_000)).sqrt()).abs() < 1e-7);
}

#[test]
fn clip_and_norm_against_f64() {
    let d = Device::interpreter();
    let l = GradStatsLaunch::default();
    for &(dt, n) in &[
        (DType::F32, 1usize),
        (DType::F32, 7),
        (DType::F32, 1000),
        (DType::F32, 4097),
        (DType::BF16, 4097),
        (DType::F16, 1000),
    ] {
        // scale 1: the norm is > 1 for n > 3 (clipping); n = 1 and 7 are not clipped.
        let r = check_clip(&d, dt, n, 1.0, &[], 1.0, l, 5);
        assert!(r.is_ok(), "{dt} n={n}: {r:?}");
        // Never clipped: the gradient is untouched.
        let r = check_clip(&d, dt, n, 1.0, &[], 1e6, l, 6);
        assert!(r.is_ok(), "{dt} n={n} unclipped: {r:?}");
    }
}

#[test]
fn clip_grid_stride_and_small_blocks() {
    let d = Device::interpreter();
    // 132 partial blocks (1 per SM on the interpreter's 132) over 313 chunks of 32.
    let l = GradStatsLaunch {
        block: 32,
        blocks_per_sm: 1,
        scale_grid: Some(5),
        num_warps: None,
    };
    let r = check_clip(&d, DType::F32, 10_000, 1.0, &[], 1.0, l, 8);
    assert!(r.is_ok(), "{r:?}");
    let r = check_clip(
        &d,
        DType::BF16,
        10_000,
        1.0,
        &[(9_999, f64::NAN)],
        1.0,
        l,
        9,
    );
    assert!(r.is_ok(), "{r:?}");
}

#[test]
fn clip_with_inf_and_nan() {
    let d = Device::interpreter();
    let l = GradStatsLaunch::default();
    let cases: &[(DType, &[(usize, f64)])] = &[
        // inf: norm inf, coefficient 0, the gradient becomes 0 (and NaN at the inf).
        (DType::F32, &[(3, f64::INFINITY)]),
        (
            DType::BF16,
            &[(4096, f64::NEG_INFINITY), (0, f64::INFINITY)],
        ),
        // NaN: norm and coefficient NaN, every element NaN (torch's behaviour).
        (DType::F32, &[(1000, f64::NAN)]),
        (DType::F16, &[(5, f64::NAN), (6, f64::INFINITY)]),
    ];
    for (dt, inject) in cases {
        let r = check_clip(&d, *dt, 4097, 1.0, inject, 1.0, l, 10);
        assert!(r.is_ok(), "{dt} {inject:?}: {r:?}");
    }
    // The count is exact, and a huge max_norm still sees the non-finite norm.
    let ops = Ops::new(&d);
    let mut x = vec![0.5; 1000];
    x[10] = f64::NAN;
    x[20] = f64::INFINITY;
    x[999] = f64::NEG_INFINITY;
    let g = d.from_f64(DType::F32, &[1000], &x).unwrap();
    let s = read_grad_stats(&grad_norm(&ops, &g).unwrap()).unwrap();
    assert_eq!(s.nonfinite, 3);
    assert!(!s.all_finite());
    assert!(s.norm.is_nan() && s.clip_coef.is_nan());
}

#[test]
fn optimizer_grad_norm_and_clip_cover_every_view() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut opt = AdamW::new(&ops, DType::F32, DType::F32, two_groups(1.0)).unwrap();
    let mut rng = Rng::new(4);
    let mut all = Vec::new();
    for (gi, g) in two_groups(1.0).iter().enumerate() {
        for (j, shape) in g.shapes.iter().enumerate() {
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n).map(|_| rng.signed_magnitude(0.01, 1.0)).collect();
            let h = HostTensor::from_f64(DType::F32, shape, &v);
            opt.grad(gi, j).copy_from_host(&h).unwrap();
            all.extend(h.to_f64_vec());
        }
    }
    let norm = all.iter().map(|v| v * v).sum::<f64>().sqrt();
    let s = read_grad_stats(&opt.grad_norm(&ops).unwrap()).unwrap();
    assert!((s.norm - norm).abs() <= 1e-5 * norm, "{} vs {norm}", s.norm);
    assert_eq!(s.clip_coef, 1.0);
    let s = read_grad_stats(&opt.clip_grad_norm_(&ops, 2.0).unwrap()).unwrap();
    let coef = 2.0 / (norm + 1e-6);
    assert!((s.clip_coef - coef).abs() <= 1e-5 * coef);
    let after = read_grad_stats(&grad_norm(&ops, opt.grads_flat()).unwrap()).unwrap();
    assert!((after.norm - 2.0).abs() < 1e-4, "{}", after.norm);
    opt.zero_grad().unwrap();
    assert!(opt
        .grads_flat()
        .to_f64_vec()
        .unwrap()
        .iter()
        .all(|&v| v == 0.0));
    // set_lr takes effect and is validated.
    opt.set_lr(1, 0.5).unwrap();
    assert_eq!(opt.lr(1), Some(0.5));
    assert!(matches!(opt.set_lr(1, -1.0), Err(OpError::Shape { .. })));
    assert_eq!(opt.lr(1), Some(0.5));
    assert!(matches!(opt.set_lr(2, 0.1), Err(OpError::Shape { .. })));
}

#[test]
fn empty_parameters_make_no_launch() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let g = ParamGroup {
        shapes: vec![vec![0, 5]],
        ..ParamGroup::new(1e-3)
    };
    let mut opt = AdamW::new(&ops, DType::F32, DType::F32, vec![g]).unwrap();
    opt.step(&ops).unwrap();
    assert_eq!((opt.step_count(), opt.step_launches()), (1, 0));
    assert_eq!(opt.param(0, 0).shape(), [0, 5]);
    let s = read_grad_stats(&opt.grad_norm(&ops).unwrap()).unwrap();
    assert_eq!((s.sumsq, s.nonfinite, s.clip_coef), (0.0, 0, 1.0));
}

#[test]
fn typed_errors() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let one = || {
        vec![ParamGroup {
            shapes: vec![vec![10]],
            ..ParamGroup::new(1e-3)
        }]
    };
    let err = |r: Result<AdamW, OpError>| r.unwrap_err();
    assert!(matches!(
        err(AdamW::new(&ops, DType::I32, DType::F32, one())),
        OpError::Dtype { .. }
    ));
    assert!(matches!(
        err(AdamW::new(&ops, DType::F32, DType::I64, one())),
        OpError::Dtype { .. }
    ));
    assert!(matches!(
        err(AdamW::new(&ops, DType::F32, DType::F32, vec![])),
        OpError::Shape { .. }
    ));
    for bad in [
        ParamGroup {
            lr: -1.0,
            ..one()[0].clone()
        },
        ParamGroup {
            lr: f64::NAN,
            ..one()[0].clone()
        },
        ParamGroup {
            eps: -1e-8,
            ..one()[0].clone()
        },
        ParamGroup {
            betas: (1.0, 0.999),
            ..one()[0].clone()
        },
        ParamGroup {
            betas: (0.9, -0.1),
            ..one()[0].clone()
        },
        ParamGroup {
            weight_decay: -0.1,
            ..one()[0].clone()
        },
    ] {
        let e = err(AdamW::new(&ops, DType::F32, DType::F32, vec![bad.clone()]));
        assert!(matches!(e, OpError::Shape { .. }), "{bad:?}: {e}");
    }
    let too_many = vec![ParamGroup::new(1e-3); MAX_GROUPS + 1];
    assert!(matches!(
        err(AdamW::new(&ops, DType::F32, DType::F32, too_many)),
        OpError::Shape { .. }
    ));
    for block in [1000, 16, 8192] {
        let l = AdamWLaunch {
            block,
            ..AdamWLaunch::default()
        };
        let e = err(AdamW::with_launch(&ops, DType::F32, DType::F32, one(), l));
        assert!(
            matches!(
                e,
                OpError::Runtime(kgen_runtime::RuntimeError::LaunchConfig(_))
            ),
            "block {block}: {e}"
        );
    }
    // Another device.
    let mut opt = AdamW::new(&ops, DType::F32, DType::F32, one()).unwrap();
    let other = Ops::new(&Device::interpreter());
    assert!(matches!(
        opt.step(&other),
        Err(OpError::Runtime(kgen_runtime::RuntimeError::WrongDevice(_)))
    ));
    assert_eq!(opt.step_count(), 0);
    // Gradient statistics: dtype, contiguity, stats shape.
    let gi = d.zeros(DType::I32, &[100]).unwrap();
    assert!(matches!(grad_norm(&ops, &gi), Err(OpError::Dtype { .. })));
    let g2 = d.zeros(DType::F32, &[10, 20]).unwrap();
    let gt = g2.transpose(0, 1).unwrap();
    assert!(matches!(grad_norm(&ops, &gt), Err(OpError::Shape { .. })));
    assert!(grad_norm(&ops, &g2).is_ok());
    let bad_stats = d.zeros(DType::F32, &[3]).unwrap();
    assert!(matches!(
        grad::scale_by_stats(&ops, &g2, &bad_stats, GradStatsLaunch::default()),
        Err(OpError::Shape { .. })
    ));
    assert!(matches!(
        read_grad_stats(&bad_stats),
        Err(OpError::Shape { .. })
    ));
    let l = GradStatsLaunch {
        blocks_per_sm: 0,
        ..GradStatsLaunch::default()
    };
    assert!(matches!(GradStats::new(&ops, l), Err(OpError::Runtime(_))));
}
