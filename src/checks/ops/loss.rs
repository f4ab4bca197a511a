//! Self-checks of the loss ops (`ops/loss.rs`): softmax forward and backward and the
//! cross-entropy (out of place and in place) against the float64 references of
//! `crate::cases::softmax` and `crate::cases::cross_entropy`.

use super::common::{max_rel_err, poisoned_on, random_on, read, rounding_tol};
use crate::cases::cross_entropy::{ce_reference, count_reference, softmax_bwd_reference};
use crate::ops::loss::DEFAULT_IGNORE_INDEX;
use crate::ops::{OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::Device;

/// Each op once on a medium awkward shape against float64: (label, max relative error).
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let ops = Ops::new(device);
    let mut out = Vec::new();
    // Shapes small enough for the interpreter (a few seconds) yet covering the multi-tile
    // paths, the real vocabulary sizes and every dtype / index type.
    for &(rows, cols, t) in &[(100usize, 4097usize, DType::BF16), (8, 50257, DType::F32)] {
        out.push((
            format!("softmax fwd+bwd {t} [{rows}x{cols}]"),
            check_softmax(&ops, rows, cols, t),
        ));
    }
    for &(rows, vocab, t, idx, in_place) in &[
        (64usize, 50257usize, DType::BF16, DType::I64, false),
        (64, 50257, DType::BF16, DType::I64, true),
        (8, 128256, DType::F32, DType::I32, false),
        (77, 4097, DType::F16, DType::I32, true),
    ] {
        let how = if in_place { " in place" } else { "" };
        out.push((
            format!("cross_entropy{how} {t} I={idx} [{rows}x{vocab}]"),
            check_cross_entropy(&ops, rows, vocab, t, idx, in_place),
        ));
    }
    out
}

fn check_softmax(ops: &Ops, rows: usize, cols: usize, t: DType) -> Result<f64, String> {
    let d = ops.device();
    let e = |x: OpError| x.to_string();
    let mut rng = crate::cases::Rng::new(31);
    let (x, xv) = random_on(d, &mut rng, t, &[rows, cols], None)?;
    let (dy, dyv) = random_on(d, &mut rng, t, &[rows, cols], None)?;
    let (y, dx) = (
        poisoned_on(d, t, &[rows, cols])?,
        poisoned_on(d, t, &[rows, cols])?,
    );
    ops.softmax_into(&x, &y).map_err(e)?;
    ops.softmax_backward_into(&y, &dy, &dx).map_err(e)?;
    let yv = read(&y)?;
    let y_ref = crate::cases::softmax::reference(&xv, cols);
    // dx from the stored y (the op's input), so the check isolates the backward kernel.
    let dx_ref = softmax_bwd_reference(&yv, &dyv, cols);
    let tol = rounding_tol(t);
    let worst = max_rel_err(&yv, &y_ref, tol).map_err(|m| format!("y: {m}"))?;
    Ok(worst.max(max_rel_err(&read(&dx)?, &dx_ref, tol).map_err(|m| format!("dx: {m}"))?))
}

/// Targets with one row in 7 ignored, the rest uniform over `0..vocab`.
fn random_targets(rng: &mut crate::cases::Rng, rows: usize, vocab: usize) -> Vec<f64> {
    (0..rows)
        .map(|r| {
            if r % 7 == 3 {
                DEFAULT_IGNORE_INDEX as f64
            } else {
                (rng.next_u64() % vocab as u64) as f64
            }
        })
        .collect()
}

fn check_cross_entropy(
    ops: &Ops,
    rows: usize,
    vocab: usize,
    t: DType,
    idx: DType,
    in_place: bool,
) -> Result<f64, String> {
    let d = ops.device();
    let e = |x: OpError| x.to_string();
    let mut rng = crate::cases::Rng::new(32);
    let (x, xv) = random_on(d, &mut rng, t, &[rows, vocab], None)?;
    let tv = random_targets(&mut rng, rows, vocab);
    let tg = d.from_f64(idx, &[rows], &tv).map_err(|x| x.to_string())?;
    let loss = poisoned_on(d, DType::F32, &[1])?;
    let row_loss = poisoned_on(d, DType::F32, &[rows])?;
    let stats = poisoned_on(d, DType::F32, &[2])?;
    let ii = DEFAULT_IGNORE_INDEX;
    let dx = if in_place {
        ops.cross_entropy_in_place_into(&x, &tg, ii, &loss, &row_loss, &stats)
            .map_err(e)?;
        x
    } else {
        let dx = poisoned_on(d, t, &[rows, vocab])?;
        ops.cross_entropy_into(&x, &tg, ii, &loss, &dx, &row_loss, &stats)
            .map_err(e)?;
        dx
    };
    let [count, inv] = count_reference(&tv, ii as f64);
    let (rl_ref, dx_ref) = ce_reference(&xv, &tv, vocab, ii as f64, 1.0 / count);
    let mean_ref = rl_ref.iter().sum::<f64>() / count;
    let mut worst =
        max_rel_err(&read(&stats)?, &[count, inv], 1e-6).map_err(|m| format!("stats: {m}"))?;
    worst = worst
        .max(max_rel_err(&read(&row_loss)?, &rl_ref, 1e-4).map_err(|m| format!("row loss: {m}"))?);
    worst =
        worst.max(max_rel_err(&read(&loss)?, &[mean_ref], 1e-5).map_err(|m| format!("loss: {m}"))?);
    worst = worst.max(
        max_rel_err(&read(&dx)?, &dx_ref, rounding_tol(t)).map_err(|m| format!("dlogits: {m}"))?,
    );
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::check_cross_entropy;
    use crate::ops::loss::ce_candidates;
    use crate::ops::Ops;
    use kgen_core::types::DType;
    use kgen_runtime::autotune::Autotuner;
    use kgen_runtime::Device;

    /// The window kernels through the op: the in-place form follows the stored tuning
    /// choice even on the interpreter, so storing a window candidate for the shape runs
    /// `cross_entropy_window_inplace` (flat views, V as a scalar) against the float64
    /// reference; and a shape whose flat tensors are not 16-byte aligned gets no window
    /// candidates.
    #[test]
    fn window_kernels_through_the_op() {
        let mut ops = Ops::new(&Device::interpreter());
        ops.tuner = Autotuner::new(None, true);
        for (rows, vocab, t, idx) in [
            (8usize, 5001usize, DType::BF16, DType::I64),
            (16, 4099, DType::F16, DType::I32),
        ] {
            let candidates =
                ce_candidates(rows, vocab, t.size_bytes() as usize, false, false, true);
            let labels: Vec<String> = candidates.iter().map(|c| c.0.clone()).collect();
            let w = candidates
                .iter()
                .position(|c| c.1)
                .expect("window candidates");
            let shape_key = format!("T={t},I={idx},rows={rows},V={vocab}");
            let key = Autotuner::key("cross_entropy", ops.device(), &shape_key);
            let picked = ops
                .tuner()
                .pick_for_key(&key, &labels, |i| Ok(if i == w { 1.0 } else { 2.0 }));
            assert_eq!(picked, w);
            let err = check_cross_entropy(&ops, rows, vocab, t, idx, true)
                .unwrap_or_else(|e| panic!("{rows}x{vocab}: {e}"));
            assert!(err.is_finite(), "{err}");
        }
        // It was the window kernel that ran (compiled for 16-byte aligned flat views).
        let names: Vec<String> = ops.kernels.lock().unwrap().keys().cloned().collect();
        assert!(
            names.iter().any(|k| k
                .starts_with("cross_entropy_window/cross_entropy_window_inplace/")
                && !k.contains("logits@")),
            "{names:?}"
        );
    }
}
