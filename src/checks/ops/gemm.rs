//! Self-checks of the tensor-core `gemm` (`ops/gemm.rs`): large and awkward shapes,
//! transposed operands, bias and activations, against float64 on sampled elements.

use crate::ops::gemm::Activation;
use crate::ops::Ops;
use kgen_core::types::DType;

/// `gemm` on large shapes (4096³, 8192³) and a transposed, biased, activated one on the
/// GPU, against float64 on a sample of 2048 output elements (each a whole K-long dot
/// product), inputs random and the output poisoned first. On the interpreter only a
/// small shape (the large ones would take hours there; the bundled cases cover the
/// interpreter on awkward shapes).
pub fn gpu_checks(device: &kgen_runtime::Device) -> Vec<(String, Result<f64, String>)> {
    let ops = Ops::new(device);
    let big: &[(usize, usize, usize, bool, bool, bool, Activation)] = if device.is_gpu() {
        &[
            (4096, 4096, 4096, false, false, false, Activation::None),
            (8192, 8192, 8192, false, false, false, Activation::None),
            (4096, 4096, 4096, true, true, true, Activation::GeluTanh),
            (1000, 4097, 1032, false, true, true, Activation::Silu),
        ]
    } else {
        &[(100, 72, 40, true, false, true, Activation::Relu)]
    };
    let mut out = Vec::new();
    for &(m, n, k, ta, tb, bias, act) in big {
        let label = format!(
            "gemm bf16 {m}x{n}x{k}{}{}{} {act:?} (2048 sampled elements vs f64)",
            if ta { " a.T" } else { "" },
            if tb { " b.T" } else { "" },
            if bias { " +bias" } else { "" },
        );
        out.push((label, check_one(&ops, m, n, k, ta, tb, bias, act)));
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn check_one(
    ops: &Ops,
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    with_bias: bool,
    act: Activation,
) -> Result<f64, String> {
    let e = |x: kgen_runtime::RuntimeError| x.to_string();
    let d = ops.device();
    let dt = DType::BF16;
    let mut rng = crate::cases::Rng::new((m * 31 + n * 7 + k) as u64);
    let mut rand = |len: usize| -> Vec<f64> { (0..len).map(|_| rng.normalish()).collect() };
    // Storage row-major; a transposed operand is the transpose of its storage.
    let (sa_shape, sb_shape) = (
        if ta { [k, m] } else { [m, k] },
        if tb { [n, k] } else { [k, n] },
    );
    let a_s = d.from_f64(dt, &sa_shape, &rand(m * k)).map_err(e)?;
    let b_s = d.from_f64(dt, &sb_shape, &rand(k * n)).map_err(e)?;
    let bias_t = d.from_f64(dt, &[n], &rand(n)).map_err(e)?;
    let c = d.from_f64(dt, &[m, n], &vec![f64::NAN; m * n]).map_err(e)?;
    let a = if ta {
        a_s.transpose(0, 1).map_err(e)?
    } else {
        a_s.clone()
    };
    let b = if tb {
        b_s.transpose(0, 1).map_err(e)?
    } else {
        b_s.clone()
    };
    ops.gemm_into(&a, &b, with_bias.then_some(&bias_t), act, &c)
        .map_err(|x| x.to_string())?;
    let (av, bv, biasv, got) = (
        a_s.to_f64_vec().map_err(e)?,
        b_s.to_f64_vec().map_err(e)?,
        bias_t.to_f64_vec().map_err(e)?,
        c.to_f64_vec().map_err(e)?,
    );
    let at = |i: usize, p: usize| if ta { av[p * m + i] } else { av[i * k + p] };
    let bt = |p: usize, j: usize| if tb { bv[j * k + p] } else { bv[p * n + j] };
    let apply = |x: f64| match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::GeluTanh => {
            0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::Silu => x / (1.0 + (-x).exp()),
    };
    let total = m * n;
    let step = (total / 2048).max(1);
    let mut worst = 0.0f64;
    // Every element of the last row and column too (the tiles that hang over the edge).
    let edges = (0..n)
        .map(|j| (m - 1) * n + j)
        .chain((0..m).map(|i| i * n + n - 1));
    for idx in (0..total).step_by(step).chain(edges) {
        let (i, j) = (idx / n, idx % n);
        let mut s = 0.0;
        let mut scale = 0.0;
        for p in 0..k {
            let t = at(i, p) * bt(p, j);
            s += t;
            scale += t.abs();
        }
        let want = apply(s + if with_bias { biasv[j] } else { 0.0 });
        let g = got[idx];
        if !g.is_finite() {
            return Err(format!("[{i}, {j}] = {g} (want {want})"));
        }
        // One bf16 rounding of the result plus f32 accumulation over K terms.
        let tol = 8e-3 * want.abs() + 1e-6 * scale + 1e-3;
        let err = (g - want).abs();
        if err > tol {
            return Err(format!(
                "[{i}, {j}] = {g}, want {want} (tolerance {tol:.2e})"
            ));
        }
        worst = worst.max(err / (want.abs() + 1.0));
    }
    Ok(worst)
}
