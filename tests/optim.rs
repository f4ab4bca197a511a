//! `kgen::optim` outside the unit tests: its GPU self-test entries (`gpu_checks`) on the
//! interpreter (the same code the lead runs on the GPU through `kgen selftest`), and, on
//! a GPU, timings of the ANCHORS workloads (GPT-2 parameter list: AdamW step, grad norm,
//! clip_grad_norm_), `cargo test --release --test optim -- --ignored --nocapture`.

use kgen::core::DType;
use kgen::ops::Ops;
use kgen::optim::grad::scale_by_stats;
use kgen::optim::{AdamW, AdamWLaunch, GradStats, GradStatsLaunch, ParamGroup};
use kgen::runtime::Device;
use std::time::Instant;

#[test]
fn gpu_checks_pass_on_the_interpreter() {
    let t0 = Instant::now();
    let results = kgen::checks::optim::gpu_checks(&Device::interpreter());
    assert!(results.len() >= 8);
    for (label, r) in &results {
        eprintln!("{label}: {r:?}");
    }
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    eprintln!("{:.1} s", t0.elapsed().as_secs_f64());
}

/// The 148 tensors of GPT-2 small (124,439,808 parameters), as bench/README.md defines.
fn gpt2_shapes() -> Vec<Vec<usize>> {
    let d = 768;
    let mut v = vec![vec![50257, d], vec![1024, d]];
    for _ in 0..12 {
        v.extend([
            vec![d],
            vec![d],
            vec![d, 3 * d],
            vec![3 * d],
            vec![d, d],
            vec![d],
            vec![d],
            vec![d],
            vec![d, 4 * d],
            vec![4 * d],
            vec![4 * d, d],
            vec![d],
        ]);
    }
    v.extend([vec![d], vec![d]]);
    v
}

#[test]
fn gpt2_list_is_the_bench_definition() {
    let s = gpt2_shapes();
    assert_eq!(s.len(), 148);
    assert_eq!(
        s.iter().map(|x| x.iter().product::<usize>()).sum::<usize>(),
        124_439_808
    );
}

/// Median over 5 batches of `iters` calls, milliseconds per call (host clock, the
/// device synchronized around each batch).
fn time_ms(device: &Device, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    device.synchronize().unwrap();
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..iters {
                f();
            }
            device.synchronize().unwrap();
            t0.elapsed().as_secs_f64() * 1e3 / iters as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[2]
}

/// GPU only: the optimizer's self-test entries, then ANCHORS timings (GPT-2 list).
#[test]
#[ignore = "needs a GPU; run with --ignored"]
fn gpu_checks_and_timings() {
    let device = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => panic!("no GPU: {e}"),
    };
    eprintln!("{}", device.describe());
    let results = kgen::checks::optim::gpu_checks(&device);
    for (label, r) in &results {
        eprintln!("{label}: {r:?}");
    }
    assert!(results.iter().all(|(_, r)| r.is_ok()));
    let ops = Ops::new(&device);
    let sms = ops.sm_count();
    let group = ParamGroup {
        weight_decay: 0.1,
        shapes: gpt2_shapes(),
        ..ParamGroup::new(1e-3)
    };
    let n = 124_439_808f64;
    for (t, s) in [
        (DType::F32, DType::F32),
        (DType::BF16, DType::BF16),
        (DType::BF16, DType::F32),
    ] {
        let bytes = n * (3 * t.size_bytes() + 4 * s.size_bytes()) as f64;
        let mut opt = AdamW::new(&ops, t, s, vec![group.clone()]).unwrap();
        for (block, grid) in [(1024usize, None), (2048, None), (2048, Some(8 * sms))] {
            let launch = AdamWLaunch {
                block,
                grid,
                num_warps: None,
            };
            opt.set_launch(launch).unwrap();
            let before = opt.step_launches();
            let ms = time_ms(&device, 10, || opt.step(&ops).unwrap());
            let launches = opt.step_launches() - before;
            assert_eq!(launches, 3 + 5 * 10, "one launch per step");
            eprintln!(
                "adamw T={t} S={s} block={block} grid={grid:?}: {:.1} us, {:.2} TB/s",
                ms * 1e3,
                bytes / ms / 1e9
            );
        }
    }
    // Gradient norm / clip over fp32 GPT-2 grads (nonzero, so clipping scales).
    let len = 124_439_808usize;
    let vals: Vec<f32> = (0..len)
        .map(|i| ((i % 1000) as f32 - 499.5) * 1e-5)
        .collect();
    let g = device.from_slice(&[len], &vals).unwrap();
    for block in [1024usize, 2048, 4096] {
        for bps in [2usize, 4, 8] {
            let l = GradStatsLaunch {
                block,
                blocks_per_sm: bps,
                scale_grid: None,
                num_warps: None,
            };
            let stats = GradStats::new(&ops, l).unwrap();
            let norm = time_ms(&device, 20, || {
                stats.compute(&ops, &g, f32::INFINITY).unwrap()
            });
            // Scaling alone, by a fixed coefficient != 1 (a repeated clip_ converges to
            // a norm whose coefficient is exactly 1, and then skips the pass).
            let coef = device
                .from_slice(&[4], &[1.0f32, 1.0, 0.0, 0.999_999])
                .unwrap();
            let scale = time_ms(&device, 20, || scale_by_stats(&ops, &g, &coef, l).unwrap());
            eprintln!(
                "grad stats block={block} blocks/SM={bps}: norm {:.1} us ({:.2} TB/s), scale {:.1} us ({:.2} TB/s), clip = norm + scale {:.1} us",
                norm * 1e3,
                len as f64 * 4.0 / norm / 1e9,
                scale * 1e3,
                len as f64 * 8.0 / scale / 1e9,
                (norm + scale) * 1e3
            );
        }
    }
}
