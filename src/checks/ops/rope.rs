//! Self-checks of RoPE (`ops/rope.rs`), forward and backward, against the float64
//! reference of `crate::cases::rope`.

use super::common::{max_rel_err, poisoned_on, random_on, read, rounding_tol};
use crate::ops::{OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::Device;

/// RoPE forward and backward once each on awkward shapes against f64.
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let ops = Ops::new(device);
    let mut out = Vec::new();
    for &(b, s, h, d, t, c) in &[
        (2usize, 100usize, 12usize, 64usize, DType::BF16, DType::F32),
        (2, 100, 32, 128, DType::BF16, DType::BF16),
        (1, 37, 7, 128, DType::F32, DType::F32),
        (3, 9, 5, 6, DType::F16, DType::F32),
    ] {
        out.push((
            format!("rope fwd+bwd {t} [{b}x{s}x{h}x{d}], {c} tables"),
            check_rope(&ops, [b, s, h, d], t, c),
        ));
    }
    out
}

fn check_rope(ops: &Ops, shape: [usize; 4], t: DType, c: DType) -> Result<f64, String> {
    let dev = ops.device();
    let e = |x: OpError| x.to_string();
    let [b, s, h, d] = shape;
    let mut rng = crate::cases::Rng::new(41);
    let (x, xv) = random_on(dev, &mut rng, t, &shape, None)?;
    let (cos, sin) = Ops::rope_tables_as(dev, c, s + 3, d, 10000.0).map_err(e)?;
    let (out, dx) = (poisoned_on(dev, t, &shape)?, poisoned_on(dev, t, &shape)?);
    ops.rope_into(&x, &cos, &sin, &out).map_err(e)?;
    ops.rope_backward_into(&x, &cos, &sin, &dx).map_err(e)?;
    let rs = crate::cases::rope::RopeShape {
        batch: b,
        seq: s,
        heads: h,
        head_dim: d,
        table_rows: s + 3,
    };
    let (cv, sv) = (read(&cos)?, read(&sin)?);
    let want = crate::cases::rope::reference(&xv, &cv, &sv, rs, false);
    let want_bwd = crate::cases::rope::reference(&xv, &cv, &sv, rs, true);
    let tol = rounding_tol(t);
    let worst = max_rel_err(&read(&out)?, &want, tol).map_err(|m| format!("out: {m}"))?;
    Ok(worst.max(max_rel_err(&read(&dx)?, &want_bwd, tol).map_err(|m| format!("dx: {m}"))?))
}
