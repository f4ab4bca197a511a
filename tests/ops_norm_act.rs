//! The norm / activation / RoPE ops (`kgen::ops::{norm, act, rope}`) on the interpreter:
//! numerics against float64 references on awkward shapes and every dtype (outputs
//! poisoned first), gradients by finite differences, views, and the typed errors.

mod common;

use kgen::cases::Rng;
use kgen::core::DType;
use kgen::ops::{OpError, Ops};
use kgen::runtime::Device;

#[test]
fn gpu_checks_pass_on_the_interpreter() {
    let d = Device::interpreter();
    let mut all = Vec::new();
    all.extend(kgen::checks::ops::norm::gpu_checks(&d));
    all.extend(kgen::checks::ops::act::gpu_checks(&d));
    all.extend(kgen::checks::ops::rope::gpu_checks(&d));
    for (label, r) in &all {
        eprintln!("{label}: {r:?}");
    }
    assert!(all.len() >= 13);
    for (label, r) in all {
        assert!(r.is_ok(), "{label}: {r:?}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_checks_pass_on_the_gpu() {
    let d = Device::cuda(0).expect("a CUDA device");
    let mut all = Vec::new();
    all.extend(kgen::checks::ops::norm::gpu_checks(&d));
    all.extend(kgen::checks::ops::act::gpu_checks(&d));
    all.extend(kgen::checks::ops::rope::gpu_checks(&d));
    for (label, r) in &all {
        println!("{label}: {r:?}");
    }
    for (label, r) in all {
        assert!(r.is_ok(), "{label}: {r:?}");
    }
}

// ------------------------------------------------------------------ helpers

use common::ops::{nan_tensor as nan, put};

fn rand_vec(rng: &mut Rng, n: usize) -> Vec<f64> {
    common::ops::rand_vec(rng, n, 1.0)
}

fn tol(dt: DType) -> f64 {
    match dt {
        DType::BF16 => 1.6e-2,
        DType::F16 => 2e-3,
        _ => 2e-5,
    }
}

/// Every element within `rel` of the reference, relative to max(|want|, 1e-3 * max|want|).
#[track_caller]
fn assert_close(what: &str, got: &[f64], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let floor = 1e-3 * want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (g - w).abs() / w.abs().max(floor);
        assert!(
            e <= rel,
            "{what}[{i}]: got {g}, want {w} (rel err {e:.2e} > {rel:.0e})"
        );
    }
}

fn rms_ref(x: &[f64], w: &[f64], cols: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    kgen::cases::rmsnorm::reference(x, w, cols, eps)
}

fn ln_ref(x: &[f64], w: &[f64], b: &[f64], cols: usize, eps: f64) -> Vec<f64> {
    kgen::cases::layernorm::reference(x, w, b, cols, eps).0
}

/// d(sum(f(p) * g))/dp by central differences, for each element of p.
fn numeric_grad(p: &[f64], g: &[f64], f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let h = 1e-6;
    (0..p.len())
        .map(|i| {
            let mut a = p.to_vec();
            a[i] += h;
            let up: f64 = f(&a).iter().zip(g).map(|(y, g)| y * g).sum();
            a[i] -= 2.0 * h;
            let dn: f64 = f(&a).iter().zip(g).map(|(y, g)| y * g).sum();
            (up - dn) / (2.0 * h)
        })
        .collect()
}

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

// ------------------------------------------------------------------ RMSNorm / LayerNorm

#[test]
fn rmsnorm_forward_and_backward_match_f64_on_awkward_shapes() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(1);
    for &(lead, cols) in &[
        (&[1usize][..], 1usize),
        (&[7][..], 7),
        (&[2, 3][..], 1000),
        (&[3][..], 4097),
        (&[2][..], 9000),
    ] {
        for dt in DTYPES {
            let rows: usize = lead.iter().product();
            let mut shape = lead.to_vec();
            shape.push(cols);
            let (x, xv) = put(&d, dt, &shape, &rand_vec(&mut rng, rows * cols));
            let wv: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.5, 1.5)).collect();
            let (w, wv) = put(&d, dt, &[cols], &wv);
            let (dy, dyv) = put(&d, dt, &shape, &rand_vec(&mut rng, rows * cols));
            let (y, rstd) = (nan(&d, dt, &shape), nan(&d, DType::F32, &[rows]));
            ops.rmsnorm_into(&x, &w, &y, &rstd, 1e-6).unwrap();
            let (y_ref, r_ref) = rms_ref(&xv, &wv, cols, 1e-6);
            let what = format!("rmsnorm {dt} {shape:?}");
            assert_close(
                &format!("{what} y"),
                &y.to_f64_vec().unwrap(),
                &y_ref,
                tol(dt),
            );
            assert_close(
                &format!("{what} rstd"),
                &rstd.to_f64_vec().unwrap(),
                &r_ref,
                1e-5,
            );
            let (dx, dw) = (nan(&d, dt, &shape), nan(&d, dt, &[cols]));
            ops.rmsnorm_backward_into(&x, &w, &rstd, &dy, &dx, &dw)
                .unwrap();
            let (dx_ref, dw_ref) =
                kgen::cases::norm_bwd::rmsnorm_bwd_reference(&xv, &wv, &dyv, &r_ref, cols, 1);
            if cols > 1 {
                let got = dx.to_f64_vec().unwrap();
                assert_close(&format!("{what} dx"), &got, &dx_ref, tol(dt));
            } else {
                // One column: dx = rstd*w*dy*(1 - xhat^2) cancels to ~eps/x^2 of its
                // terms; judge it against the terms' scale.
                let scale = r_ref[0] * (wv[0] * dyv[0]).abs();
                let got = dx.to_f64_vec().unwrap()[0];
                let err = (got - dx_ref[0]).abs();
                assert!(err <= 1e-3 * scale, "{what} dx: {got} vs {}", dx_ref[0]);
            }
            assert_close(
                &format!("{what} dw"),
                &dw.to_f64_vec().unwrap(),
                &dw_ref,
                tol(dt).max(1e-4),
            );
        }
    }
}

/// `add_rmsnorm` = torch's `h = x + residual` (stored in the dtype) then `rmsnorm(h)`:
/// every dtype, awkward shapes (one tile, several tiles, leading dims), and the same
/// results as the two ops apart (the add done on the host and rounded, then `rmsnorm`).
#[test]
fn add_rmsnorm_matches_f64_and_the_unfused_ops() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(11);
    for &(lead, cols) in &[
        (&[1usize][..], 1usize),
        (&[7][..], 7),
        (&[2, 3][..], 1000),
        (&[3][..], 4097),
        (&[2][..], 9000),
    ] {
        for dt in DTYPES {
            let rows: usize = lead.iter().product();
            let mut shape = lead.to_vec();
            shape.push(cols);
            let (x, xv) = put(&d, dt, &shape, &rand_vec(&mut rng, rows * cols));
            let (r, rv) = put(&d, dt, &shape, &rand_vec(&mut rng, rows * cols));
            let wv: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.5, 1.5)).collect();
            let (w, wv) = put(&d, dt, &[cols], &wv);
            let (h, y) = (nan(&d, dt, &shape), nan(&d, dt, &shape));
            let rstd = nan(&d, DType::F32, &[rows]);
            ops.add_rmsnorm_into(&x, &r, &w, &h, &y, &rstd, 1e-6)
                .unwrap();
            let sum: Vec<f64> = xv.iter().zip(&rv).map(|(a, b)| a + b).collect();
            let (hh, h_ref) = put(&d, dt, &shape, &sum);
            let (y_ref, r_ref) = rms_ref(&h_ref, &wv, cols, 1e-6);
            let what = format!("add_rmsnorm {dt} {shape:?}");
            let hv = h.to_f64_vec().unwrap();
            assert_eq!(hv, h_ref, "{what} h: x + residual rounded once");
            assert_close(
                &format!("{what} y"),
                &y.to_f64_vec().unwrap(),
                &y_ref,
                tol(dt),
            );
            assert_close(
                &format!("{what} rstd"),
                &rstd.to_f64_vec().unwrap(),
                &r_ref,
                1e-5,
            );
            // The unfused ops on the same h: identical y and rstd.
            let (y2, r2) = ops.rmsnorm(&hh, &w, 1e-6).unwrap();
            assert_eq!(
                y.to_f64_vec().unwrap(),
                y2.to_f64_vec().unwrap(),
                "{what} y"
            );
            assert_eq!(
                rstd.to_f64_vec().unwrap(),
                r2.to_f64_vec().unwrap(),
                "{what} rstd"
            );
            // Backward: dh = dh_residual + rmsnorm's dx, against f64 (and dw).
            let (dy, dyv) = put(&d, dt, &shape, &rand_vec(&mut rng, rows * cols));
            let (dres, dresv) = put(&d, dt, &shape, &rand_vec(&mut rng, rows * cols));
            let (dh, dw) = ops.add_rmsnorm_backward(&h, &w, &rstd, &dy, &dres).unwrap();
            let r_saved = rstd.to_f64_vec().unwrap();
            let (dx_ref, dw_ref) =
                kgen::cases::norm_bwd::rmsnorm_bwd_reference(&h_ref, &wv, &dyv, &r_saved, cols, 1);
            let dh_ref: Vec<f64> = dx_ref.iter().zip(&dresv).map(|(a, b)| a + b).collect();
            if cols > 1 {
                // A sum of two O(1) terms can cancel: judge each element against the
                // terms' scale.
                let got = dh.to_f64_vec().unwrap();
                for i in 0..got.len() {
                    let scale = dx_ref[i].abs() + dresv[i].abs() + 1e-3;
                    let err = (got[i] - dh_ref[i]).abs() / scale;
                    assert!(
                        err <= tol(dt),
                        "{what} dh[{i}]: {} vs {} ({err:.1e})",
                        got[i],
                        dh_ref[i]
                    );
                }
            }
            assert_close(
                &format!("{what} dw"),
                &dw.to_f64_vec().unwrap(),
                &dw_ref,
                tol(dt).max(1e-4),
            );
        }
    }
    // Typed errors: a residual of another shape or dtype, h over an input.
    let x = d.from_f64(DType::F32, &[4, 8], &[0.5; 32]).unwrap();
    let w = d.from_f64(DType::F32, &[8], &[1.0; 8]).unwrap();
    let short = d.from_f64(DType::F32, &[4, 7], &[0.5; 28]).unwrap();
    let half = d.from_f64(DType::BF16, &[4, 8], &[0.5; 32]).unwrap();
    assert!(is_shape(ops.add_rmsnorm(&x, &short, &w, 1e-6)));
    assert!(is_dtype(ops.add_rmsnorm(&x, &half, &w, 1e-6)));
    let (h, y, rstd) = ops.add_rmsnorm(&x, &x, &w, 1e-6).unwrap();
    assert!(matches!(
        ops.add_rmsnorm_into(&x, &h, &w, &h, &y, &rstd, 1e-6),
        Err(OpError::Runtime(_))
    ));
    assert!(is_shape(
        ops.add_rmsnorm_backward(&h, &w, &rstd, &y, &short)
    ));
    assert!(is_dtype(ops.add_rmsnorm_backward(&h, &w, &rstd, &y, &half)));
}

#[test]
fn layernorm_forward_and_backward_match_f64_on_awkward_shapes() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(2);
    for &(rows, cols) in &[(1usize, 1usize), (7, 7), (6, 1000), (3, 4097), (2, 9000)] {
        for dt in DTYPES {
            // A mean of about 3, so centering matters.
            let xv: Vec<f64> = rand_vec(&mut rng, rows * cols)
                .iter()
                .map(|v| v + 3.0)
                .collect();
            let (x, xv) = put(&d, dt, &[rows, cols], &xv);
            let wv: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.5, 1.5)).collect();
            let bv: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.1, 1.0)).collect();
            let (w, wv) = put(&d, dt, &[cols], &wv);
            let (b, bv) = put(&d, dt, &[cols], &bv);
            let (dy, dyv) = put(&d, dt, &[rows, cols], &rand_vec(&mut rng, rows * cols));
            let y = nan(&d, dt, &[rows, cols]);
            let (mean, rstd) = (nan(&d, DType::F32, &[rows]), nan(&d, DType::F32, &[rows]));
            ops.layernorm_into(&x, &w, &b, &y, &mean, &rstd, 1e-5)
                .unwrap();
            let (y_ref, m_ref, r_ref) =
                kgen::cases::layernorm::reference(&xv, &wv, &bv, cols, 1e-5);
            let what = format!("layernorm {dt} [{rows}x{cols}]");
            // f32: y = xhat*w + b cancels for some elements.
            let got = y.to_f64_vec().unwrap();
            assert_close(&format!("{what} y"), &got, &y_ref, tol(dt).max(1e-4));
            assert_close(
                &format!("{what} mean"),
                &mean.to_f64_vec().unwrap(),
                &m_ref,
                1e-5,
            );
            // cols = 1: var = 0, rstd = 1/sqrt(eps) exactly as in f64 (up to f32 rsqrt).
            assert_close(
                &format!("{what} rstd"),
                &rstd.to_f64_vec().unwrap(),
                &r_ref,
                1e-4,
            );
            let dx = nan(&d, dt, &[rows, cols]);
            let (dw, db) = (nan(&d, dt, &[cols]), nan(&d, dt, &[cols]));
            ops.layernorm_backward_into(&x, &w, &mean, &rstd, &dy, &dx, &dw, &db)
                .unwrap();
            let (dx_ref, dw_ref, db_ref) = kgen::cases::norm_bwd::layernorm_bwd_reference(
                &xv, &wv, &dyv, &m_ref, &r_ref, cols, 1,
            );
            // cols = 1: dx is 0 up to rounding; judged against the floor (no relative scale).
            if cols > 1 {
                assert_close(
                    &format!("{what} dx"),
                    &dx.to_f64_vec().unwrap(),
                    &dx_ref,
                    tol(dt).max(1e-4),
                );
            } else {
                assert!(dx.to_f64_vec().unwrap().iter().all(|v| v.abs() < 1e-2));
            }
            assert_close(
                &format!("{what} dw"),
                &dw.to_f64_vec().unwrap(),
                &dw_ref,
                tol(dt).max(1e-4),
            );
            assert_close(
                &format!("{what} db"),
                &db.to_f64_vec().unwrap(),
                &db_ref,
                tol(dt).max(1e-4),
            );
        }
    }
}

/// The norm backwards reuse one scratch buffer across calls (growing it when a shape
/// needs more): calls of changing sizes on one handle give bit-for-bit what a fresh
/// handle (a fresh buffer) gives.
#[test]
fn norm_backward_workspace_reuse_matches_fresh_handles() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(77);
    for &(rows, cols) in &[
        (5usize, 300usize),
        (33, 1000),
        (5, 300),
        (2, 4097),
        (33, 1000),
    ] {
        let t = DType::BF16;
        let x = d
            .from_f64(t, &[rows, cols], &rand_vec(&mut rng, rows * cols))
            .unwrap();
        let dy = d
            .from_f64(t, &[rows, cols], &rand_vec(&mut rng, rows * cols))
            .unwrap();
        let w = d.from_f64(t, &[cols], &rand_vec(&mut rng, cols)).unwrap();
        let b = d.from_f64(t, &[cols], &rand_vec(&mut rng, cols)).unwrap();
        let run = |ops: &Ops| {
            let (_, rstd) = ops.rmsnorm(&x, &w, 1e-6).unwrap();
            let (dx, dw) = ops.rmsnorm_backward(&x, &w, &rstd, &dy).unwrap();
            let (_, mean, rstd) = ops.layernorm(&x, &w, &b, 1e-5).unwrap();
            let (lx, lw, lb) = ops.layernorm_backward(&x, &w, &mean, &rstd, &dy).unwrap();
            [dx, dw, lx, lw, lb].map(|t| t.to_f64_vec().unwrap())
        };
        let (reused, fresh) = (run(&ops), run(&Ops::new(&d)));
        for (k, (a, f)) in reused.iter().zip(&fresh).enumerate() {
            assert!(
                a.iter().all(|v| v.is_finite()),
                "[{rows}, {cols}] output {k}"
            );
            assert_eq!(a, f, "[{rows}, {cols}] output {k}");
        }
    }
}

#[test]
fn norm_gradients_match_finite_differences() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(3);
    let (rows, cols, eps) = (5usize, 13usize, 1e-5);
    let xv = rand_vec(&mut rng, rows * cols);
    let wv: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.5, 1.5)).collect();
    let bv: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.1, 1.0)).collect();
    let gv = rand_vec(&mut rng, rows * cols);
    let (x, _) = put(&d, DType::F32, &[rows, cols], &xv);
    let (w, _) = put(&d, DType::F32, &[cols], &wv);
    let (b, _) = put(&d, DType::F32, &[cols], &bv);
    let (g, _) = put(&d, DType::F32, &[rows, cols], &gv);
    // The f32 inputs hold these values exactly? No: round-trip what is stored.
    let xv = x.to_f64_vec().unwrap();
    let wv = w.to_f64_vec().unwrap();
    let bv = b.to_f64_vec().unwrap();
    let gv = g.to_f64_vec().unwrap();

    let (_, rstd) = ops.rmsnorm(&x, &w, eps as f32).unwrap();
    let (dx, dw) = ops.rmsnorm_backward(&x, &w, &rstd, &g).unwrap();
    let fd_x = numeric_grad(&xv, &gv, |p| rms_ref(p, &wv, cols, eps).0);
    let fd_w = numeric_grad(&wv, &gv, |p| rms_ref(&xv, p, cols, eps).0);
    assert_close("rmsnorm dx vs FD", &dx.to_f64_vec().unwrap(), &fd_x, 1e-4);
    assert_close("rmsnorm dw vs FD", &dw.to_f64_vec().unwrap(), &fd_w, 1e-4);

    let (_, mean, rstd) = ops.layernorm(&x, &w, &b, eps as f32).unwrap();
    let (dx, dw, db) = ops.layernorm_backward(&x, &w, &mean, &rstd, &g).unwrap();
    let fd_x = numeric_grad(&xv, &gv, |p| ln_ref(p, &wv, &bv, cols, eps));
    let fd_w = numeric_grad(&wv, &gv, |p| ln_ref(&xv, p, &bv, cols, eps));
    let fd_b = numeric_grad(&bv, &gv, |p| ln_ref(&xv, &wv, p, cols, eps));
    assert_close("layernorm dx vs FD", &dx.to_f64_vec().unwrap(), &fd_x, 1e-4);
    assert_close("layernorm dw vs FD", &dw.to_f64_vec().unwrap(), &fd_w, 1e-4);
    assert_close("layernorm db vs FD", &db.to_f64_vec().unwrap(), &fd_b, 1e-4);
}

#[test]
fn norms_take_row_strided_views_and_leading_dims() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(4);
    let (rows, cols, pad) = (6usize, 100usize, 28usize);
    let (big, bigv) = put(
        &d,
        DType::BF16,
        &[rows, cols + pad],
        &rand_vec(&mut rng, rows * (cols + pad)),
    );
    let x = big.narrow(1, pad, cols).unwrap();
    let xv: Vec<f64> = bigv
        .chunks(cols + pad)
        .flat_map(|r| r[pad..].to_vec())
        .collect();
    let (w, wv) = put(&d, DType::BF16, &[cols], &vec![1.25; cols]);
    let (y, rstd) = ops.rmsnorm(&x, &w, 1e-6).unwrap();
    assert_eq!(y.shape(), &[rows, cols]);
    assert_close(
        "strided rmsnorm",
        &y.to_f64_vec().unwrap(),
        &rms_ref(&xv, &wv, cols, 1e-6).0,
        1.6e-2,
    );
    assert_eq!(rstd.shape(), &[rows]);
    // [2, 3, cols] gives the same as [6, cols].
    let (x3, _) = put(&d, DType::F32, &[2, 3, cols], &xv);
    let (w3, _) = put(&d, DType::F32, &[cols], &wv);
    let (y3, r3) = ops.rmsnorm(&x3, &w3, 1e-6).unwrap();
    assert_eq!(y3.shape(), &[2, 3, cols]);
    assert_eq!(r3.shape(), &[6]);
    let (y_ref, _) = rms_ref(&xv, &wv, cols, 1e-6);
    assert_close("3-D rmsnorm", &y3.to_f64_vec().unwrap(), &y_ref, 2e-5);
    // A 1-D x is one row.
    let (x1, x1v) = put(&d, DType::F32, &[cols], &xv[..cols]);
    let (y1, r1) = ops.rmsnorm(&x1, &w3, 1e-6).unwrap();
    assert_eq!((y1.shape(), r1.shape()), (&[cols][..], &[1][..]));
    assert_close(
        "1-D rmsnorm",
        &y1.to_f64_vec().unwrap(),
        &rms_ref(&x1v, &wv, cols, 1e-6).0,
        2e-5,
    );
}

fn is_shape(r: Result<impl std::fmt::Debug, OpError>) -> bool {
    matches!(r, Err(OpError::Shape { .. }))
}
fn is_dtype(r: Result<impl std::fmt::Debug, OpError>) -> bool {
    matches!(r, Err(OpError::Dtype { .. }))
}

#[test]
fn norm_misuse_gives_typed_errors() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let x = d.from_f64(DType::F32, &[4, 8], &[0.5; 32]).unwrap();
    let w = d.from_f64(DType::F32, &[8], &[1.0; 8]).unwrap();
    let w_bad = d.from_f64(DType::F32, &[7], &[1.0; 7]).unwrap();
    let w16 = d.from_f64(DType::F16, &[8], &[1.0; 8]).unwrap();
    let xi = d.from_f64(DType::I32, &[4, 8], &[1.0; 32]).unwrap();
    let scalar = d.from_f64(DType::F32, &[], &[1.0]).unwrap();
    assert!(is_shape(ops.rmsnorm(&x, &w_bad, 1e-6)));
    assert!(is_dtype(ops.rmsnorm(&x, &w16, 1e-6)));
    assert!(is_dtype(ops.rmsnorm(&xi, &w, 1e-6)));
    assert!(is_shape(ops.rmsnorm(&scalar, &w, 1e-6)));
    assert!(is_shape(ops.layernorm(&x, &w, &w_bad, 1e-6)));
    let (y, rstd) = ops.rmsnorm(&x, &w, 1e-6).unwrap();
    let rstd_bad = d.from_f64(DType::F32, &[3], &[1.0; 3]).unwrap();
    let rstd16 = d.from_f64(DType::F16, &[4], &[1.0; 4]).unwrap();
    assert!(is_shape(ops.rmsnorm_backward(&x, &w, &rstd_bad, &y)));
    assert!(is_dtype(ops.rmsnorm_backward(&x, &w, &rstd16, &y)));
    let dy_bad = d.from_f64(DType::F32, &[4, 7], &[1.0; 28]).unwrap();
    assert!(is_shape(ops.rmsnorm_backward(&x, &w, &rstd, &dy_bad)));
    let y_bad = d.from_f64(DType::F32, &[4, 8, 1], &[1.0; 32]).unwrap();
    assert!(is_shape(ops.rmsnorm_into(&x, &w, &y_bad, &rstd, 1e-6)));
    let (_, mean, rstd) = ops.layernorm(&x, &w, &w, 1e-6).unwrap();
    assert!(is_shape(
        ops.layernorm_backward(&x, &w, &rstd_bad, &rstd, &y)
    ));
    assert!(is_dtype(ops.layernorm_backward(&x, &w16, &mean, &rstd, &y)));
    let empty = d.empty(DType::F32, &[4, 0]).unwrap();
    let w0 = d.empty(DType::F32, &[0]).unwrap();
    assert!(is_shape(ops.rmsnorm(&empty, &w0, 1e-6)));
    // A non-contiguous 3-D x cannot be viewed as rows.
    let x3 = d
        .from_f64(DType::F32, &[2, 4, 8], &[0.5; 64])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    assert!(is_shape(ops.rmsnorm(&x3, &w, 1e-6)));
    // Writing into an input is rejected by the launch (typed runtime error).
    assert!(matches!(
        ops.rmsnorm_into(&x, &w, &x, &rstd, 1e-6),
        Err(OpError::Runtime(_))
    ));
}

// ------------------------------------------------------------------ SwiGLU / ReLU

fn silu_mul(g: &[f64], u: &[f64]) -> Vec<f64> {
    kgen::cases::swiglu::forward_reference(g, u)
}

#[test]
fn swiglu_split_and_concat_match_f64() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(5);
    for &(lead, h) in &[
        (&[1usize][..], 1usize),
        (&[7][..], 7),
        (&[2, 2][..], 1000),
        (&[1][..], 4097),
    ] {
        for dt in DTYPES {
            let rows: usize = lead.iter().product();
            let mut shape = lead.to_vec();
            shape.push(h);
            let mut cshape = lead.to_vec();
            cshape.push(2 * h);
            let what = format!("swiglu {dt} {shape:?}");
            let (x, xv) = put(&d, dt, &cshape, &rand_vec(&mut rng, rows * 2 * h));
            let gv: Vec<f64> = xv.chunks(2 * h).flat_map(|r| r[..h].to_vec()).collect();
            let uv: Vec<f64> = xv.chunks(2 * h).flat_map(|r| r[h..].to_vec()).collect();
            let (gate, _) = put(&d, dt, &shape, &gv);
            let (up, _) = put(&d, dt, &shape, &uv);
            let (dout, dov) = put(&d, dt, &shape, &rand_vec(&mut rng, rows * h));
            let want = silu_mul(&gv, &uv);
            let (dg_ref, du_ref) = kgen::cases::swiglu::backward_reference(&gv, &uv, &dov);
            let t = tol(dt).max(1e-4);
            // Split.
            let out = nan(&d, dt, &shape);
            ops.swiglu_into(&gate, &up, &out).unwrap();
            assert_close(&format!("{what} out"), &out.to_f64_vec().unwrap(), &want, t);
            let (dg, du) = (nan(&d, dt, &shape), nan(&d, dt, &shape));
            ops.swiglu_backward_into(&gate, &up, &dout, &dg, &du)
                .unwrap();
            assert_close(
                &format!("{what} dgate"),
                &dg.to_f64_vec().unwrap(),
                &dg_ref,
                t,
            );
            assert_close(
                &format!("{what} dup"),
                &du.to_f64_vec().unwrap(),
                &du_ref,
                t,
            );
            // Concatenated [gate | up].
            let out = nan(&d, dt, &shape);
            ops.swiglu_concat_into(&x, &out).unwrap();
            assert_close(
                &format!("{what} concat out"),
                &out.to_f64_vec().unwrap(),
                &want,
                t,
            );
            let dx = nan(&d, dt, &cshape);
            ops.swiglu_concat_backward_into(&x, &dout, &dx).unwrap();
            let dxv = dx.to_f64_vec().unwrap();
            let dgc: Vec<f64> = dxv.chunks(2 * h).flat_map(|r| r[..h].to_vec()).collect();
            let duc: Vec<f64> = dxv.chunks(2 * h).flat_map(|r| r[h..].to_vec()).collect();
            assert_close(&format!("{what} concat dgate"), &dgc, &dg_ref, t);
            assert_close(&format!("{what} concat dup"), &duc, &du_ref, t);
        }
    }
}

#[test]
fn swiglu_and_relu_gradients_match_finite_differences() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(6);
    let (rows, h) = (3usize, 11usize);
    let (gate, gv) = put(&d, DType::F32, &[rows, h], &rand_vec(&mut rng, rows * h));
    let (up, uv) = put(&d, DType::F32, &[rows, h], &rand_vec(&mut rng, rows * h));
    let (dout, dov) = put(&d, DType::F32, &[rows, h], &rand_vec(&mut rng, rows * h));
    let (dg, du) = ops.swiglu_backward(&gate, &up, &dout).unwrap();
    let fd_g = numeric_grad(&gv, &dov, |p| silu_mul(p, &uv));
    let fd_u = numeric_grad(&uv, &dov, |p| silu_mul(&gv, p));
    assert_close("swiglu dgate vs FD", &dg.to_f64_vec().unwrap(), &fd_g, 1e-4);
    assert_close("swiglu dup vs FD", &du.to_f64_vec().unwrap(), &fd_u, 1e-4);
    // ReLU away from the kink (|x| >= 0.1).
    let xv: Vec<f64> = (0..50).map(|_| rng.signed_magnitude(0.1, 2.0)).collect();
    let (x, xv) = put(&d, DType::F32, &[5, 10], &xv);
    let (dy, dyv) = put(&d, DType::F32, &[5, 10], &rand_vec(&mut rng, 50));
    let dx = ops.relu_backward(&x, &dy).unwrap();
    let fd = numeric_grad(&xv, &dyv, |p| p.iter().map(|v| v.max(0.0)).collect());
    assert_close("relu dx vs FD", &dx.to_f64_vec().unwrap(), &fd, 1e-6);
}

#[test]
fn relu_is_exact_and_propagates_nan() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(7);
    for &n in &[1usize, 7, 1000, 4097] {
        for dt in DTYPES {
            let (x, xv) = put(&d, dt, &[n], &rand_vec(&mut rng, n));
            let (dy, dyv) = put(&d, dt, &[n], &rand_vec(&mut rng, n));
            let y = nan(&d, dt, &[n]);
            ops.relu_into(&x, &y).unwrap();
            let want = kgen::cases::relu::forward_reference(&xv);
            assert_eq!(y.to_f64_vec().unwrap(), want, "relu {dt} n={n}");
            let dx = nan(&d, dt, &[n]);
            ops.relu_backward_into(&x, &dy, &dx).unwrap();
            let want = kgen::cases::relu::backward_reference(&xv, &dyv);
            assert_eq!(dx.to_f64_vec().unwrap(), want, "relu_backward {dt} n={n}");
        }
    }
    // NaN in, NaN out; any shape (3-D).
    let x = d
        .from_f64(DType::F32, &[1, 2, 2], &[f64::NAN, -1.0, 2.0, -0.5])
        .unwrap();
    let y = ops.relu(&x).unwrap().to_f64_vec().unwrap();
    assert!(y[0].is_nan());
    assert_eq!(&y[1..], &[0.0, 2.0, 0.0]);
}

#[test]
fn activation_misuse_gives_typed_errors() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let a = d.from_f64(DType::F32, &[4, 6], &[0.5; 24]).unwrap();
    let b = d.from_f64(DType::F32, &[4, 5], &[0.5; 20]).unwrap();
    let a16 = d.from_f64(DType::F16, &[4, 6], &[0.5; 24]).unwrap();
    let ai = d.from_f64(DType::I32, &[4, 6], &[1.0; 24]).unwrap();
    let odd = d.from_f64(DType::F32, &[4, 5], &[0.5; 20]).unwrap();
    assert!(is_shape(ops.swiglu(&a, &b)));
    assert!(is_dtype(ops.swiglu(&a, &a16)));
    assert!(is_dtype(ops.swiglu(&ai, &ai)));
    assert!(is_shape(ops.swiglu_concat(&odd)));
    assert!(is_shape(ops.swiglu_backward(&a, &a, &b)));
    assert!(is_shape(ops.swiglu_concat_backward(&a, &a)));
    assert!(is_dtype(ops.swiglu_concat_backward(
        &a,
        &d.from_f64(DType::F16, &[4, 3], &[1.0; 12]).unwrap()
    )));
    assert!(is_shape(ops.relu_backward(&a, &b)));
    assert!(is_dtype(ops.relu_backward(&a, &a16)));
    assert!(is_dtype(ops.relu(&ai)));
    let strided = a.transpose(0, 1).unwrap();
    assert!(is_shape(ops.relu(&strided)));
    let scalar = d.from_f64(DType::F32, &[], &[1.0]).unwrap();
    assert!(is_shape(ops.swiglu_concat(&scalar)));
}

// ------------------------------------------------------------------ RoPE

#[test]
fn rope_tables_match_the_f64_formula() {
    let d = Device::interpreter();
    let (s, dim, base) = (37usize, 10usize, 10000.0f64);
    let (cos, sin) = Ops::rope_tables(&d, s, dim, base).unwrap();
    assert_eq!((cos.shape(), cos.dtype()), (&[s, dim / 2][..], DType::F32));
    let (c, sn) = (cos.to_f64_vec().unwrap(), sin.to_f64_vec().unwrap());
    for p in 0..s {
        for i in 0..dim / 2 {
            let a = p as f64 / base.powf(2.0 * i as f64 / dim as f64);
            assert!((c[p * dim / 2 + i] - a.cos()).abs() <= 1e-7);
            assert!((sn[p * dim / 2 + i] - a.sin()).abs() <= 1e-7);
        }
    }
    assert!(is_shape(Ops::rope_tables(&d, 4, 7, base)));
    assert!(is_shape(Ops::rope_tables(&d, 4, 8, -1.0)));
    // Half tables: the f64 values rounded once (bf16 and f16: within half an ulp).
    for (t, half_ulp) in [(DType::BF16, 2f64.powi(-8)), (DType::F16, 2f64.powi(-11))] {
        let (ch, sh) = Ops::rope_tables_as(&d, t, s, dim, base).unwrap();
        assert_eq!(
            (ch.shape(), ch.dtype(), sh.dtype()),
            (&[s, dim / 2][..], t, t)
        );
        let (ch, sh) = (ch.to_f64_vec().unwrap(), sh.to_f64_vec().unwrap());
        for k in 0..s * dim / 2 {
            assert!((ch[k] - c[k]).abs() <= half_ulp * c[k].abs().max(2f64.powi(-14)) + 1e-7);
            assert!((sh[k] - sn[k]).abs() <= half_ulp * sn[k].abs().max(2f64.powi(-14)) + 1e-7);
        }
        assert!(ch.iter().zip(&c).any(|(a, b)| a != b), "{t}: not rounded");
    }
    assert!(matches!(
        Ops::rope_tables_as(&d, DType::I32, 4, 8, base),
        Err(kgen::ops::OpError::Dtype { .. })
    ));
}

#[test]
fn rope_forward_and_backward_match_f64() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(8);
    // (B, S, H, D): H = 1, 7 (ROWS = 1), 12 (ROWS = 4), 48 (ROWS = 16); D = 2, 6, 64, 128.
    for &shape in &[
        [1usize, 1, 1, 2],
        [2, 7, 7, 6],
        [1, 5, 12, 64],
        [1, 3, 48, 128],
    ] {
        for dt in DTYPES {
            let [b, s, h, dim] = shape;
            let n = b * s * h * dim;
            let (x, xv) = put(&d, dt, &shape, &rand_vec(&mut rng, n));
            // f32 tables, and tables of T with extra rows.
            for table_t in [DType::F32, dt] {
                let (c32, s32) = Ops::rope_tables(&d, s + 2, dim, 500.0).unwrap();
                let (cos, _) = put(&d, table_t, &[s + 2, dim / 2], &c32.to_f64_vec().unwrap());
                let (sin, _) = put(&d, table_t, &[s + 2, dim / 2], &s32.to_f64_vec().unwrap());
                let (cv, sv) = (cos.to_f64_vec().unwrap(), sin.to_f64_vec().unwrap());
                let rs = kgen::cases::rope::RopeShape {
                    batch: b,
                    seq: s,
                    heads: h,
                    head_dim: dim,
                    table_rows: s + 2,
                };
                let what = format!("rope {dt} tables {table_t} {shape:?}");
                let out = nan(&d, dt, &shape);
                ops.rope_into(&x, &cos, &sin, &out).unwrap();
                let want = kgen::cases::rope::reference(&xv, &cv, &sv, rs, false);
                assert_close(
                    &format!("{what} fwd"),
                    &out.to_f64_vec().unwrap(),
                    &want,
                    tol(dt),
                );
                let dx = nan(&d, dt, &shape);
                ops.rope_backward_into(&x, &cos, &sin, &dx).unwrap();
                let want = kgen::cases::rope::reference(&xv, &cv, &sv, rs, true);
                assert_close(
                    &format!("{what} bwd"),
                    &dx.to_f64_vec().unwrap(),
                    &want,
                    tol(dt),
                );
            }
        }
    }
}

#[test]
fn rope_backward_is_the_gradient_and_inverts_the_forward() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(9);
    let shape = [2usize, 3, 2, 4];
    let n: usize = shape.iter().product();
    let (x, xv) = put(&d, DType::F32, &shape, &rand_vec(&mut rng, n));
    let (g, gv) = put(&d, DType::F32, &shape, &rand_vec(&mut rng, n));
    let (cos, sin) = Ops::rope_tables(&d, 3, 4, 10.0).unwrap();
    let (cv, sv) = (cos.to_f64_vec().unwrap(), sin.to_f64_vec().unwrap());
    let rs = kgen::cases::rope::RopeShape {
        batch: 2,
        seq: 3,
        heads: 2,
        head_dim: 4,
        table_rows: 3,
    };
    let dx = ops.rope_backward(&g, &cos, &sin).unwrap();
    let fd = numeric_grad(&xv, &gv, |p| {
        kgen::cases::rope::reference(p, &cv, &sv, rs, false)
    });
    assert_close("rope dx vs FD", &dx.to_f64_vec().unwrap(), &fd, 1e-5);
    // backward(forward(x)) = x (the rotation is orthogonal).
    let y = ops.rope(&x, &cos, &sin).unwrap();
    let back = ops.rope_backward(&y, &cos, &sin).unwrap();
    assert_close("rope roundtrip", &back.to_f64_vec().unwrap(), &xv, 1e-5);
}

#[test]
fn rope_misuse_gives_typed_errors() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let x = d.from_f64(DType::F32, &[1, 4, 2, 8], &[0.5; 64]).unwrap();
    let (cos, sin) = Ops::rope_tables(&d, 4, 8, 10000.0).unwrap();
    let (short_c, short_s) = Ops::rope_tables(&d, 3, 8, 10000.0).unwrap();
    let (wide_c, _) = Ops::rope_tables(&d, 4, 10, 10000.0).unwrap();
    let sin16 = d.from_f64(DType::F16, &[4, 4], &[0.5; 16]).unwrap();
    assert!(is_shape(ops.rope(&x, &short_c, &short_s)));
    assert!(is_shape(ops.rope(&x, &wide_c, &sin)));
    assert!(is_dtype(ops.rope(&x, &cos, &sin16)));
    let x3 = d.from_f64(DType::F32, &[4, 2, 8], &[0.5; 64]).unwrap();
    assert!(is_shape(ops.rope(&x3, &cos, &sin)));
    let odd = d.from_f64(DType::F32, &[1, 4, 2, 7], &[0.5; 56]).unwrap();
    assert!(is_shape(ops.rope(&odd, &cos, &sin)));
    let xi = d.from_f64(DType::I32, &[1, 4, 2, 8], &[1.0; 64]).unwrap();
    assert!(is_dtype(ops.rope(&xi, &cos, &sin)));
    let out_bad = d.from_f64(DType::F16, &[1, 4, 2, 8], &[0.5; 64]).unwrap();
    assert!(is_dtype(ops.rope_into(&x, &cos, &sin, &out_bad)));
    let xt = x.transpose(1, 2).unwrap();
    assert!(is_shape(ops.rope(&xt, &cos, &sin)));
}

// ------------------------------------------------------------------ GPU timings

/// Median µs per call of `f` (after a warm-up that also autotunes): 5 repeats of `iters`
/// calls between device synchronizations. Host-side enqueue time overlaps the GPU's work,
/// so this is the GPU time whenever a call's host path is shorter than its kernel; the
/// host path's own µs per call (enqueue only) is recorded in `HOST_US`.
fn time_us(d: &Device, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    d.synchronize().unwrap();
    let mut host = Vec::new();
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            for _ in 0..iters {
                f();
            }
            host.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            d.synchronize().unwrap();
            t.elapsed().as_secs_f64() * 1e6 / iters as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    host.sort_by(f64::total_cmp);
    HOST_US.with(|h| h.set(host[0]));
    v[2]
}

thread_local! {
    static HOST_US: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// The ANCHORS workloads of these ops on the GPU, default configuration and tuned:
/// `cargo test --release --test ops_norm_act -- --ignored --nocapture anchor_timings`.
#[test]
#[ignore = "needs a GPU; prints timings"]
fn anchor_timings() {
    let d = Device::cuda(0).expect("a CUDA device");
    std::env::set_var("KGEN_AUTOTUNE", "0");
    let default_ops = Ops::new(&d);
    std::env::remove_var("KGEN_AUTOTUNE");
    let tuned_ops = Ops::new(&d);
    let mut rng = Rng::new(99);
    let bf = DType::BF16;
    let mut rand = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect();
        d.from_f64(bf, shape, &v).unwrap()
    };
    let mut rows_out: Vec<(String, f64, f64, f64)> = Vec::new();
    for &cols in &[4096usize, 768] {
        let rows = 16384;
        let (x, dy) = (rand(&[rows, cols]), rand(&[rows, cols]));
        let (w, b) = (rand(&[cols]), rand(&[cols]));
        let y = d.empty(bf, &[rows, cols]).unwrap();
        let dx = d.empty(bf, &[rows, cols]).unwrap();
        let (dw, db) = (d.empty(bf, &[cols]).unwrap(), d.empty(bf, &[cols]).unwrap());
        let mean = d.empty(DType::F32, &[rows]).unwrap();
        let rstd = d.empty(DType::F32, &[rows]).unwrap();
        let target = |a: f64, b: f64| if cols == 4096 { a } else { b };
        let mut t = [[0.0; 4]; 2];
        for (k, ops) in [&default_ops, &tuned_ops].into_iter().enumerate() {
            t[k][0] = time_us(&d, 50, || {
                ops.rmsnorm_into(&x, &w, &y, &rstd, 1e-6).unwrap()
            });
            t[k][1] = time_us(&d, 50, || {
                ops.rmsnorm_into(&x, &w, &y, &rstd, 1e-6).unwrap();
                ops.rmsnorm_backward_into(&x, &w, &rstd, &dy, &dx, &dw)
                    .unwrap();
            });
            t[k][2] = time_us(&d, 50, || {
                ops.layernorm_into(&x, &w, &b, &y, &mean, &rstd, 1e-5)
                    .unwrap()
            });
            t[k][3] = time_us(&d, 50, || {
                ops.layernorm_into(&x, &w, &b, &y, &mean, &rstd, 1e-5)
                    .unwrap();
                ops.layernorm_backward_into(&x, &w, &mean, &rstd, &dy, &dx, &dw, &db)
                    .unwrap();
            });
        }
        for (i, (name, tgt)) in [
            ("RMSNorm fwd", target(95.0, 19.0)),
            ("RMSNorm fwd+bwd", target(250.0, f64::NAN)),
            ("LayerNorm fwd", target(95.0, 19.0)),
            ("LayerNorm fwd+bwd", target(260.0, f64::NAN)),
        ]
        .into_iter()
        .enumerate()
        {
            rows_out.push((format!("{name} bf16 {rows}x{cols}"), t[0][i], t[1][i], tgt));
        }
    }
    {
        let (rows, h) = (8192usize, 11008usize);
        let (gate, up, dout) = (rand(&[rows, h]), rand(&[rows, h]), rand(&[rows, h]));
        let x = rand(&[rows, 2 * h]);
        let out = d.empty(bf, &[rows, h]).unwrap();
        let (dg, du) = (
            d.empty(bf, &[rows, h]).unwrap(),
            d.empty(bf, &[rows, h]).unwrap(),
        );
        let dxc = d.empty(bf, &[rows, 2 * h]).unwrap();
        let mut t = [[0.0; 4]; 2];
        for (k, ops) in [&default_ops, &tuned_ops].into_iter().enumerate() {
            t[k][0] = time_us(&d, 20, || ops.swiglu_into(&gate, &up, &out).unwrap());
            t[k][1] = time_us(&d, 20, || {
                ops.swiglu_into(&gate, &up, &out).unwrap();
                ops.swiglu_backward_into(&gate, &up, &dout, &dg, &du)
                    .unwrap();
            });
            t[k][2] = time_us(&d, 20, || ops.swiglu_concat_into(&x, &out).unwrap());
            t[k][3] = time_us(&d, 20, || {
                ops.swiglu_concat_into(&x, &out).unwrap();
                ops.swiglu_concat_backward_into(&x, &dout, &dxc).unwrap();
            });
        }
        for (i, (name, tgt)) in [
            ("SwiGLU fwd", 190.0),
            ("SwiGLU fwd+bwd", 530.0),
            ("SwiGLU concat fwd", 190.0),
            ("SwiGLU concat fwd+bwd", 530.0),
        ]
        .into_iter()
        .enumerate()
        {
            rows_out.push((format!("{name} bf16 {rows}x{h}"), t[0][i], t[1][i], tgt));
        }
        let mut t = [[0.0; 2]; 2];
        for (k, ops) in [&default_ops, &tuned_ops].into_iter().enumerate() {
            t[k][0] = time_us(&d, 20, || ops.relu_into(&gate, &out).unwrap());
            t[k][1] = time_us(&d, 20, || {
                ops.relu_backward_into(&gate, &dout, &dg).unwrap()
            });
        }
        rows_out.push((
            format!("ReLU fwd bf16 {rows}x{h}"),
            t[0][0],
            t[1][0],
            f64::NAN,
        ));
        rows_out.push((
            format!("ReLU bwd bf16 {rows}x{h}"),
            t[0][1],
            t[1][1],
            f64::NAN,
        ));
    }
    {
        let shape = [8usize, 2048, 32, 128];
        let (q, dq) = (rand(&shape), rand(&shape));
        let (cos, sin) = Ops::rope_tables(&d, 2048, 128, 10000.0).unwrap();
        let (out, dx) = (d.empty(bf, &shape).unwrap(), d.empty(bf, &shape).unwrap());
        let mut t = [[0.0; 2]; 2];
        for (k, ops) in [&default_ops, &tuned_ops].into_iter().enumerate() {
            t[k][0] = time_us(&d, 50, || ops.rope_into(&q, &cos, &sin, &out).unwrap());
            t[k][1] = time_us(&d, 50, || {
                ops.rope_into(&q, &cos, &sin, &out).unwrap();
                ops.rope_backward_into(&dq, &cos, &sin, &dx).unwrap();
            });
        }
        rows_out.push(("RoPE fwd bf16 8x2048x32x128".into(), t[0][0], t[1][0], 95.0));
        rows_out.push((
            "RoPE fwd+bwd bf16 8x2048x32x128".into(),
            t[0][1],
            t[1][1],
            200.0,
        ));
    }
    {
        // The host path of one small op (shape checks, kernel lookup, launch).
        let (rows, cols) = (16384usize, 768usize);
        let (x, w, b) = (rand(&[rows, cols]), rand(&[cols]), rand(&[cols]));
        let y = d.empty(bf, &[rows, cols]).unwrap();
        let mean = d.empty(DType::F32, &[rows]).unwrap();
        let rstd = d.empty(DType::F32, &[rows]).unwrap();
        let gpu = time_us(&d, 50, || {
            tuned_ops
                .layernorm_into(&x, &w, &b, &y, &mean, &rstd, 1e-5)
                .unwrap()
        });
        let host = HOST_US.with(|h| h.get());
        println!("layernorm 16384x768: {gpu:.1} us per call, host enqueue {host:.1} us per call");
    }
    println!(
        "{:<40} {:>10} {:>10} {:>8}",
        "workload", "default", "tuned", "target"
    );
    for (name, a, b, tgt) in rows_out {
        println!("{name:<40} {a:>8.1}us {b:>8.1}us {tgt:>8.0}");
    }
}
