//! Helpers the op self-checks share: random and poisoned (NaN) device tensors, the
//! values a tensor holds, the relative-error measure and the rounding tolerance of a
//! dtype. (Moved from `ops/norm.rs`: the ops never use them.)

use kgen_core::types::DType;
use kgen_runtime::{Device, Tensor};

/// A tensor's values, as f64.
pub(super) fn read(t: &Tensor) -> Result<Vec<f64>, String> {
    t.to_f64_vec().map_err(|e| e.to_string())
}

/// The largest `|got - want| / max(|want|, floor)` with `floor = 1e-3 * max|want|` (so
/// values near zero are judged against the output's scale); `Err` on a non-finite
/// element where the reference is finite, a length mismatch, or an error above `tol`.
pub(super) fn max_rel_err(got: &[f64], want: &[f64], tol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{} values, expected {}", got.len(), want.len()));
    }
    let floor = 1e-3 * want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (g - w).abs() / w.abs().max(floor);
        if !e.is_finite() {
            return Err(format!("element {i}: got {g}, expected {w}"));
        }
        if e > tol {
            return Err(format!(
                "element {i}: got {g}, expected {w} (relative error {e:.2e} > {tol:.0e})"
            ));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

/// Relative tolerance of a value computed in f32 and rounded once to `t`.
pub(super) fn rounding_tol(t: DType) -> f64 {
    match t {
        DType::BF16 => 1.6e-2,
        DType::F16 => 2e-3,
        _ => 1e-4,
    }
}

/// A device tensor of random values (never zero: normalish, or magnitudes in [lo, hi)).
pub(super) fn random_on(
    device: &Device,
    rng: &mut crate::cases::Rng,
    dtype: DType,
    shape: &[usize],
    magnitude: Option<(f64, f64)>,
) -> Result<(Tensor, Vec<f64>), String> {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| match magnitude {
            Some((lo, hi)) => rng.signed_magnitude(lo, hi),
            None => {
                let x = rng.normalish();
                if x == 0.0 {
                    0.5
                } else {
                    x
                }
            }
        })
        .collect();
    let t = device
        .from_f64(dtype, shape, &v)
        .map_err(|e| e.to_string())?;
    // The values as stored (rounded to the dtype): the reference sees exactly these.
    let stored = t.to_f64_vec().map_err(|e| e.to_string())?;
    Ok((t, stored))
}

/// A tensor of NaNs.
pub(super) fn poisoned_on(
    device: &Device,
    dtype: DType,
    shape: &[usize],
) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    device
        .from_f64(dtype, shape, &vec![f64::NAN; n])
        .map_err(|e| e.to_string())
}
