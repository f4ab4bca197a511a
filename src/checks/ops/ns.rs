//! Self-checks of Newton–Schulz (`ops/newton_schulz.rs`): the op on awkward shapes
//! (square, wide, tall, batched, a transposed view, f32 and bf16 inputs, bf16 inputs the
//! op reads in place: no `ns_prep`, the norm from the first Gram's trace) against the
//! float64 port of torch.optim.Muon's iteration with bf16 rounding modelled
//! ([`crate::cases::torch_muon`]), the singular values of the result in Muon's band, and
//! the symmetric Gram product's mirrored half element by element.

use super::common::{poisoned_on, random_on, read};
use crate::cases::torch_muon::{newton_schulz_f64, singular_values_f64};
use crate::ops::newton_schulz::{ns_schedule, orient, NsWork, QUINTIC};
use crate::ops::Ops;
use kgen_core::types::DType;
use kgen_runtime::Device;

/// Largest absolute error allowed against the bf16-modelled f64 iteration: both round A,
/// B and X to bf16 after f32 (f64) sums, so they differ by accumulation order, whose
/// rounding flips 5 steps amplify (measured up to ~2e-2 on the interpreter).
pub const NS_ABS_TOL: f64 = 6e-2;
/// The band the singular values of a 5-step quintic result land in (Muon's known
/// behaviour: it does not converge to exactly 1), with bf16 slack, for inputs whose
/// singular values are all at least ~2e-3 of their Frobenius norm (smaller ones need more
/// steps; for such inputs only the upper bound is checked).
pub const NS_SV_BAND: (f64, f64) = (0.55, 1.3);

/// The op's checks on `device` (small shapes; more on a GPU).
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let ops = Ops::new(device);
    // (batch, rows, cols, input dtype, input given as a transposed view)
    let mut shapes: Vec<(usize, usize, usize, DType, bool)> = vec![
        (1, 1, 1, DType::F32, false),
        (1, 7, 5, DType::F32, false),
        (1, 5, 7, DType::BF16, false),
        (1, 64, 64, DType::BF16, false),
        (1, 127, 300, DType::F32, false),
        (1, 300, 127, DType::BF16, false),
        (3, 33, 70, DType::F32, false),
        (2, 70, 33, DType::F32, true),
        // bf16, wide, rows a multiple of 128, cols of 8: the zero-copy path (no ns_prep,
        // the norm from the first Gram's trace).
        (1, 128, 136, DType::BF16, false),
    ];
    if device.is_gpu() {
        shapes.extend([
            (1, 256, 1000, DType::BF16, false),
            (4, 200, 200, DType::BF16, false),
            (2, 390, 130, DType::F32, true),
            (2, 256, 1024, DType::BF16, false),
            (3, 384, 384, DType::BF16, false),
        ]);
    }
    let mut out = Vec::new();
    for (k, r, c, dt, tv) in shapes {
        out.push((
            format!(
                "newton_schulz x5 {k}x{r}x{c} {dt}{} vs f64 (bf16 modelled)",
                if tv { " (transposed view)" } else { "" }
            ),
            check_ns(&ops, k, r, c, dt, tv),
        ));
    }
    let cands = crate::ops::newton_schulz::gram_candidates(device.arch());
    for (k, r, c) in [(2, 200, 300), (1, 7, 5), (3, 250, 1000)] {
        for (i, cand) in cands.iter().enumerate() {
            out.push((
                format!(
                    "ns_gram {k}x{r}x{c} [{}]: mirrored half exact, vs f64",
                    cand.label()
                ),
                check_gram(&ops, k, r, c, i),
            ));
        }
    }
    out
}

/// One NS call against the reference; returns the largest absolute error.
fn check_ns(
    ops: &Ops,
    k: usize,
    r: usize,
    c: usize,
    dt: DType,
    transposed_view: bool,
) -> Result<f64, String> {
    let e = |x: crate::ops::OpError| x.to_string();
    let d = ops.device();
    let mut rng = crate::cases::Rng::new((k * 1009 + r * 31 + c) as u64);
    // Logical [k, r, c]; as a transposed view the storage is [k, c, r].
    let (x, vals) = if transposed_view {
        let (s, sv) = random_on(d, &mut rng, dt, &[k, c, r], None)?;
        let mut v = vec![0.0; k * r * c];
        for b in 0..k {
            for i in 0..r {
                for j in 0..c {
                    v[(b * r + i) * c + j] = sv[(b * c + j) * r + i];
                }
            }
        }
        (s.transpose(1, 2).map_err(|x| x.to_string())?, v)
    } else {
        random_on(d, &mut rng, dt, &[k, r, c], None)?
    };
    let y = poisoned_on(d, dt, &[k, r, c])?;
    ops.newton_schulz_into(&x, &y, 5, &[QUINTIC]).map_err(e)?;
    let got = read(&y)?;
    let sched: Vec<(f64, f64, f64)> = ns_schedule(&[QUINTIC], 5)
        .map_err(e)?
        .iter()
        .map(|&(a, b, c)| (a as f64, b as f64, c as f64))
        .collect();
    let mut worst = 0.0f64;
    for b in 0..k {
        let xs = &vals[b * r * c..(b + 1) * r * c];
        let want = newton_schulz_f64(xs, r, c, 5, &sched, 1e-7, true);
        let g = &got[b * r * c..(b + 1) * r * c];
        for (i, (gv, wv)) in g.iter().zip(&want).enumerate() {
            let err = (gv - wv).abs();
            if !err.is_finite() || err > NS_ABS_TOL {
                return Err(format!(
                    "matrix {b} element {i}: got {gv}, expected {wv} (|err| {err:.2e})"
                ));
            }
            worst = worst.max(err);
        }
        // The band holds for singular values the 5 quintic steps can lift: those of at
        // least ~2e-3 of ||X|| (below that the result is still small, as in torch). A
        // random square matrix has some below it: then only the upper bound is checked.
        let sv_in = singular_values_f64(xs, r, c);
        let fro = xs.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-30);
        let lifted = sv_in.last().is_none_or(|s| s / fro >= 2e-3);
        let sv = singular_values_f64(g, r, c);
        let (lo, hi) = NS_SV_BAND;
        let lo = if lifted { lo } else { 0.0 };
        if let Some(s) = sv.iter().find(|s| !(lo..=hi).contains(*s)) {
            return Err(format!(
                "matrix {b}: singular value {s:.3} outside [{lo}, {hi}] ({:.3} .. {:.3})",
                sv.last().unwrap_or(&0.0),
                sv.first().unwrap_or(&0.0)
            ));
        }
    }
    Ok(worst)
}

/// The symmetric product `A = X X^T` of a batch: the tiles below the diagonal are the
/// mirror of those above bit for bit, every element is within bf16 rounding of the f64
/// product of the stored X, and the padding rows and columns are zero; with Gram
/// candidate `cand` (every one is checked, whatever the tuner would pick).
fn check_gram(ops: &Ops, k: usize, r: usize, c: usize, cand: usize) -> Result<f64, String> {
    let e = |x: crate::ops::OpError| x.to_string();
    let d = ops.device();
    let mut rng = crate::cases::Rng::new((k * 7 + r * 3 + c) as u64);
    let (g, _) = random_on(d, &mut rng, DType::F32, &[k, r, c], None)?;
    let w = NsWork::new(ops, DType::BF16, k, r, c).map_err(e)?;
    let gi = orient("ns_gram", &g).map_err(e)?;
    ops.ns_prep_run(&w, 0, &gi, None).map_err(e)?;
    ops.ns_gram_with(
        &w,
        w.current(),
        w.update_matrix(),
        w.gram(),
        (1.0, 0.0, 0.0),
        false,
        crate::ops::newton_schulz::NsNorm::Off,
        Some(cand),
    )
    .map_err(e)?;
    let (mp, np) = (w.mp, w.np);
    let x = read(w.current())?;
    let a = read(w.gram())?;
    let (m, n) = (r.min(c), r.max(c));
    let mut worst = 0.0f64;
    for b in 0..k {
        let xa = |i: usize, t: usize| x[(b * mp + i) * np + t];
        for i in 0..mp {
            for j in 0..mp {
                let v = a[(b * mp + i) * mp + j];
                let mirror = a[(b * mp + j) * mp + i];
                if v.to_bits() != mirror.to_bits() {
                    return Err(format!(
                        "matrix {b}: A[{i}][{j}] = {v} but A[{j}][{i}] = {mirror}"
                    ));
                }
                if i >= m || j >= m {
                    if v != 0.0 {
                        return Err(format!("matrix {b}: padding A[{i}][{j}] = {v}"));
                    }
                    continue;
                }
                let want: f64 = (0..n).map(|t| xa(i, t) * xa(j, t)).sum();
                let scale: f64 = (0..n).map(|t| xa(i, t).abs() * xa(j, t).abs()).sum();
                let err = (v - want).abs() / scale.max(1e-30);
                if !err.is_finite() || err > 1e-2 {
                    return Err(format!(
                        "matrix {b}: A[{i}][{j}] = {v}, expected {want} (error {err:.2e} of the sum of |terms|)"
                    ));
                }
                worst = worst.max(err);
            }
        }
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Newton–Schulz check passes on the interpreter.
    #[test]
    fn newton_schulz_checks_pass_on_the_interpreter() {
        for (label, r) in gpu_checks(&Device::interpreter()) {
            let e = r.unwrap_or_else(|why| panic!("{label}: {why}"));
            eprintln!("{label}: {e:.2e}");
        }
    }

    /// Shapes, dtypes and coefficient lists the op refuses, before any launch.
    #[test]
    fn bad_arguments_are_typed_errors() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let x = d.zeros(DType::BF16, &[4, 6]).unwrap();
        let three = d.zeros(DType::BF16, &[2, 2, 2, 2]).unwrap();
        let ints = d.zeros(DType::I32, &[4, 6]).unwrap();
        let other = d.zeros(DType::BF16, &[6, 4]).unwrap();
        let q = [QUINTIC];
        assert!(ops.newton_schulz(&x, 5, &[QUINTIC, QUINTIC]).is_err());
        assert!(ops.newton_schulz(&x, 5, &[(f32::NAN, 1.0, 1.0)]).is_err());
        assert!(ops.newton_schulz(&three, 5, &q).is_err());
        assert!(ops.newton_schulz(&ints, 5, &q).is_err());
        assert!(ops.newton_schulz_into(&x, &other, 5, &q).is_err());
        // A view with neither of the last two dimensions contiguous.
        let big = d.zeros(DType::BF16, &[8, 12]).unwrap();
        let strided = big.transpose(0, 1).unwrap().narrow(0, 0, 6).unwrap();
        let sv = crate::ops::newton_schulz::orient("t", &strided);
        assert!(sv.is_ok(), "a transposed view is fine");
        // Zero-size: nothing to do, no error.
        let empty = d.zeros(DType::BF16, &[0, 5]).unwrap();
        assert!(ops.newton_schulz(&empty, 5, &q).is_ok());
        // A per-step schedule is accepted.
        let sched = [QUINTIC, (3.0, -3.2, 1.2), QUINTIC];
        assert!(ops
            .newton_schulz(&x.view(&[1, 4, 6]).unwrap(), 3, &sched)
            .is_ok());
    }
}
