//! `layernorm.kg`: y = (x - mean) * rstd * w + b, and mean, rstd per row.

use super::*;

const PARAMS: &[&str] = &["x", "w", "b", "y", "mean", "rstd", "eps"];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    let quick: &[(usize, usize, DType, usize)] = &[
        (1, 1, DType::BF16, 1024),
        (7, 7, DType::BF16, 1024),
        (7, 7, DType::F32, 1024),
        (3, 1000, DType::BF16, 1024),
        (3, 1000, DType::F16, 1000),
        (3, 1000, DType::F32, 1024),
        (5, 4097, DType::BF16, 1024),
        (5, 4097, DType::F32, 1024),
        (5, 4097, DType::F16, 8192),
        (4, 768, DType::BF16, 256),
    ];
    for &(r, c, dt, b) in quick {
        v.push(case(seed, dt, r, c, b, 1e-5));
    }
    if sizes == SizeSet::Full {
        let full: &[(usize, usize, DType, usize)] = &[
            (1000, 4097, DType::BF16, 1024),
            (64, 4096, DType::BF16, 4096),
            (128, 768, DType::BF16, 1024),
            (200, 4097, DType::F32, 8192),
        ];
        for &(r, c, dt, b) in full {
            v.push(case(seed, dt, r, c, b, 1e-5));
        }
    }
    v
}

/// One `layernorm` case. Inputs have a mean of about 4 (so centering matters) and a
/// spread of about 1.
pub fn case(seed: u64, dtype: DType, rows: usize, cols: usize, block: usize, eps: f64) -> Case {
    let label = format!("layernorm T={dtype} BLOCK={block} rows={rows} cols={cols}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, dtype, &[rows, cols], |r| 4.0 + r.normalish());
    let w = random_tensor(&mut rng, dtype, &[cols], |r| r.signed_magnitude(0.5, 1.5));
    let b = random_tensor(&mut rng, dtype, &[cols], |r| r.signed_magnitude(0.01, 0.5));
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(w),
        ArgValue::Tensor(b),
        ArgValue::Tensor(poisoned(dtype, &[rows, cols])),
        ArgValue::Tensor(poisoned(DType::F32, &[rows])),
        ArgValue::Tensor(poisoned(DType::F32, &[rows])),
        f32_arg(eps),
    ];
    Case {
        kernel: "layernorm",
        kernel_name: None,
        label,
        defines: defines(&[("T", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(PARAMS, &args),
        grid: [rows as u32, 1, 1],
        args,
        outputs: vec![3, 4, 5],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let w = tensor_at(args, 1).to_f64_vec();
            let b = tensor_at(args, 2).to_f64_vec();
            let eps = scalar_at(args, 6);
            let (y, mean, rstd) = reference(&x, &w, &b, cols, eps);
            vec![y, mean, rstd]
        }),
        // f32: the f32 mean carries ~1e-7 * |x| of error into x - mean (absolute, since
        // y can cancel against b), sums of 10^4 terms ~1e-6 relative, rsqrt.approx.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-5,
                abs: 1e-5,
            },
        ),
    }
}

/// (y, mean, rstd) in f64, torch's biased variance.
pub fn reference(
    x: &[f64],
    w: &[f64],
    b: &[f64],
    cols: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut y = Vec::with_capacity(x.len());
    let (mut means, mut rstds) = (Vec::new(), Vec::new());
    for row in x.chunks(cols) {
        let mu = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / cols as f64;
        let r = 1.0 / (var + eps).sqrt();
        y.extend(
            row.iter()
                .zip(w.iter().zip(b))
                .map(|(v, (w, b))| (v - mu) * r * w + b),
        );
        means.push(mu);
        rstds.push(r);
    }
    (y, means, rstds)
}
