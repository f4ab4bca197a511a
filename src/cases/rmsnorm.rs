//! `rmsnorm.kg`: y = x * rsqrt(mean(x^2) + eps) * w, and rstd per row.

use super::*;

const PARAMS: &[&str] = &["x", "w", "y", "rstd", "eps"];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    let quick: &[(usize, usize, DType, usize)] = &[
        (1, 1, DType::BF16, 1024),
        (7, 7, DType::BF16, 1024),
        (7, 7, DType::F32, 1024),
        (3, 1000, DType::BF16, 1024),
        (3, 1000, DType::F16, 1024),
        (3, 1000, DType::F32, 1000),
        (5, 4097, DType::BF16, 1024),
        (5, 4097, DType::F32, 1024),
        (5, 4097, DType::F16, 8192),
        (5, 4097, DType::BF16, 4096),
        (4, 768, DType::BF16, 256),
    ];
    for &(r, c, dt, b) in quick {
        v.push(case(seed, dt, r, c, b, 1e-6));
    }
    if sizes == SizeSet::Full {
        let full: &[(usize, usize, DType, usize)] = &[
            (1000, 4097, DType::BF16, 1024),
            (64, 4096, DType::BF16, 4096),
            (128, 768, DType::BF16, 1024),
            (200, 4097, DType::F32, 8192),
            (100, 11008, DType::F16, 2048),
        ];
        for &(r, c, dt, b) in full {
            v.push(case(seed, dt, r, c, b, 1e-5));
        }
    }
    v
}

/// One `rmsnorm` case.
pub fn case(seed: u64, dtype: DType, rows: usize, cols: usize, block: usize, eps: f64) -> Case {
    let label = format!("rmsnorm T={dtype} BLOCK={block} rows={rows} cols={cols}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, dtype, &[rows, cols], |r| r.normalish());
    let w = random_tensor(&mut rng, dtype, &[cols], |r| r.signed_magnitude(0.5, 1.5));
    let y = poisoned(dtype, &[rows, cols]);
    let rstd = poisoned(DType::F32, &[rows]);
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(w),
        ArgValue::Tensor(y),
        ArgValue::Tensor(rstd),
        f32_arg(eps),
    ];
    Case {
        kernel: "rmsnorm",
        kernel_name: None,
        label,
        defines: defines(&[("T", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(PARAMS, &args),
        grid: [rows as u32, 1, 1],
        args,
        outputs: vec![2, 3],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let w = tensor_at(args, 1).to_f64_vec();
            let eps = scalar_at(args, 4);
            let (y, r) = reference(&x, &w, cols, eps);
            vec![y, r]
        }),
        // f32: an f32 sum of squares (~1e-6 relative for 10^4 terms) and rsqrt.approx.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-5,
                abs: 1e-6,
            },
        ),
    }
}

/// (y, rstd) in f64.
pub fn reference(x: &[f64], w: &[f64], cols: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let mut y = Vec::with_capacity(x.len());
    let mut rs = Vec::new();
    for row in x.chunks(cols) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
        let r = 1.0 / (ms + eps).sqrt();
        y.extend(row.iter().zip(w).map(|(v, w)| v * r * w));
        rs.push(r);
    }
    (y, rs)
}
