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
    // `layernorm_rows` (ROWS rows per block, cols <= BLOCK): rows not multiples of ROWS,
    // short and odd cols, BLOCK 32 (tiny rows) / 1000 (non-power-of-two) / 1024.
    let quick_rows: &[(usize, usize, DType, usize, usize)] = &[
        (1, 1, DType::BF16, 4, 1024),
        (1, 7, DType::F32, 2, 32),
        (7, 7, DType::BF16, 4, 32),
        (7, 768, DType::F16, 8, 1024),
        (7, 1000, DType::F32, 2, 1024),
        (7, 1000, DType::BF16, 4, 1000),
        (3, 768, DType::BF16, 1, 1024),
        (7, 768, DType::BF16, 4, 768),
        (1000, 7, DType::F16, 8, 32),
    ];
    for &(r, c, dt, rpb, b) in quick_rows {
        v.push(rows_case(seed, dt, r, c, rpb, b, 1e-5));
    }
    if sizes == SizeSet::Full {
        let full_rows: &[(usize, usize, DType, usize, usize)] = &[
            (1000, 768, DType::BF16, 4, 1024),
            (1000, 1000, DType::F16, 8, 1024),
            (1000, 1, DType::F32, 4, 1024),
            (4097, 768, DType::BF16, 4, 1024),
            (4097, 1000, DType::F32, 2, 1024),
            (4097, 768, DType::F16, 8, 1024),
            (4097, 768, DType::BF16, 4, 768),
            (4097, 7, DType::BF16, 8, 32),
            (4097, 1, DType::F16, 2, 32),
        ];
        for &(r, c, dt, rpb, b) in full_rows {
            v.push(rows_case(seed, dt, r, c, rpb, b, 1e-5));
        }
    }
    v
}

/// One `layernorm` case. Inputs have a mean of about 4 (so centering matters) and a
/// spread of about 1.
pub fn case(seed: u64, dtype: DType, rows: usize, cols: usize, block: usize, eps: f64) -> Case {
    build(seed, dtype, rows, cols, None, block, eps)
}

/// One `layernorm_rows` case: `rows_per_block` rows per block (the kernel's ROWS), grid
/// cdiv(rows, ROWS); needs cols <= block.
pub fn rows_case(
    seed: u64,
    dtype: DType,
    rows: usize,
    cols: usize,
    rows_per_block: usize,
    block: usize,
    eps: f64,
) -> Case {
    assert!(cols <= block, "layernorm_rows needs cols <= BLOCK");
    build(seed, dtype, rows, cols, Some(rows_per_block), block, eps)
}

/// `layernorm` (`rows_per_block` None) or `layernorm_rows` (Some(ROWS)).
fn build(
    seed: u64,
    dtype: DType,
    rows: usize,
    cols: usize,
    rows_per_block: Option<usize>,
    block: usize,
    eps: f64,
) -> Case {
    let (one_row_defines, suffix) = tile_path_defines(dtype, rows, cols, block);
    let label = match rows_per_block {
        None => format!("layernorm T={dtype} BLOCK={block} rows={rows} cols={cols}{suffix}"),
        Some(rpb) => {
            format!("layernorm_rows T={dtype} ROWS={rpb} BLOCK={block} rows={rows} cols={cols}")
        }
    };
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
        options: Default::default(),
        kernel: "layernorm",
        kernel_name: rows_per_block.map(|_| "layernorm_rows"),
        label,
        defines: match rows_per_block {
            None => one_row_defines,
            Some(rpb) => defines(&[
                ("T", dtype.to_string()),
                ("ROWS", rpb.to_string()),
                ("BLOCK", block.to_string()),
            ]),
        },
        tensor_align: aligns(PARAMS, &args),
        grid: [rows.div_ceil(rows_per_block.unwrap_or(1)) as u32, 1, 1],
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
