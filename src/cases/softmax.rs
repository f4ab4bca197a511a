//! `softmax.kg`: row-wise softmax of `x [rows, cols]`.

use super::*;

const PARAMS: &[&str] = &["x", "y"];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    // (rows, cols, dtype, BLOCK): single-tile and multi-tile paths, a last tile holding a
    // single element (4097 = 4 * 1024 + 1), a non-power-of-two BLOCK.
    let quick: &[(usize, usize, DType, usize)] = &[
        (1, 1, DType::F32, 1024),
        (7, 7, DType::F32, 1024),
        (7, 7, DType::F16, 1024),
        (3, 1000, DType::F32, 1024),
        (3, 1000, DType::BF16, 1024),
        (5, 4097, DType::F32, 1024),
        (5, 4097, DType::BF16, 1024),
        (5, 4097, DType::F16, 4096),
        (5, 4097, DType::F32, 8192),
        (3, 1000, DType::F32, 1000),
        (5, 4097, DType::BF16, 1000),
        (2, 300, DType::F32, 128),
    ];
    for &(r, c, dt, b) in quick {
        v.push(case(seed, dt, r, c, b));
    }
    if sizes == SizeSet::Full {
        let full: &[(usize, usize, DType, usize)] = &[
            (64, 50257, DType::F32, 4096),
            (64, 50257, DType::BF16, 1024),
            (256, 4096, DType::BF16, 4096),
            (256, 4097, DType::F16, 8192),
            (1000, 4097, DType::F32, 1024),
        ];
        for &(r, c, dt, b) in full {
            v.push(case(seed, dt, r, c, b));
        }
    }
    v
}

/// One `softmax` case.
pub fn case(seed: u64, dtype: DType, rows: usize, cols: usize, block: usize) -> Case {
    let (case_defines, suffix) = tile_path_defines(dtype, rows, cols, block);
    let label = format!("softmax T={dtype} BLOCK={block} rows={rows} cols={cols}{suffix}");
    let mut rng = Rng::for_case(seed, &label);
    // Logits of a realistic spread (about ±7).
    let x = random_tensor(&mut rng, dtype, &[rows, cols], |r| 2.0 * r.normalish());
    let y = poisoned(dtype, &[rows, cols]);
    let args = vec![ArgValue::Tensor(x), ArgValue::Tensor(y)];
    Case {
        options: Default::default(),
        kernel: "softmax",
        kernel_name: None,
        label,
        defines: case_defines,
        tensor_align: aligns(PARAMS, &args),
        grid: [rows as u32, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| vec![reference(&tensor_at(args, 0).to_f64_vec(), cols)]),
        // f32: ex2.approx (~2 ulp) of an argument carrying |x - max| * 2^-24 error, and an
        // f32 sum: a few 1e-6 relative at most. Outputs are small (1/cols) but never
        // cancel, so the tolerance is relative; f16's floor covers its subnormals.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-5,
                abs: 1e-12,
            },
        ),
    }
}

/// Row-wise softmax in f64.
pub fn reference(x: &[f64], cols: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        y.extend(e.iter().map(|v| v / s));
    }
    y
}
