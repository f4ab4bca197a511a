//! `sumsq.kg`: deterministic partial sums of squares, and `sumsq_finalize`.

use super::*;

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    // (dtype, n, BLOCK, grid): grid None = one chunk per block (cdiv(n, BLOCK)); a
    // smaller grid exercises the grid-stride loop, a larger one blocks without chunks.
    let quick: &[(DType, usize, usize, Option<usize>)] = &[
        (DType::F32, 1, 1024, None),
        (DType::F32, 7, 1024, None),
        (DType::F32, 1000, 1024, None),
        (DType::F32, 4097, 1024, None),
        (DType::BF16, 4097, 1024, None),
        (DType::F16, 1000, 256, None),
        (DType::F32, 4097, 1024, Some(3)),
        (DType::BF16, 4097, 1000, Some(2)),
        (DType::F32, 1000, 512, Some(5)),
    ];
    for &(dt, n, b, g) in quick {
        v.push(partials_case(seed, dt, n, b, g));
    }
    for (n, out_len, b) in [
        (1usize, 1usize, 1024usize),
        (7, 2, 1024),
        (1000, 2, 1024),
        (4097, 2, 1024),
        (4097, 1, 1000),
    ] {
        v.push(finalize_case(seed, n, out_len, b));
    }
    if sizes == SizeSet::Full {
        v.push(partials_case(seed, DType::F32, 1_000_003, 1024, None));
        v.push(partials_case(seed, DType::BF16, 1_000_003, 2048, Some(264)));
        v.push(partials_case(seed, DType::F16, 65_537, 4096, Some(7)));
        v.push(finalize_case(seed, 122_000, 2, 1024));
    }
    v
}

/// `sumsq` over `n` elements with tiles of `block` on `grid` blocks (default
/// `cdiv(n, block)`). `partials` has one element per block.
pub fn partials_case(seed: u64, dtype: DType, n: usize, block: usize, grid: Option<usize>) -> Case {
    let g = grid.unwrap_or(cdiv(n, block));
    let label = format!("sumsq T={dtype} BLOCK={block} n={n} grid={g}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, dtype, &[n], |r| r.normalish());
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(poisoned(DType::F32, &[g])),
    ];
    Case {
        options: Default::default(),
        kernel: "sumsq",
        kernel_name: Some("sumsq"),
        label,
        defines: defines(&[("T", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(&["x", "partials"], &args),
        grid: [g as u32, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let mut parts = vec![0.0; g];
            for (c, chunk) in x.chunks(block).enumerate() {
                parts[c % g] += chunk.iter().map(|v| v * v).sum::<f64>();
            }
            vec![parts]
        }),
        // Sums of positive terms in f32: relative error ~ (log2(BLOCK) + chunks) * 6e-8.
        tolerance: Tolerance {
            rel: 1e-5,
            abs: 1e-30,
        },
    }
}

/// `sumsq_finalize` over `n` partials; `out` has `out_len` (1 or 2) elements:
/// [sum] or [sum, sqrt(sum)].
pub fn finalize_case(seed: u64, n: usize, out_len: usize, block: usize) -> Case {
    let label = format!("sumsq_finalize BLOCK={block} n={n} out={out_len}");
    let mut rng = Rng::for_case(seed, &label);
    let partials = random_tensor(&mut rng, DType::F32, &[n], |r| r.uniform(0.1, 1000.0));
    let args = vec![
        ArgValue::Tensor(partials),
        ArgValue::Tensor(poisoned(DType::F32, &[out_len])),
    ];
    Case {
        options: Default::default(),
        kernel: "sumsq",
        kernel_name: Some("sumsq_finalize"),
        label,
        defines: defines(&[("BLOCK", block.to_string())]),
        tensor_align: aligns(&["partials", "out"], &args),
        grid: [1, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| {
            let total: f64 = tensor_at(args, 0).to_f64_vec().iter().sum();
            vec![[total, total.sqrt()][..out_len].to_vec()]
        }),
        tolerance: Tolerance {
            rel: 1e-5,
            abs: 1e-30,
        },
    }
}
