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
    // `rmsnorm_rows` (ROWS rows per block, cols <= BLOCK): rows not multiples of ROWS,
    // short and odd cols, BLOCK 32 (tiny rows) / 768, 1000 (non-power-of-two) / 1024.
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
        v.push(rows_case(seed, dt, r, c, rpb, b, 1e-6));
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
    // `add_rmsnorm`: one tile (ONE_TILE on odd row counts) and multi-tile rows, every
    // dtype, non-multiple-of-tile widths.
    let quick_add: &[(usize, usize, DType, usize)] = &[
        (1, 1, DType::BF16, 1024),
        (7, 7, DType::F32, 1024),
        (3, 1000, DType::BF16, 1024),
        (4, 1000, DType::F16, 1024),
        (5, 4097, DType::BF16, 1024),
        (5, 4097, DType::F32, 4096),
        (2, 768, DType::F16, 256),
    ];
    for &(r, c, dt, b) in quick_add {
        v.push(add_case(seed, dt, r, c, b, 1e-6));
    }
    if sizes == SizeSet::Full {
        for &(r, c, dt, b) in &[
            (1000, 4097, DType::BF16, 1024usize),
            (129, 4096, DType::BF16, 4096),
            (64, 11008, DType::F16, 2048),
        ] {
            v.push(add_case(seed, dt, r, c, b, 1e-5));
        }
    }
    v
}

const ADD_PARAMS: &[&str] = &["x", "residual", "w", "h", "y", "rstd", "eps"];

/// One `add_rmsnorm` case: h = T(x + residual), then `rmsnorm` of that rounded h.
pub fn add_case(seed: u64, dtype: DType, rows: usize, cols: usize, block: usize, eps: f64) -> Case {
    let (defines, suffix) = tile_path_defines(dtype, rows, cols, block);
    let label = format!("add_rmsnorm T={dtype} BLOCK={block} rows={rows} cols={cols}{suffix}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, dtype, &[rows, cols], |r| r.normalish());
    let res = random_tensor(&mut rng, dtype, &[rows, cols], |r| r.normalish());
    let w = random_tensor(&mut rng, dtype, &[cols], |r| r.signed_magnitude(0.5, 1.5));
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(res),
        ArgValue::Tensor(w),
        ArgValue::Tensor(poisoned(dtype, &[rows, cols])),
        ArgValue::Tensor(poisoned(dtype, &[rows, cols])),
        ArgValue::Tensor(poisoned(DType::F32, &[rows])),
        f32_arg(eps),
    ];
    Case {
        options: Default::default(),
        kernel: "rmsnorm",
        kernel_name: Some("add_rmsnorm"),
        label,
        defines,
        tensor_align: aligns(ADD_PARAMS, &args),
        grid: [rows as u32, 1, 1],
        args,
        outputs: vec![3, 4, 5],
        reference: Box::new(move |args| {
            let (x, res) = (
                tensor_at(args, 0).to_f64_vec(),
                tensor_at(args, 1).to_f64_vec(),
            );
            let w = tensor_at(args, 2).to_f64_vec();
            let eps = scalar_at(args, 6);
            let sum: Vec<f64> = x.iter().zip(&res).map(|(a, b)| a + b).collect();
            let h = HostTensor::from_f64(dtype, &[rows, cols], &sum).to_f64_vec();
            let (y, r) = reference(&h, &w, cols, eps);
            vec![h, y, r]
        }),
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-5,
                abs: 1e-6,
            },
        ),
    }
}

/// One `rmsnorm` case.
pub fn case(seed: u64, dtype: DType, rows: usize, cols: usize, block: usize, eps: f64) -> Case {
    build(seed, dtype, rows, cols, None, block, eps)
}

/// One `rmsnorm_rows` case: `rows_per_block` rows per block (the kernel's ROWS), grid
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
    assert!(cols <= block, "rmsnorm_rows needs cols <= BLOCK");
    build(seed, dtype, rows, cols, Some(rows_per_block), block, eps)
}

/// `rmsnorm` (`rows_per_block` None) or `rmsnorm_rows` (Some(ROWS)).
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
        None => format!("rmsnorm T={dtype} BLOCK={block} rows={rows} cols={cols}{suffix}"),
        Some(rpb) => {
            format!("rmsnorm_rows T={dtype} ROWS={rpb} BLOCK={block} rows={rows} cols={cols}")
        }
    };
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
        options: Default::default(),
        kernel: "rmsnorm",
        kernel_name: rows_per_block.map(|_| "rmsnorm_rows"),
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
