//! Self-checks of the activations (`ops/act.rs`): SwiGLU (split and concatenated) and
//! ReLU, forward and backward, against the float64 references of `crate::cases`.

use super::common::{max_rel_err, poisoned_on, random_on, read, rounding_tol};
use crate::ops::{OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::Device;

/// SwiGLU (split and concatenated) and ReLU, forward and backward, once each on awkward
/// shapes against f64.
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let ops = Ops::new(device);
    let mut out = Vec::new();
    for &(rows, h, t) in &[(777usize, 1000usize, DType::BF16), (33, 4097, DType::F32)] {
        out.push((
            format!("swiglu fwd+bwd {t} [{rows}x{h}]"),
            check_swiglu(&ops, rows, h, t, false),
        ));
    }
    out.push((
        "swiglu_concat fwd+bwd f16 [300x2x1376]".into(),
        check_swiglu(&ops, 300, 1376, DType::F16, true),
    ));
    for &(n, t) in &[(100_003usize, DType::BF16), (4097, DType::F32)] {
        out.push((format!("relu fwd+bwd {t} [{n}]"), check_relu(&ops, n, t)));
    }
    out
}

fn check_swiglu(ops: &Ops, rows: usize, h: usize, t: DType, concat: bool) -> Result<f64, String> {
    let d = ops.device();
    let e = |x: OpError| x.to_string();
    let mut rng = crate::cases::Rng::new(31);
    let (x, xv) = random_on(d, &mut rng, t, &[rows, 2 * h], None)?;
    let (dout, dov) = random_on(d, &mut rng, t, &[rows, h], None)?;
    let gv: Vec<f64> = xv.chunks(2 * h).flat_map(|r| r[..h].to_vec()).collect();
    let uv: Vec<f64> = xv.chunks(2 * h).flat_map(|r| r[h..].to_vec()).collect();
    let out = poisoned_on(d, t, &[rows, h])?;
    let (got_out, got_dg, got_du) = if concat {
        let dx = poisoned_on(d, t, &[rows, 2 * h])?;
        ops.swiglu_concat_into(&x, &out).map_err(e)?;
        ops.swiglu_concat_backward_into(&x, &dout, &dx).map_err(e)?;
        let dxv = read(&dx)?;
        (
            read(&out)?,
            dxv.chunks(2 * h).flat_map(|r| r[..h].to_vec()).collect(),
            dxv.chunks(2 * h).flat_map(|r| r[h..].to_vec()).collect(),
        )
    } else {
        // Separate contiguous gate and up.
        let gate = d.from_f64(t, &[rows, h], &gv).map_err(|x| x.to_string())?;
        let up = d.from_f64(t, &[rows, h], &uv).map_err(|x| x.to_string())?;
        let (dg, du) = (
            poisoned_on(d, t, &[rows, h])?,
            poisoned_on(d, t, &[rows, h])?,
        );
        ops.swiglu_into(&gate, &up, &out).map_err(e)?;
        ops.swiglu_backward_into(&gate, &up, &dout, &dg, &du)
            .map_err(e)?;
        (read(&out)?, read(&dg)?, read(&du)?)
    };
    let want = crate::cases::swiglu::forward_reference(&gv, &uv);
    let (dg_ref, du_ref) = crate::cases::swiglu::backward_reference(&gv, &uv, &dov);
    let tol = rounding_tol(t).max(1e-4);
    let mut worst = max_rel_err(&got_out, &want, tol).map_err(|m| format!("out: {m}"))?;
    worst = worst.max(max_rel_err(&got_dg, &dg_ref, tol).map_err(|m| format!("dgate: {m}"))?);
    worst = worst.max(max_rel_err(&got_du, &du_ref, tol).map_err(|m| format!("dup: {m}"))?);
    Ok(worst)
}

fn check_relu(ops: &Ops, n: usize, t: DType) -> Result<f64, String> {
    let d = ops.device();
    let e = |x: OpError| x.to_string();
    let mut rng = crate::cases::Rng::new(32);
    let (x, xv) = random_on(d, &mut rng, t, &[n], None)?;
    let (dy, dyv) = random_on(d, &mut rng, t, &[n], None)?;
    let (y, dx) = (poisoned_on(d, t, &[n])?, poisoned_on(d, t, &[n])?);
    ops.relu_into(&x, &y).map_err(e)?;
    ops.relu_backward_into(&x, &dy, &dx).map_err(e)?;
    let y_ref = crate::cases::relu::forward_reference(&xv);
    let dx_ref = crate::cases::relu::backward_reference(&xv, &dyv);
    // Exact: values are copied or zeroed.
    for (name, got, want) in [("y", read(&y)?, y_ref), ("dx", read(&dx)?, dx_ref)] {
        if let Some(i) = (0..n).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            return Err(format!("{name}[{i}] = {}, expected {}", got[i], want[i]));
        }
    }
    Ok(0.0)
}
