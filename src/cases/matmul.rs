//! `matmul.kg`: c = a @ b on strided operands (plain and transposed views).

use super::*;

const PARAMS: &[&str] = &["a", "b", "c"];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    use DType::*;
    // (M, K, N, dtype, a transposed, b transposed)
    let mut table: Vec<(usize, usize, usize, DType, bool, bool)> = vec![
        (1, 1, 1, F32, false, false),
        (7, 7, 7, F32, false, false),
        (40, 50, 70, F32, false, false),
        (33, 17, 65, F32, true, false),
        (33, 17, 65, F32, false, true),
        (64, 100, 48, BF16, false, false),
        (31, 64, 9, BF16, true, true),
        (16, 40, 33, F16, false, true),
    ];
    if sizes == SizeSet::Full {
        table.extend([
            (257, 300, 129, F32, false, false),
            (128, 1000, 64, BF16, true, false),
            (100, 257, 1000, F32, false, true),
        ]);
    }
    table
        .into_iter()
        .map(|(m, k, n, dt, ta, tb)| case(seed, dt, m, k, n, ta, tb))
        .collect()
}

/// A random `[rows, cols]` operand; when `transposed`, it is stored as `[cols, rows]`
/// and viewed through strides `[1, rows]` (what `x.T` is).
fn operand(rng: &mut Rng, dtype: DType, rows: usize, cols: usize, transposed: bool) -> HostTensor {
    if !transposed {
        return random_tensor(rng, dtype, &[rows, cols], |r| r.normalish());
    }
    let mut t = random_tensor(rng, dtype, &[cols, rows], |r| r.normalish());
    t.shape = vec![rows, cols];
    t.strides = vec![1, rows];
    t
}

/// One `matmul` case.
pub fn case(seed: u64, dtype: DType, m: usize, k: usize, n: usize, a_t: bool, b_t: bool) -> Case {
    let t = |x: bool| if x { ".T" } else { "" };
    let label = format!("matmul T={dtype} [{m}x{k}]{} @ [{k}x{n}]{}", t(a_t), t(b_t));
    let mut rng = Rng::for_case(seed, &label);
    let a = operand(&mut rng, dtype, m, k, a_t);
    let b = operand(&mut rng, dtype, k, n, b_t);
    let c = poisoned(dtype, &[m, n]);
    let args = vec![
        ArgValue::Tensor(a),
        ArgValue::Tensor(b),
        ArgValue::Tensor(c),
    ];
    let (bm, bn) = (32usize, 32usize);
    Case {
        kernel: "matmul",
        kernel_name: None,
        label,
        defines: defines(&[("T", dtype.to_string())]),
        tensor_align: aligns(PARAMS, &args),
        grid: [cdiv(m, bm) as u32, cdiv(n, bn) as u32, 1],
        args,
        outputs: vec![2],
        reference: Box::new(move |args| {
            let a = tensor_at(args, 0).to_f64_vec();
            let b = tensor_at(args, 1).to_f64_vec();
            vec![reference(&a, &b, m, k, n)]
        }),
        // f32 accumulation of k products of magnitude ~1 in an order that differs from
        // the reference: an absolute error of a few ulp of the running sum's size.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-5,
                abs: 4e-7 * (k as f64).max(1.0),
            },
        ),
    }
}

/// Row-major [m, n] = [m, k] @ [k, n] in f64.
pub fn reference(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += av * b[p * n + j];
            }
        }
    }
    c
}
