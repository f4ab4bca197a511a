//! The loss ops (`kgen::ops::loss`: softmax, softmax backward, cross-entropy) on the
//! interpreter: numerics against float64 references on awkward shapes and every dtype
//! (outputs poisoned first), gradients by finite differences, the defined edge behaviour
//! (target 0, V = 1, all rows ignored, out-of-range targets) and the typed errors.

mod common;

use kgen::cases::cross_entropy::{ce_reference, count_reference, softmax_bwd_reference};
use kgen::cases::Rng;
use kgen::core::DType;
use kgen::ops::{OpError, Ops};
use kgen::runtime::{Device, Tensor};

const IGNORE: i64 = kgen::ops::loss::DEFAULT_IGNORE_INDEX;

#[test]
fn gpu_checks_pass_on_the_interpreter() {
    let d = Device::interpreter();
    let all = kgen::checks::ops::loss::gpu_checks(&d);
    for (label, r) in &all {
        eprintln!("{label}: {r:?}");
    }
    assert!(all.len() >= 6);
    for (label, r) in all {
        assert!(r.is_ok(), "{label}: {r:?}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_checks_pass_on_the_gpu() {
    let d = Device::cuda(0).expect("a CUDA device");
    for (label, r) in kgen::checks::ops::loss::gpu_checks(&d) {
        println!("{label}: {r:?}");
        assert!(r.is_ok(), "{label}: {r:?}");
    }
}

// ------------------------------------------------------------------ helpers

use common::ops::{nan_tensor, put, rand_vec};

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

/// (relative, absolute) tolerance of an f32 computation rounded once to `dt` (f16's
/// absolute part: half the spacing of its subnormals).
fn tol(dt: DType) -> (f64, f64) {
    match dt {
        DType::BF16 => (1.6e-2, 0.0),
        DType::F16 => (2e-3, 3e-8),
        _ => (2e-5, 0.0),
    }
}

/// Element-wise `|got - want| <= abs + rel * max(|want|, floor)` with floor = 1e-3 of
/// the largest |want| (values near zero judged on the output's scale); NaN only where
/// want is NaN.
fn assert_close(what: &str, got: &[f64], want: &[f64], (rel, abs): (f64, f64)) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let floor = 1e-3
        * want
            .iter()
            .fold(1e-30f64, |m, v| if v.is_nan() { m } else { m.max(v.abs()) });
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g}, expected NaN");
            continue;
        }
        let e = ((g - w).abs() - abs).max(0.0) / w.abs().max(floor);
        assert!(
            e <= rel,
            "{what}[{i}]: got {g}, expected {w} (rel {e:.2e} > {rel:.0e})"
        );
    }
}

/// An f32-only relative tolerance.
fn rel(r: f64) -> (f64, f64) {
    (r, 0.0)
}

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

// ------------------------------------------------------------------ softmax

#[test]
fn softmax_forward_and_backward_match_f64_on_awkward_shapes() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(1);
    for &(rows, cols) in &[(1usize, 1usize), (7, 7), (3, 1000), (3, 4097), (2, 9000)] {
        for dt in FLOATS {
            let what = format!("{dt} [{rows}x{cols}]");
            let (x, xv) = put(&d, dt, &[rows, cols], &rand_vec(&mut rng, rows * cols, 2.0));
            let y = nan_tensor(&d, dt, &[rows, cols]);
            ops.softmax_into(&x, &y).unwrap();
            let yv = vals(&y);
            assert_close(
                &format!("softmax {what}"),
                &yv,
                &kgen::cases::softmax::reference(&xv, cols),
                tol(dt),
            );

            let (dy, dyv) = put(&d, dt, &[rows, cols], &rand_vec(&mut rng, rows * cols, 1.0));
            let dx = nan_tensor(&d, dt, &[rows, cols]);
            ops.softmax_backward_into(&y, &dy, &dx).unwrap();
            // The backward is judged from the stored y it was given.
            assert_close(
                &format!("softmax_backward {what}"),
                &vals(&dx),
                &softmax_bwd_reference(&yv, &dyv, cols),
                tol(dt),
            );
        }
    }
}

#[test]
fn softmax_takes_rank_1_and_3_and_allocating_forms() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(2);
    let (x, xv) = put(&d, DType::F32, &[2, 3, 33], &rand_vec(&mut rng, 198, 2.0));
    let y = ops.softmax(&x).unwrap();
    assert_eq!(y.shape(), &[2, 3, 33]);
    let yv = vals(&y);
    assert_close(
        "rank 3",
        &yv,
        &kgen::cases::softmax::reference(&xv, 33),
        rel(2e-5),
    );
    let (dy, dyv) = put(&d, DType::F32, &[2, 3, 33], &rand_vec(&mut rng, 198, 1.0));
    let dx = ops.softmax_backward(&y, &dy).unwrap();
    assert_close(
        "rank 3 bwd",
        &vals(&dx),
        &softmax_bwd_reference(&yv, &dyv, 33),
        rel(2e-5),
    );

    let (x1, x1v) = put(&d, DType::BF16, &[77], &rand_vec(&mut rng, 77, 2.0));
    let y1 = ops.softmax(&x1).unwrap();
    assert_close(
        "rank 1",
        &vals(&y1),
        &kgen::cases::softmax::reference(&x1v, 77),
        tol(DType::BF16),
    );
}

/// f(x) = sum(w * softmax(x)) per row, in f64.
fn weighted_softmax_sum(x: &[f64], w: &[f64], cols: usize) -> f64 {
    let y = kgen::cases::softmax::reference(x, cols);
    y.iter().zip(w).map(|(a, b)| a * b).sum()
}

#[test]
fn softmax_backward_matches_finite_differences() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(3);
    for &(rows, cols) in &[(3usize, 7usize), (2, 40)] {
        let (x, xv) = put(
            &d,
            DType::F32,
            &[rows, cols],
            &rand_vec(&mut rng, rows * cols, 1.5),
        );
        let (dy, dyv) = put(
            &d,
            DType::F32,
            &[rows, cols],
            &rand_vec(&mut rng, rows * cols, 1.0),
        );
        let y = ops.softmax(&x).unwrap();
        let dx = vals(&ops.softmax_backward(&y, &dy).unwrap());
        let h = 1e-6;
        let mut fd = Vec::with_capacity(xv.len());
        for i in 0..xv.len() {
            let (mut p, mut m) = (xv.clone(), xv.clone());
            p[i] += h;
            m[i] -= h;
            fd.push(
                (weighted_softmax_sum(&p, &dyv, cols) - weighted_softmax_sum(&m, &dyv, cols))
                    / (2.0 * h),
            );
        }
        // f32 y (rounded once) and f32 math against an f64 central difference.
        assert_close(&format!("fd [{rows}x{cols}]"), &dx, &fd, rel(1e-4));
    }
}

// ------------------------------------------------------------------ cross-entropy

/// Targets: row r ignored when r % 7 == 3, else uniform in 0..vocab.
fn targets(rng: &mut Rng, rows: usize, vocab: usize) -> Vec<f64> {
    (0..rows)
        .map(|r| {
            if r % 7 == 3 {
                IGNORE as f64
            } else {
                (rng.next_u64() % vocab as u64) as f64
            }
        })
        .collect()
}

/// Runs cross_entropy_into (poisoned outputs) and checks every output against f64.
fn check_ce(
    ops: &Ops,
    rng: &mut Rng,
    dt: DType,
    idx: DType,
    shape: &[usize],
    tv: &[f64],
    ignore: i64,
) {
    let d = ops.device();
    let vocab = *shape.last().unwrap();
    let rows: usize = shape[..shape.len() - 1].iter().product::<usize>().max(1);
    let what = format!("{dt} I={idx} {shape:?} ignore={ignore}");
    let (x, xv) = put(d, dt, shape, &rand_vec(rng, rows * vocab, 2.5));
    let tshape: Vec<usize> = if shape.len() == 1 {
        vec![1]
    } else {
        shape[..shape.len() - 1].to_vec()
    };
    let (tg, _) = put(d, idx, &tshape, tv);
    let loss = nan_tensor(d, DType::F32, &[1]);
    let row_loss = nan_tensor(d, DType::F32, &[rows]);
    let stats = nan_tensor(d, DType::F32, &[2]);
    let dx = nan_tensor(d, dt, shape);
    ops.cross_entropy_into(&x, &tg, ignore, &loss, &dx, &row_loss, &stats)
        .unwrap();

    let [count, inv] = count_reference(tv, ignore as f64);
    let (rl, dxr) = ce_reference(&xv, tv, vocab, ignore as f64, inv);
    assert_close(
        &format!("stats {what}"),
        &vals(&stats),
        &[count, inv],
        rel(1e-7),
    );
    assert_close(
        &format!("row loss {what}"),
        &vals(&row_loss),
        &rl,
        rel(2e-5),
    );
    let mean = if count > 0.0 {
        rl.iter().sum::<f64>() / count
    } else {
        f64::NAN
    };
    assert_close(&format!("loss {what}"), &vals(&loss), &[mean], rel(2e-5));
    assert_close(&format!("dlogits {what}"), &vals(&dx), &dxr, tol(dt));

    // The in-place form gives the same loss and the same gradient, over the logits.
    let loss2 = ops.cross_entropy_in_place(&x, &tg, ignore).unwrap();
    assert_eq!(vals(&loss2), vals(&loss), "in-place loss {what}");
    assert_eq!(vals(&x), vals(&dx), "in-place dlogits {what}");
}

#[test]
fn cross_entropy_matches_f64_on_awkward_shapes_dtypes_and_index_types() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(4);
    for &(rows, vocab) in &[
        (1usize, 1usize),
        (9, 1),
        (7, 7),
        (9, 1000),
        (8, 4097),
        (3, 9000),
    ] {
        for dt in FLOATS {
            for idx in [DType::I64, DType::I32] {
                let tv = targets(&mut rng, rows, vocab);
                check_ce(&ops, &mut rng, dt, idx, &[rows, vocab], &tv, IGNORE);
            }
        }
    }
}

#[test]
fn cross_entropy_takes_any_leading_shape_and_target_zero_and_a_custom_ignore_index() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(5);
    // [2, 3, V] logits with [2, 3] targets; rank-1 logits with one target.
    let tv = vec![0.0, 4.0, 5.0, 0.0, 1.0, 2.0];
    check_ce(
        &ops,
        &mut rng,
        DType::F32,
        DType::I64,
        &[2, 3, 11],
        &tv,
        IGNORE,
    );
    check_ce(
        &ops,
        &mut rng,
        DType::BF16,
        DType::I32,
        &[37],
        &[0.0],
        IGNORE,
    );
    // ignore_index = 0: the class-0 rows are skipped.
    let tv = vec![0.0, 3.0, 0.0, 6.0, 1.0];
    check_ce(&ops, &mut rng, DType::F32, DType::I32, &[5, 7], &tv, 0);
}

#[test]
fn cross_entropy_with_every_row_ignored_gives_nan_loss_and_zero_gradient() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(6);
    for idx in [DType::I64, DType::I32] {
        let (x, _) = put(&d, DType::BF16, &[5, 1000], &rand_vec(&mut rng, 5000, 2.0));
        let (tg, _) = put(&d, idx, &[5], &[IGNORE as f64; 5]);
        let (loss, dx) = ops.cross_entropy(&x, &tg, IGNORE).unwrap();
        assert!(vals(&loss)[0].is_nan(), "torch: mean over zero rows is NaN");
        assert!(vals(&dx).iter().all(|&v| v == 0.0));
        let loss = ops.cross_entropy_in_place(&x, &tg, IGNORE).unwrap();
        assert!(vals(&loss)[0].is_nan());
        assert!(vals(&x).iter().all(|&v| v == 0.0));
    }
}

#[test]
fn out_of_range_targets_give_nan_rows_and_never_read_out_of_bounds() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(7);
    let vocab = 7;
    // V, -1, i32::MAX, 2^32 + 3 (an i64 target that a truncation to i32 would take for
    // class 3), next to valid and ignored rows.
    for idx in [DType::I64, DType::I32] {
        let mut tv = vec![
            vocab as f64,
            2.0,
            -1.0,
            IGNORE as f64,
            i32::MAX as f64,
            0.0,
            6.0,
        ];
        if idx == DType::I64 {
            tv.push((1u64 << 32) as f64 + 3.0);
        }
        let rows = tv.len();
        let (x, xv) = put(
            &d,
            DType::F32,
            &[rows, vocab],
            &rand_vec(&mut rng, rows * vocab, 2.0),
        );
        let (tg, _) = put(&d, idx, &[rows], &tv);
        let (loss, dx) = ops.cross_entropy(&x, &tg, IGNORE).unwrap();
        assert!(vals(&loss)[0].is_nan(), "{idx}: the mean includes NaN rows");
        // Out-of-range rows count as not ignored (they are errors, not skips).
        let [_, inv] = count_reference(&tv, IGNORE as f64);
        let (_, dxr) = ce_reference(&xv, &tv, vocab, IGNORE as f64, inv);
        assert!(dxr.iter().filter(|v| v.is_nan()).count() >= 3 * vocab);
        assert_close(&format!("{idx} dlogits"), &vals(&dx), &dxr, rel(2e-5));
    }
}

/// The mean cross-entropy in f64 over non-ignored rows.
fn mean_ce(x: &[f64], tv: &[f64], vocab: usize) -> f64 {
    let [count, _] = count_reference(tv, IGNORE as f64);
    let (rl, _) = ce_reference(x, tv, vocab, IGNORE as f64, 0.0);
    rl.iter().sum::<f64>() / count
}

#[test]
fn cross_entropy_gradient_matches_finite_differences() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(8);
    for &(rows, vocab) in &[(7usize, 5usize), (4, 33)] {
        let tv = targets(&mut rng, rows, vocab);
        let (x, xv) = put(
            &d,
            DType::F32,
            &[rows, vocab],
            &rand_vec(&mut rng, rows * vocab, 2.0),
        );
        let (tg, _) = put(&d, DType::I64, &[rows], &tv);
        let (loss, dx) = ops.cross_entropy(&x, &tg, IGNORE).unwrap();
        assert_close("loss", &vals(&loss), &[mean_ce(&xv, &tv, vocab)], rel(1e-5));
        let h = 1e-6;
        let fd: Vec<f64> = (0..xv.len())
            .map(|i| {
                let (mut p, mut m) = (xv.clone(), xv.clone());
                p[i] += h;
                m[i] -= h;
                (mean_ce(&p, &tv, vocab) - mean_ce(&m, &tv, vocab)) / (2.0 * h)
            })
            .collect();
        assert_close(&format!("fd [{rows}x{vocab}]"), &vals(&dx), &fd, rel(1e-4));
    }
}

#[test]
fn cross_entropy_is_stable_for_large_logits() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(9);
    let (rows, vocab) = (3, 5000);
    // Logits around +-1e4: a naive exp overflows (or underflows to a zero sum).
    for offset in [1e4, -1e4] {
        let v: Vec<f64> = rand_vec(&mut rng, rows * vocab, 3.0)
            .iter()
            .map(|x| x + offset)
            .collect();
        let (x, xv) = put(&d, DType::F32, &[rows, vocab], &v);
        let tv = vec![17.0, 4999.0, 0.0];
        let (tg, _) = put(&d, DType::I32, &[rows], &tv);
        let (loss, dx) = ops.cross_entropy(&x, &tg, IGNORE).unwrap();
        let (rl, dxr) = ce_reference(&xv, &tv, vocab, IGNORE as f64, 1.0 / 3.0);
        // Error ~ ulp(1e4) = 1e-3 on the loss (|x| carries it), relative to a loss of ~10.
        assert_close(
            "loss",
            &vals(&loss),
            &[rl.iter().sum::<f64>() / 3.0],
            rel(2e-4),
        );
        assert_close("dlogits", &vals(&dx), &dxr, rel(2e-3));
    }
}

// ------------------------------------------------------------------ errors

fn is_shape(r: Result<impl std::fmt::Debug, OpError>) -> bool {
    matches!(r, Err(OpError::Shape { .. }))
}

fn is_dtype(r: Result<impl std::fmt::Debug, OpError>) -> bool {
    matches!(r, Err(OpError::Dtype { .. }))
}

#[test]
fn misuse_gives_typed_errors() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let x = d.from_f64(DType::F32, &[4, 10], &[0.5; 40]).unwrap();
    let t64 = d.from_f64(DType::I64, &[4], &[1.0; 4]).unwrap();
    let t32 = d.from_f64(DType::I32, &[4], &[1.0; 4]).unwrap();

    // softmax
    assert!(is_dtype(ops.softmax(&t64)));
    let scalar = d.from_f64(DType::F32, &[], &[1.0]).unwrap();
    assert!(is_shape(ops.softmax(&scalar)));
    let empty = d.empty(DType::F32, &[4, 0]).unwrap();
    assert!(is_shape(ops.softmax(&empty)));
    assert!(is_shape(
        ops.softmax_into(&x, &d.zeros(DType::F32, &[4, 11]).unwrap())
    ));
    assert!(is_dtype(
        ops.softmax_into(&x, &d.zeros(DType::BF16, &[4, 10]).unwrap())
    ));
    assert!(is_shape(
        ops.softmax_backward(&x, &d.zeros(DType::F32, &[10, 4]).unwrap())
    ));
    assert!(is_dtype(
        ops.softmax_backward(&x, &d.zeros(DType::F16, &[4, 10]).unwrap())
    ));

    // cross_entropy
    assert!(is_dtype(ops.cross_entropy(&t64, &t64, IGNORE)));
    let tf = d.from_f64(DType::F32, &[4], &[1.0; 4]).unwrap();
    assert!(is_dtype(ops.cross_entropy(&x, &tf, IGNORE)));
    let t5 = d.from_f64(DType::I64, &[5], &[1.0; 5]).unwrap();
    assert!(is_shape(ops.cross_entropy(&x, &t5, IGNORE)));
    let t2d = d.from_f64(DType::I64, &[2, 2], &[1.0; 4]).unwrap();
    assert!(is_shape(ops.cross_entropy(&x, &t2d, IGNORE)));
    assert!(is_shape(ops.cross_entropy(&empty, &t64, IGNORE)));
    assert!(
        is_dtype(ops.cross_entropy(&x, &t32, 1 << 40)),
        "ignore_index beyond i32"
    );
    assert!(is_dtype(ops.cross_entropy_in_place(&x, &t32, -(1 << 40))));
    let (loss, dx) = ops.cross_entropy(&x, &t32, IGNORE).unwrap();
    let rl = d.zeros(DType::F32, &[4]).unwrap();
    let st = d.zeros(DType::F32, &[2]).unwrap();
    let bad_dx = d.zeros(DType::F32, &[4, 9]).unwrap();
    assert!(is_shape(
        ops.cross_entropy_into(&x, &t32, IGNORE, &loss, &bad_dx, &rl, &st)
    ));
    let bf_dx = d.zeros(DType::BF16, &[4, 10]).unwrap();
    assert!(is_dtype(
        ops.cross_entropy_into(&x, &t32, IGNORE, &loss, &bf_dx, &rl, &st)
    ));
    let loss2 = d.zeros(DType::F32, &[2]).unwrap();
    assert!(is_shape(
        ops.cross_entropy_into(&x, &t32, IGNORE, &loss2, &dx, &rl, &st)
    ));
    let rl3 = d.zeros(DType::F32, &[3]).unwrap();
    assert!(is_shape(
        ops.cross_entropy_into(&x, &t32, IGNORE, &loss, &dx, &rl3, &st)
    ));
    let st_bf = d.zeros(DType::BF16, &[2]).unwrap();
    assert!(is_dtype(
        ops.cross_entropy_into(&x, &t32, IGNORE, &loss, &dx, &rl, &st_bf)
    ));
    // dlogits overlapping the logits: the runtime's overlap check, a typed Runtime error.
    assert!(matches!(
        ops.cross_entropy_into(&x, &t32, IGNORE, &loss, &x, &rl, &st),
        Err(OpError::Runtime(_))
    ));
}

/// Times the fused cross-entropy (fwd+bwd, three launches) at the ANCHORS shapes on a
/// GPU: `cargo test --release --test ops_loss -- --ignored --nocapture gpu_timing`.
#[test]
#[ignore = "needs a GPU"]
fn gpu_timing_of_cross_entropy() {
    let d = Device::cuda(0).expect("a CUDA device");
    let ops = Ops::new(&d);
    let mut rng = Rng::new(10);
    for &(rows, vocab) in &[(8192usize, 50257usize), (4096, 128256)] {
        // Logits in [-2, 2) from a cheap hash (the values do not change the work).
        let xv: Vec<f64> = (0..rows * vocab)
            .map(|i| ((i * 2654435761) % 1000) as f64 * 0.004 - 2.0)
            .collect();
        let x = d.from_f64(DType::BF16, &[rows, vocab], &xv).unwrap();
        let tv = targets(&mut rng, rows, vocab);
        let tg = d.from_f64(DType::I64, &[rows], &tv).unwrap();
        let dx = d.empty(DType::BF16, &[rows, vocab]).unwrap();
        let (loss, rl, st) = (
            d.empty(DType::F32, &[1]).unwrap(),
            d.empty(DType::F32, &[rows]).unwrap(),
            d.empty(DType::F32, &[2]).unwrap(),
        );
        // The first call tunes.
        ops.cross_entropy_into(&x, &tg, IGNORE, &loss, &dx, &rl, &st)
            .unwrap();
        d.synchronize().unwrap();
        let n = 20;
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            ops.cross_entropy_into(&x, &tg, IGNORE, &loss, &dx, &rl, &st)
                .unwrap();
        }
        d.synchronize().unwrap();
        let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        // Warm the in-place kernel (its first call compiles it).
        ops.cross_entropy_in_place_into(&x, &tg, IGNORE, &loss, &rl, &st)
            .unwrap();
        d.synchronize().unwrap();
        let t1 = std::time::Instant::now();
        for _ in 0..n {
            ops.cross_entropy_in_place_into(&x, &tg, IGNORE, &loss, &rl, &st)
                .unwrap();
        }
        d.synchronize().unwrap();
        let us_ip = t1.elapsed().as_secs_f64() * 1e6 / n as f64;
        let key = kgen::runtime::autotune::Autotuner::key(
            "cross_entropy",
            &d,
            &format!("T=bf16,I=i64,rows={rows},V={vocab}"),
        );
        // HBM floor: read the logits once, write the gradient once.
        let gbs = 2.0 * 2.0 * (rows * vocab) as f64 / (us * 1e3);
        println!(
            "cross_entropy bf16 [{rows}x{vocab}]: {us:.1} us ({gbs:.0} GB/s of read + write), \
             in place {us_ip:.1} us, config {:?}",
            ops.tuner().stored(&key)
        );
    }
}
