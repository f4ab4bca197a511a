//! `vec_add.kg`: out = x + y.

use super::*;

const PARAMS: &[&str] = &["x", "y", "out"];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    for n in [1usize, 7, 1000, 4097] {
        for dt in FLOATS {
            v.push(case(seed, dt, n, 1024));
        }
    }
    // Non-power-of-two and small blocks.
    v.push(case(seed, DType::F32, 4097, 1000));
    v.push(case(seed, DType::BF16, 1000, 96));
    if sizes == SizeSet::Full {
        v.push(case(seed, DType::F32, 65537, 1024));
        v.push(case(seed, DType::F16, 65537, 4096));
        v.push(case(seed, DType::BF16, 1_000_003, 1024));
        v.push(case(seed, DType::F32, 1_000_003, 2048));
    }
    v
}

/// One `vec_add` case: `n` elements of `dtype`, tiles of `block`.
pub fn case(seed: u64, dtype: DType, n: usize, block: usize) -> Case {
    let label = format!("vec_add T={dtype} BLOCK={block} n={n}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, dtype, &[n], |r| r.normalish());
    let y = random_tensor(&mut rng, dtype, &[n], |r| r.normalish());
    let out = poisoned(dtype, &[n]);
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(y),
        ArgValue::Tensor(out),
    ];
    Case {
        options: Default::default(),
        kernel: "vec_add",
        kernel_name: None,
        label,
        defines: defines(&[("T", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(PARAMS, &args),
        grid: [cdiv(n, block) as u32, 1, 1],
        args,
        outputs: vec![2],
        reference: Box::new(|args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let y = tensor_at(args, 1).to_f64_vec();
            vec![x.iter().zip(&y).map(|(a, b)| a + b).collect()]
        }),
        // One rounding of an exact sum.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 2e-7,
                abs: 1e-30,
            },
        ),
    }
}
